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

struct Overrides {
  std::optional<std::vector<Backend>> backends;  // --backend; empty list = auto
  std::optional<double> softmax_scale;           // --scale
  std::optional<int> num_threads;                // --threads
  std::optional<DType> runtime_dtype;            // --dtype
};

// "auto" -> {} ; "cpu" -> {cpu}; "gpu,cpu" -> {gpu, cpu}. Error(invalid_argument) otherwise.
std::vector<Backend> parse_backend_list(std::string_view text);

// The config at `path`, or the built-in defaults when `path` is empty.
Config load_optional_config(const std::string& path);

// Applies explicit flags to a config. A per-operator `backend:` in the file would otherwise
// outrank the top-level value, so --backend also clears it (and re-enables the named backends
// if the file disabled them): the user asked for exactly this backend.
void apply_overrides(Config& config, const Overrides& o);

// Splits "a,b,c" on `sep`, trimming blanks; empty pieces are kept (callers reject them).
std::vector<std::string> split(std::string_view text, char sep);

// Parses a whole string as an integer / a double, or throws Error(invalid_argument) naming `what`.
long long parse_integer(std::string_view text, const std::string& what);
double parse_number(std::string_view text, const std::string& what);

}  // namespace attnops::cli
