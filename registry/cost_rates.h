// The rates behind auto's cost rule on the real host (attnops/cost.h): read from the cache file
// beside the pipeline cache, else measured once per process and GPU selection (a calibration
// call on the gpu and on the cpu backend) and written to that file when one is configured.
#pragma once

#include <optional>
#include <string>
#include <utility>

#include "attnops/cost.h"
#include "attnops/metadata.h"

namespace attnops {

std::optional<std::pair<CostRates, std::string>> system_cost_rates(const GpuSettings& settings);

}  // namespace attnops
