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

namespace attnops::cli {

// --backend, --scale, --threads and --dtype are per-call settings (attnops::CallSettings), set
// on each call's options: the operator stays as the config built it, and the decision's
// "settings" shows them. A --backend list replaces every preference of the config for the call
// and is tried even where the config disables a backend it names (the user asked for exactly it).
template <class Options>
void set_call_settings(Options& o, const CallSettings& s) {
  if (s.softmax_scale) o.softmax_scale = s.softmax_scale;
  if (s.runtime_dtype) o.runtime_dtype = s.runtime_dtype;
  if (s.num_threads) o.num_threads = s.num_threads;
  if (s.backends) o.backends = s.backends;
}

// "auto" -> {} ; "cpu" -> {cpu}; "gpu,cpu" -> {gpu, cpu}. Error(invalid_argument) otherwise.
std::vector<Backend> parse_backend_list(std::string_view text);

// The config at `path`, or the built-in defaults when `path` is empty.
Config load_optional_config(const std::string& path);

// The same settings written into a config, for the distributed layer, whose per-rank operators
// are built once for the run from it. A per-operator `backend:` in the file would otherwise
// outrank the top-level value, so --backend also clears it (and re-enables the named backends if
// the file disabled them).
void apply_to_config(Config& config, const CallSettings& s);

// Splits "a,b,c" on `sep`, trimming blanks; empty pieces are kept (callers reject them).
std::vector<std::string> split(std::string_view text, char sep);

// Parses a whole string as an integer / a double, or throws Error(invalid_argument) naming `what`.
long long parse_integer(std::string_view text, const std::string& what);
double parse_number(std::string_view text, const std::string& what);

}  // namespace attnops::cli
