// Hand-made .npy images for tests of malformed files: any version, any header text, any data.
#pragma once

#include <cstdint>
#include <string>

namespace attnops::cli::testing {

// A .npy image of format version `major`.0 whose header is `header` padded with blanks and a
// final '\n' to a multiple of 64 bytes (as NumPy writes it), followed by `data`.
inline std::string npy_image(int major, std::string header, const std::string& data) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64) header += ' ';
  header += '\n';
  std::string img = "\x93NUMPY";
  img += static_cast<char>(major);
  img += '\0';
  const auto n = static_cast<std::uint32_t>(header.size());
  for (std::size_t i = 0; i < prefix - 8; ++i) img += static_cast<char>((n >> (8 * i)) & 0xffu);
  return img + header + data;
}

}  // namespace attnops::cli::testing
