// The text of bench specs and command-line flags: lists, integers, numbers, backend lists, and
// the per-call settings they give, set on a call's options. Used by the bench specs here and by
// the CLI's flags, so both read the same text the same way.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "attnops/decision.h"
#include "attnops/metadata.h"

namespace attnops::benchkit {

// Per-call settings (attnops::CallSettings) on a call's options: the operator stays as its config
// built it, and the decision's "settings" shows them. A backend list replaces every preference of
// the config for the call and is tried even where the config disables a backend it names.
template <class Options>
void set_call_settings(Options& o, const CallSettings& s) {
  if (s.softmax_scale) o.softmax_scale = s.softmax_scale;
  if (s.runtime_dtype) o.runtime_dtype = s.runtime_dtype;
  if (s.num_threads) o.num_threads = s.num_threads;
  if (s.backends) o.backends = s.backends;
}

// "auto" -> {} ; "cpu" -> {cpu}; "gpu,cpu" -> {gpu, cpu}. Error(invalid_argument) otherwise.
std::vector<Backend> parse_backend_list(std::string_view text);

// Splits "a,b,c" on `sep`, trimming blanks; empty pieces are kept (callers reject them).
std::vector<std::string> split(std::string_view text, char sep);

// Parses a whole string as an integer / a double, or throws Error(invalid_argument) naming `what`.
long long parse_integer(std::string_view text, const std::string& what);
double parse_number(std::string_view text, const std::string& what);

}  // namespace attnops::benchkit
