// Text from files (a YAML parser's message, a .npy header's dtype) shown safely in messages:
// control bytes (< 0x20, 0x7f) become \xNN, so an ESC sequence in a file cannot reach the
// terminal; long text is cut at max_chars with "...".
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attnops {

std::string printable(std::string_view s, std::size_t max_chars);

}  // namespace attnops
