// Short text forms of a DispatchDecision for tables (demo, bench).
#pragma once

#include <string>

#include "attnops/decision.h"

namespace attnops::cli {

// The reason codes in order, comma separated ("decode,backend_unavailable"); "" when none.
std::string reason_codes(const DispatchDecision& d);

}  // namespace attnops::cli
