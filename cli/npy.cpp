#include "cli/npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <limits>
#include <vector>

#include "attnops/error.h"
#include "cli/output_set.h"
#include "core/printable.h"

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
        bad("unexpected key '" + printable(key, 40) + "' (expected descr, fortran_order, shape)");
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
    // Dimensions beyond 2^62 cannot describe a file anyway; the limit is checked before the
    // multiply, so v * 10 + digit never overflows.
    constexpr std::int64_t kLimit = std::int64_t{1} << 62;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int digit = s_[pos_] - '0';
      if (v > (kLimit - digit) / 10) bad("dimension too large (more than 2^62)");
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
  if (descr == "|i1") return {DType::i8, 1};  // int8 (the codes of an 8-bit KV cache), kept as they are
  if (!descr.empty() && descr[0] == '>')
    fail(name, "big-endian data ('" + printable(descr, 40) +
                   "') is not supported; save it little-endian (astype('<...'))");
  fail(name, "unsupported dtype '" + printable(descr, 40) + "' (supported: <f4 <f2 <f8 <i4 <i8 |i1 |u1 |b1)");
}

std::uint32_t read_le(std::string_view b, std::size_t at, int n) {
  std::uint32_t v = 0;
  for (int i = n - 1; i >= 0; --i)
    v = (v << 8) | static_cast<unsigned char>(b[at + static_cast<std::size_t>(i)]);
  return v;
}

// The fixed part before the header text: magic, version, header length.
struct Preamble {
  int major = 1, minor = 0;
  std::size_t size = 10;       // bytes of the preamble: 10 (1.0) or 12 (2.0, 3.0)
  std::size_t header_len = 0;  // bytes of header text after it
};
constexpr std::size_t kMaxPreamble = 12;
// NumPy writes headers of a few hundred bytes; anything beyond this is not a file we can read
// (rank <= 4, simple dtypes), and refusing it bounds what a hostile header can make us read.
constexpr std::size_t kMaxHeaderLen = 65535;

// Parses the preamble from the first bytes of a file (at least 10; 12 for versions 2 and 3).
Preamble parse_preamble(std::string_view bytes, const std::string& name) {
  if (bytes.size() < 10 || bytes.substr(0, kMagic.size()) != kMagic)
    fail(name, "not a .npy file (missing the \\x93NUMPY magic)");
  Preamble p;
  p.major = static_cast<unsigned char>(bytes[6]);
  p.minor = static_cast<unsigned char>(bytes[7]);
  if (p.major < 1 || p.major > 3 || p.minor != 0)
    fail(name, "unsupported format version " + std::to_string(p.major) + "." + std::to_string(p.minor) +
                   " (supported: 1.0, 2.0, 3.0)");
  // 1.0 has a 2-byte header length; 2.0 and 3.0 a 4-byte one (3.0 allows UTF-8 in the header).
  const int len_bytes = p.major == 1 ? 2 : 4;
  p.size = 8 + static_cast<std::size_t>(len_bytes);
  if (bytes.size() < p.size) fail(name, "truncated in the header length");
  p.header_len = read_le(bytes, 8, len_bytes);
  if (p.header_len > kMaxHeaderLen)
    fail(name, "header length " + std::to_string(p.header_len) + " exceeds the " +
                   std::to_string(kMaxHeaderLen) + "-byte limit");
  return p;
}

NpyHeader parse_header_text(const Preamble& pre, std::string_view text, const std::string& name) {
  NpyHeader h;
  h.major = pre.major;
  h.minor = pre.minor;
  h.data_offset = pre.size + pre.header_len;
  HeaderParser(text, name).parse(h);
  if (h.fortran_order) fail(name, "Fortran-order arrays are not supported; save with np.ascontiguousarray");
  if (h.shape.size() > static_cast<std::size_t>(kMaxRank))
    fail(name, "rank " + std::to_string(h.shape.size()) + " " + shape_string(h.shape) +
                   " exceeds the maximum of " + std::to_string(kMaxRank));
  return h;
}

// The data bytes a header declares (element count x file bytes per element), checked.
std::uint64_t declared_bytes(const NpyHeader& h, const DescrInfo& d, const std::string& name) {
  std::uint64_t numel = 1;
  for (std::int64_t dim : h.shape)
    if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(dim), &numel))
      fail(name, "shape " + shape_string(h.shape) + " has more elements than fit in 64 bits");
  std::uint64_t need = 0;
  if (__builtin_mul_overflow(numel, static_cast<std::uint64_t>(d.file_size), &need))
    fail(name, "shape " + shape_string(h.shape) + " of " + h.descr + " needs more bytes than fit in 64 bits");
  return need;
}

void check_data_size(const NpyHeader& h, std::uint64_t need, std::uint64_t have, const std::string& name) {
  if (have < need)
    fail(name, "truncated: shape " + shape_string(h.shape) + " of " + h.descr + " needs " +
                   std::to_string(need) + " bytes of data, the file has " + std::to_string(have));
  if (have > need)
    fail(name, "shape " + shape_string(h.shape) + " of " + h.descr + " needs " + std::to_string(need) +
                   " bytes of data, the file has " + std::to_string(have) + " (trailing bytes)");
}

// The tensor for a header (an Error naming the file when the shape cannot be allocated).
Tensor tensor_for(const NpyHeader& h, const DescrInfo& d, const std::string& name) {
  try {
    return Tensor(d.dtype, h.shape);
  } catch (const Error& e) {
    fail(name, e.what());
  }
}

// Converts n file elements at src (descr "<f8", "|u1", "|b1") into t's storage from element at.
void widen(const NpyHeader& h, const char* src, std::size_t n, Tensor& t, std::size_t at) {
  if (h.descr == "<f8") {
    float* dst = t.data_as<float>() + at;
    for (std::size_t i = 0; i < n; ++i) {
      double x;
      std::memcpy(&x, src + i * 8, 8);
      dst[i] = static_cast<float>(x);
    }
  } else {
    std::int32_t* dst = t.data_as<std::int32_t>() + at;
    for (std::size_t i = 0; i < n; ++i) dst[i] = static_cast<unsigned char>(src[i]);
  }
}

// Reads up to n bytes (fewer only at end of file); errors name the file.
std::size_t read_fully(int fd, char* dst, std::size_t n, const std::string& name) {
  std::size_t got = 0;
  while (got < n) {
    const ssize_t r = ::read(fd, dst + got, std::min<std::size_t>(n - got, std::size_t{1} << 30));
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(name, std::string("read error (") + std::strerror(errno) + ")");
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

NpyHeader parse_npy_header(std::string_view bytes, const std::string& name) {
  const Preamble pre = parse_preamble(bytes, name);
  if (pre.header_len > bytes.size() - pre.size)
    fail(name, "header claims " + std::to_string(pre.header_len) + " bytes but the file has only " +
                   std::to_string(bytes.size() - pre.size) + " after the preamble");
  return parse_header_text(pre, bytes.substr(pre.size, pre.header_len), name);
}

Tensor parse_npy(std::string_view bytes, const std::string& name) {
  const NpyHeader h = parse_npy_header(bytes, name);
  const DescrInfo d = describe(h.descr, name);
  const std::uint64_t need = declared_bytes(h, d, name);
  check_data_size(h, need, bytes.size() - h.data_offset, name);
  Tensor t = tensor_for(h, d, name);
  const char* src = bytes.data() + h.data_offset;
  if (h.descr == "<f8" || (d.file_size == 1 && d.dtype == DType::i32))
    widen(h, src, static_cast<std::size_t>(t.numel()), t, 0);
  else if (need > 0)
    std::memcpy(t.data(), src, static_cast<std::size_t>(need));
  return t;
}

// Reads the preamble and header first, checks the declared size against the file's size, and
// only then reads the data: straight into the tensor's storage (one read of the data for the
// dtypes stored as they are), or through a small buffer for the widened ones (<f8, |u1, |b1).
// Nothing beyond what the header declares is read; a stream (pipe, device) that holds more is
// refused after one extra byte.
Tensor read_npy(const std::string& path) {
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(path, std::string("cannot stat (") + std::strerror(errno) + ")");
  if (S_ISDIR(st.st_mode)) fail(path, "is a directory");
  const bool regular = S_ISREG(st.st_mode);

  char pre_bytes[kMaxPreamble];
  std::size_t have = read_fully(fd.get(), pre_bytes, 10, path);
  if (have == 10 && static_cast<unsigned char>(pre_bytes[6]) >= 2)  // 2.0 / 3.0: 4-byte header length
    have += read_fully(fd.get(), pre_bytes + 10, 2, path);
  const Preamble pre = parse_preamble(std::string_view(pre_bytes, have), path);
  std::string text(pre.header_len, '\0');
  if (read_fully(fd.get(), text.data(), text.size(), path) != text.size())
    fail(path, "truncated in the header (" + std::to_string(pre.header_len) + " bytes declared)");
  const NpyHeader h = parse_header_text(pre, text, path);
  const DescrInfo d = describe(h.descr, path);
  const std::uint64_t need = declared_bytes(h, d, path);
  if (regular) {  // the size check, before any allocation
    const auto size = static_cast<std::uint64_t>(st.st_size);
    check_data_size(h, need, size - std::min<std::uint64_t>(size, h.data_offset), path);
  }

  Tensor t = tensor_for(h, d, path);
  std::uint64_t got = 0;
  if (h.descr == "<f8" || (d.file_size == 1 && d.dtype == DType::i32)) {
    std::vector<char> buf(std::size_t{1} << 20);
    const std::size_t per = buf.size() / d.file_size;
    for (std::size_t at = 0; got < need;) {
      const std::size_t n = std::min<std::uint64_t>(per, (need - got) / d.file_size);
      const std::size_t r = read_fully(fd.get(), buf.data(), n * d.file_size, path);
      if (r != n * d.file_size) {
        got += r;
        break;
      }
      widen(h, buf.data(), n, t, at);
      at += n;
      got += r;
    }
  } else {
    got = read_fully(fd.get(), static_cast<char*>(t.data()), static_cast<std::size_t>(need), path);
  }
  if (got < need) check_data_size(h, need, got, path);  // the file shrank, or a short stream
  char extra;
  if (!regular && read_fully(fd.get(), &extra, 1, path) == 1)
    fail(path, "shape " + shape_string(h.shape) + " of " + h.descr + " needs " + std::to_string(need) +
                   " bytes of data, the stream has more (trailing bytes)");
  return t;
}

namespace {

// The dtype a tensor is stored as in a .npy file (.npy has no bfloat16: bf16 is written as f32).
DType stored_dtype(DType t) {
  return t == DType::bf16 ? DType::f32 : t;
}

// Preamble and header of a .npy image for `t` (version 1.0, 2.0 only if the header needs it).
std::string npy_preamble_and_header(const TensorView& t) {
  std::string descr;
  switch (stored_dtype(t.dtype())) {
    case DType::f16:
      descr = "<f2";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::i8:
      descr = "|i1";
      break;
    case DType::fp8_e4m3:  // e4m3 bit patterns (NumPy has no fp8)
      descr = "|u1";
      break;
    default:
      descr = "<f4";
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
  std::string img;
  img += kMagic;
  img += static_cast<char>(v2 ? 2 : 1);
  img += '\0';
  const std::uint32_t hl = static_cast<std::uint32_t>(header.size());
  for (std::size_t i = 0; i < prefix - 8; ++i) img += static_cast<char>((hl >> (8 * i)) & 0xffu);
  return img + header;
}

void write_fully(int fd, const char* data, std::size_t n, const std::string& name) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, std::min<std::size_t>(n, std::size_t{1} << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail(name, std::string("write failed (") + std::strerror(errno) + ")");
    }
    data += w;
    n -= static_cast<std::size_t>(w);
  }
}

}  // namespace

std::string serialize_npy(const TensorView& t) {
  const Tensor data = Tensor::copy_of(t, stored_dtype(t.dtype()));  // contiguous, converted
  std::string img = npy_preamble_and_header(t);
  img.append(static_cast<const char*>(data.data()), data.nbytes());
  return img;
}

// The data goes out straight from the tensor's memory when it is contiguous in its stored
// dtype (one write, no copy); bf16 is widened to f32 in blocks, other views copied first.
void write_npy(int fd, const std::string& name, const TensorView& t) {
  const std::string head = npy_preamble_and_header(t);
  write_fully(fd, head.data(), head.size(), name);
  const std::size_t n = static_cast<std::size_t>(t.numel());
  if (n == 0) return;
  if (!t.is_contiguous()) {
    const Tensor c = Tensor::copy_of(t, stored_dtype(t.dtype()));
    write_fully(fd, static_cast<const char*>(c.data()), c.nbytes(), name);
  } else if (t.dtype() == DType::bf16) {
    std::vector<float> block(std::size_t{1} << 16);
    const auto* src = t.data_as<std::uint16_t>();
    for (std::size_t i = 0; i < n; i += block.size()) {
      const std::size_t m = std::min(block.size(), n - i);
      for (std::size_t j = 0; j < m; ++j) block[j] = bf16_bits_to_float(src[i + j]);
      write_fully(fd, reinterpret_cast<const char*>(block.data()), m * sizeof(float), name);
    }
  } else {
    write_fully(fd, static_cast<const char*>(t.data()), n * dtype_size(t.dtype()), name);
  }
}

void write_npy(const std::string& path, const TensorView& t) {
  OutputSet out;
  const int f = out.add(path, "npy file");
  write_npy(out.fd(f), path, t);
  out.commit();
}

}  // namespace attnops::cli
