// attnops: attention operators with backend dispatch. The one header model code includes.
#pragma once

#include "attnops/backward.h"
#include "attnops/config.h"
#include "attnops/cost.h"
#include "attnops/decision.h"
#include "attnops/device_tensor.h"
#include "attnops/dtype.h"
#include "attnops/error.h"
#include "attnops/gpu.h"
#include "attnops/host.h"
#include "attnops/mask.h"
#include "attnops/metadata.h"
#include "attnops/operation.h"
#include "attnops/options.h"
#include "attnops/problem.h"
#include "attnops/registry.h"
#include "attnops/tensor.h"
