// Flags shared by the subcommands that choose how operators are configured (run, demo, bench):
// a YAML config, then explicit flags on top of it. Flags always win over the file.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/config.h"
#include "attnops/decision.h"
#include "attnops/dtype.h"
#include "benchkit/parse.h"

namespace attnops::cli {

// --backend, --scale, --threads and --dtype are per-call settings, set on each call's options
// (benchkit/parse.h, shared with the bench specs, as is the text of the flags' values).
using benchkit::parse_backend_list;
using benchkit::parse_integer;
using benchkit::parse_number;
using benchkit::set_call_settings;
using benchkit::split;

// The config at `path`, or the built-in defaults when `path` is empty.
Config load_optional_config(const std::string& path);

// The same settings written into a config, for the distributed layer, whose per-rank operators
// are built once for the run from it. A per-operator `backend:` in the file would otherwise
// outrank the top-level value, so --backend also clears it (and re-enables the named backends if
// the file disabled them).
void apply_to_config(Config& config, const CallSettings& s);

}  // namespace attnops::cli
