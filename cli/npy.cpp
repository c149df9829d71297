#include "cli/npy.h"

#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "attnops/error.h"

namespace attnops::cli {

// The format stores little-endian data and so does every machine attnops targets; a big-endian
// port would need byte swapping here.
static_assert(std::endian::native == std::endian::little, "npy I/O assumes a little-endian host");

namespace {

constexpr std::string_view kMagic = "\x93NUMPY";

[[noreturn]] void fail(const std::string& name, const std::string& what) {
  throw Error(ErrorCode::io_error, "npy file '" + name + "': " + what);
}

// A recursive-descent reader for the one Python literal a header holds:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// Only what NumPy writes is accepted (strings, True/False, tuples of non-negative ints).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& name) : s_(text), name_(name) {}

  void parse(NpyHeader& h) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      const std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (have_descr) bad("duplicate key 'descr'");
        h.descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        if (have_order) bad("duplicate key 'fortran_order'");
        h.fortran_order = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        if (have_shape) bad("duplicate key 'shape'");
        h.shape = parse_shape();
        have_shape = true;
      } else {
        bad("unexpected key '" + key + "' (expected descr, fortran_order, shape)");
      }
      skip_ws();
      if (peek() == ',') {
        ++pos_;
        continue;
      }
      if (peek() != '}') bad("expected ',' or '}'");
    }
    ++pos_;  // '}'
    skip_ws();
    if (pos_ != s_.size()) bad("unexpected text after the header dictionary");
    if (!have_descr) bad("header has no 'descr'");
    if (!have_order) bad("header has no 'fortran_order'");
    if (!have_shape) bad("header has no 'shape'");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(name_, "malformed header (" + what + " at offset " + std::to_string(pos_) + ")");
  }
  char peek() const { return pos_ < s_.size() ? s_[pos_] : '\0'; }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n' || s_[pos_] == '\r'))
      ++pos_;
  }
  void expect(char c) {
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    const char quote = peek();
    if (quote != '\'' && quote != '"') bad("expected a quoted string");
    ++pos_;
    const std::size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] != quote) {
      if (s_[pos_] == '\\') bad("escapes in strings are not supported");
      ++pos_;
    }
    if (pos_ >= s_.size()) bad("unterminated string");
    std::string out(s_.substr(start, pos_ - start));
    ++pos_;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (s_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    bad("expected True or False");
  }
  std::int64_t parse_int() {
    if (!std::isdigit(static_cast<unsigned char>(peek()))) bad("expected a non-negative integer");
    std::int64_t v = 0;
    // Dimensions beyond 2^62 cannot describe a file anyway; stop before the int64 overflows.
    constexpr std::int64_t kLimit = std::int64_t{1} << 62;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int digit = s_[pos_] - '0';
      if (v > (kLimit - digit) / 10) bad("dimension too large");  // checked before v * 10 overflows
      v = v * 10 + digit;
      ++pos_;
    }
    if (peek() == 'L') ++pos_;  // Python 2 long suffix, as old NumPy wrote it
    return v;
  }
  std::vector<std::int64_t> parse_shape() {
    std::vector<std::int64_t> shape;
    expect('(');
    skip_ws();
    bool trailing_comma = false;
    while (peek() != ')') {
      shape.push_back(parse_int());
      skip_ws();
      trailing_comma = false;
      if (peek() == ',') {
        ++pos_;
        trailing_comma = true;
        skip_ws();
      } else if (peek() != ')') {
        bad("expected ',' or ')' in shape");
      }
    }
    // Python spells a 1-tuple "(n,)"; "(n)" is just an int, which NumPy rejects too.
    if (shape.size() == 1 && !trailing_comma) bad("a one-element shape needs a trailing comma");
    ++pos_;
    return shape;
  }

  std::string_view s_;
  const std::string& name_;
  std::size_t pos_ = 0;
};

struct DescrInfo {
  DType dtype;            // the tensor's dtype
  std::size_t file_size;  // bytes per element in the file
};

DescrInfo describe(const std::string& descr, const std::string& name) {
  if (descr == "<f4") return {DType::f32, 4};
  if (descr == "<f2") return {DType::f16, 2};
  if (descr == "<f8") return {DType::f32, 8};
  if (descr == "<i4") return {DType::i32, 4};
  if (descr == "<i8") return {DType::i64, 8};
  if (descr == "|u1" || descr == "|b1") return {DType::i32, 1};
  if (!descr.empty() && descr[0] == '>')
    fail(name, "big-endian data ('" + descr + "') is not supported; save it little-endian (astype('<...'))");
  fail(name, "unsupported dtype '" + descr + "' (supported: <f4 <f2 <f8 <i4 <i8 |u1 |b1)");
}

std::uint32_t read_le(std::string_view b, std::size_t at, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

}  // namespace

NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic)
    fail(name, "not a .npy file (missing the \\x93NUMPY magic)");
  NpyHeader h;
  h.major = static_cast<unsigned char>(bytes[6]);
  h.minor = static_cast<unsigned char>(bytes[7]);
  if (h.major < 1 || h.major > 3 || h.minor != 0)
    fail(name, "unsupported format version " + std::to_string(h.major) + "." + std::to_string(h.minor) +
                   " (supported: 1.0, 2.0, 3.0)");
  // 1.0 has a 2-byte header length; 2.0 and 3.0 a 4-byte one (3.0 allows UTF-8 in the header).
  const int len_bytes = h.major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + static_cast<std::size_t>(len_bytes);
  if (bytes.size() < prefix) fail(name, "truncated in the header length");
  const std::size_t header_len = read_le(bytes, 8, len_bytes);
  if (header_len > bytes.size() - prefix)
    fail(name, "header claims " + std::to_string(header_len) + " bytes but the file has only " +
                   std::to_string(bytes.size() - prefix) + " after the preamble");
  h.data_offset = prefix + header_len;
  HeaderParser(bytes.substr(prefix, header_len), name).parse(h);
  if (h.fortran_order) fail(name, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  if (h.shape.size() > static_cast<std::size_t>(kMaxRank))
    fail(name, "rank " + std::to_string(h.shape.size()) + " " + shape_string(h.shape) +
                   " exceeds the maximum of " + std::to_string(kMaxRank));
  return h;
}

Tensor parse_npy(std::string_view bytes, const std::string& name) {
  const NpyHeader h = parse_npy_header(bytes, name);
  const DescrInfo d = describe(h.descr, name);

  std::uint64_t numel = 1;
  for (std::int64_t dim : h.shape)
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dim), &numel))
      fail(name, "shape " + shape_string(h.shape) + " has more elements than fit in 64 bits");
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d.file_size), &need))
    fail(name, "shape " + shape_string(h.shape) + " of " + h.descr + " needs more bytes than fit in 64 bits");
  const std::uint64_t have = bytes.size() - h.data_offset;
  if (have < need)
    fail(name, "truncated: shape " + shape_string(h.shape) + " of " + h.descr + " needs " +
                   std::to_string(need) + " bytes of data, the file has " + std::to_string(have));
  if (have > need)
    fail(name, "shape " + shape_string(h.shape) + " of " + h.descr + " needs " + std::to_string(need) +
                   " bytes of data, the file has " + std::to_string(have) + " (trailing bytes)");

  Tensor t(d.dtype, h.shape);
  const char* src = bytes.data() + h.data_offset;
  const std::size_t n = static_cast<std::size_t>(numel);
  if (h.descr == "<f8") {
    float* dst = t.data_as<float>();
    for (std::size_t i = 0; i < n; ++i) {
      double x;
      std::memcpy(&x, src + i * 8, 8);
      dst[i] = static_cast<float>(x);
    }
  } else if (d.file_size == 1) {
    std::int32_t* dst = t.data_as<std::int32_t>();
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<unsigned char>(src[i]);
  } else if (n > 0) {
    std::memcpy(t.data(), src, static_cast<std::size_t>(need));
  }
  return t;
}

Tensor read_npy(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) fail(path, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) fail(path, "read error");
  return parse_npy(buf.str(), path);
}

std::string serialize_npy(const TensorView& t) {
  std::string descr;
  DType out = t.dtype();
  switch (t.dtype()) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f16:
      descr = "<f2";
      break;
    case DType::bf16:
      descr = "<f4";
      out = DType::f32;
      break;  // .npy has no bfloat16
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
  }
  // Python tuple syntax: "()", "(n,)", "(a, b, c)".
  std::string shape = "(";
  for (int i = 0; i < t.rank(); ++i) {
    if (i) shape += ", ";
    shape += std::to_string(t.dim(i));
  }
  shape += t.rank() == 1 ? ",)" : ")";
  std::string header = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // NumPy pads the header with spaces and a final '\n' so the data starts 64-byte aligned.
  const bool v2 = header.size() + 1 + 10 > 65535;
  const std::size_t prefix = v2 ? 12 : 10;
  const std::size_t total = (prefix + header.size() + 1 + 63) / 64 * 64;
  header.append(total - prefix - header.size() - 1, ' ');
  header += '\n';

  const Tensor data = Tensor::copy_of(t, out);  // contiguous, converted
  std::string img;
  img.reserve(total + data.nbytes());
  img += kMagic;
  img += static_cast<char>(v2 ? 2 : 1);
  img += '\0';
  const std::uint32_t hl = static_cast<std::uint32_t>(header.size());
  for (std::size_t i = 0; i < prefix - 8; ++i) img += static_cast<char>((hl >> (8 * i)) & 0xffu);
  img += header;
  img.append(static_cast<const char*>(data.data()), data.nbytes());
  return img;
}

void write_npy(const std::string& path, const TensorView& t) {
  const std::string img = serialize_npy(t);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, std::string("cannot open for writing (") + std::strerror(errno) + ")");
  out.write(img.data(), static_cast<std::streamsize>(img.size()));
  out.close();
  if (!out) fail(path, "write failed");
}

}  // namespace attnops::cli
