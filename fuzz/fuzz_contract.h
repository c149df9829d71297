// What every fuzz target checks besides "no crash, no sanitizer report": the parsers' error
// contract. A parser may accept its input or throw attnops::Error with the expected code and a
// message that names the input and holds no raw control bytes (it reaches a terminal). Any other
// outcome is a finding: contract_violation() prints it and aborts, which libFuzzer reports with
// the input that caused it.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include "attnops/error.h"

namespace attnops::fuzz {

[[noreturn]] inline void contract_violation(std::string_view what, std::string_view detail) {
  std::fprintf(stderr, "fuzz contract violated: %.*s\n%.*s\n", static_cast<int>(what.size()), what.data(),
               static_cast<int>(detail.size()), detail.data());
  std::abort();
}

// True when `s` holds a byte below 0x20 other than '\n' and '\t', or DEL (an ESC sequence from the
// input would be replayed by the user's terminal).
inline bool has_control_bytes(std::string_view s) {
  for (unsigned char c : s)
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f) return true;
  return false;
}

// Checks a caught attnops::Error against the contract: code `want`, message naming `source`.
inline void check_error(const Error& e, ErrorCode want, std::string_view source) {
  const std::string_view msg = e.what();
  if (e.code() != want) contract_violation("unexpected error code", msg);
  if (msg.find(source) == std::string_view::npos) contract_violation("message does not name the input", msg);
  if (has_control_bytes(msg)) contract_violation("raw control bytes in the message", msg);
}

}  // namespace attnops::fuzz
