#include "benchkit/parse.h"

#include <cerrno>
#include <cstdlib>
#include <optional>

#include "attnops/error.h"

namespace attnops::benchkit {

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t end = text.find(sep, start);
    std::string_view piece =
        text.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start);
    while (!piece.empty() && (piece.front() == ' ' || piece.front() == '\t')) piece.remove_prefix(1);
    while (!piece.empty() && (piece.back() == ' ' || piece.back() == '\t')) piece.remove_suffix(1);
    out.emplace_back(piece);
    if (end == std::string_view::npos) break;
    start = end + 1;
  }
  return out;
}

long long parse_integer(std::string_view text, const std::string& what) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE)
    throw Error(ErrorCode::invalid_argument, what + ": expected an integer, got '" + s + "'");
  return v;
}

double parse_number(std::string_view text, const std::string& what) {
  const std::string s(text);
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || errno == ERANGE)
    throw Error(ErrorCode::invalid_argument, what + ": expected a number, got '" + s + "'");
  return v;
}

std::vector<Backend> parse_backend_list(std::string_view text) {
  if (text == "auto") return {};
  std::vector<Backend> out;
  for (const std::string& name : split(text, ',')) {
    const std::optional<Backend> b = parse_backend(name);
    if (!b)
      throw Error(ErrorCode::invalid_argument,
                  "unknown backend '" + name + "' (expected auto or a list of native, cpu, gpu, tpu)");
    out.push_back(*b);
  }
  return out;
}

}  // namespace attnops::benchkit
