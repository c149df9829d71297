#include "core/printable.h"

namespace attnops {

std::string printable(std::string_view s, std::size_t max_chars) {
  std::string out;
  for (std::size_t i = 0; i < s.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
    } else {
      out += static_cast<char>(c);
    }
  }
  if (s.size() > max_chars) out += "...";
  return out;
}

}  // namespace attnops
