// Text from an input file as it may appear in an error message: control bytes escaped (\xNN) and
// long text shortened, so that a garbled or hostile file cannot put terminal escape sequences or
// megabytes into a message. Used by the YAML config loader and the bench-file parser.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace attnops {

// At most max_chars characters of s (then "..."), every byte < 0x20 and 0x7f as \xNN.
std::string printable(std::string_view s, std::size_t max_chars = 200);

}  // namespace attnops
