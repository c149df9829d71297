// For backend authors: which reading of the environment (environment.h) is current, so that a
// cache derived from it (the cpu ISA choice) can tell when reload_environment() made it stale.
#pragma once

#include <cstdint>

#include "attnops/environment.h"

namespace attnops {

// 1 for the first read, +1 per reload_environment().
std::uint64_t environment_generation();

}  // namespace attnops
