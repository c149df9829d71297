#include "attnops/tensor.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "attnops/error.h"
#include "attnops/ext/device_storage.h"
#include "core/checked_size.h"

namespace attnops {

namespace {

void set_shape(int& rank, std::array<std::int64_t, kMaxRank>& shape, const std::int64_t* dims,
               std::size_t n) {
  if (n > static_cast<std::size_t>(kMaxRank))
    throw Error(ErrorCode::shape_mismatch, "tensor rank " + std::to_string(n) + " exceeds the maximum of 4");
  rank = static_cast<int>(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dims[i] < 0)
      throw Error(ErrorCode::shape_mismatch, "tensor dimension " + std::to_string(i) + " is negative");
    shape[i] = dims[i];
  }
  // numel() is then an exact int64 for every view (no wrapped element counts downstream).
  if (!checked_numel(dims, n))
    throw Error(ErrorCode::invalid_argument, "tensor view shape " +
                                                 shape_string(std::vector<std::int64_t>(dims, dims + n)) +
                                                 " has more elements than fit in int64");
}

// Byte offset of the farthest element of a strided view must fit in int64: kernels compute
// element offsets as sums of index * stride in int64.
void check_extent(int rank, const std::array<std::int64_t, kMaxRank>& shape,
                  const std::array<std::int64_t, kMaxRank>& strides, DType dtype) {
  std::int64_t extent = 0;
  bool ok = true;
  for (int i = 0; i < rank && ok; ++i) {
    const auto d = shape[static_cast<std::size_t>(i)], st = strides[static_cast<std::size_t>(i)];
    if (d == 0) return;  // an empty view touches nothing
    if (st == std::numeric_limits<std::int64_t>::min()) ok = false;
    auto span = ok ? checked_mul(d - 1, st < 0 ? -st : st) : std::nullopt;
    ok = span && !__builtin_add_overflow(extent, *span, &extent);
  }
  ok = ok && checked_mul(extent + 1, static_cast<std::int64_t>(dtype_size(dtype))).has_value();
  if (!ok) {
    std::vector<std::int64_t> sh(shape.begin(), shape.begin() + rank),
        st(strides.begin(), strides.begin() + rank);
    throw Error(ErrorCode::invalid_argument, "tensor view shape " + shape_string(sh) + " with strides " +
                                                 shape_string(st) + " spans more bytes than fit in int64");
  }
}

// Allocations of at least this size are mapped from the OS: the pages arrive zeroed (no memset
// that the kernel overwrites anyway) and, 2 MiB aligned with MADV_HUGEPAGE, fault in 2 MiB at a
// time instead of 4 KiB (page faults dominated `attnops run` on large inputs).
constexpr std::size_t kMapThreshold = std::size_t{2} << 20;
constexpr std::size_t kHugePage = std::size_t{2} << 20;

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kUseMmap = false;  // keep every tensor visible to AddressSanitizer's allocator
#else
constexpr bool kUseMmap = true;
#endif

// Zeroed, 64-byte aligned storage of at least `bytes` bytes (plus 64 for aligned overreads).
std::shared_ptr<std::byte> allocate_zeroed(std::size_t bytes, const std::string& what) {
  const std::size_t alloc = ((bytes + 63) / 64) * 64 + 64;  // never zero; room for aligned overreads
  auto fail = [&]() -> std::shared_ptr<std::byte> {
    throw Error(ErrorCode::out_of_memory,
                "cannot allocate " + std::to_string(alloc) + " bytes for tensor " + what);
  };
  if (kUseMmap && alloc >= kMapThreshold) {
    const std::size_t len = (alloc + kHugePage - 1) / kHugePage * kHugePage;
    void* raw = mmap(nullptr, len + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED) return fail();
    // Trim to a 2 MiB aligned window of `len` bytes.
    auto* base = static_cast<std::byte*>(raw);
    const auto addr = reinterpret_cast<std::uintptr_t>(base);
    const std::size_t head = (kHugePage - addr % kHugePage) % kHugePage;
    if (head) munmap(base, head);
    if (kHugePage - head) munmap(base + head + len, kHugePage - head);
    std::byte* p = base + head;
#if defined(MADV_HUGEPAGE)
    madvise(p, len, MADV_HUGEPAGE);  // a hint: without THP the mapping works as is
#endif
    return std::shared_ptr<std::byte>(p, [len](std::byte* q) { munmap(q, len); });
  }
  void* p = std::aligned_alloc(64, alloc);
  if (!p) return fail();
  std::memset(p, 0, alloc);
  return std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

void contiguous_strides(int rank, const std::array<std::int64_t, kMaxRank>& shape,
                        std::array<std::int64_t, kMaxRank>& strides) {
  std::int64_t s = 1;
  for (int i = rank - 1; i >= 0; --i) {
    strides[static_cast<std::size_t>(i)] = s;
    s *= shape[static_cast<std::size_t>(i)];
  }
}

}  // namespace

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (std::size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

TensorView::TensorView(const void* data, DType dtype, std::initializer_list<std::int64_t> shape)
    : data_(data), dtype_(dtype) {
  set_shape(rank_, shape_, shape.begin(), shape.size());
  contiguous_strides(rank_, shape_, strides_);
}

TensorView::TensorView(const void* data, DType dtype, const std::vector<std::int64_t>& shape)
    : data_(data), dtype_(dtype) {
  set_shape(rank_, shape_, shape.data(), shape.size());
  contiguous_strides(rank_, shape_, strides_);
}

TensorView::TensorView(const void* data, DType dtype, const std::vector<std::int64_t>& shape,
                       const std::vector<std::int64_t>& strides)
    : data_(data), dtype_(dtype) {
  set_shape(rank_, shape_, shape.data(), shape.size());
  if (strides.size() != shape.size())
    throw Error(ErrorCode::shape_mismatch, "tensor view: " + std::to_string(strides.size()) +
                                               " strides for rank " + std::to_string(shape.size()));
  for (std::size_t i = 0; i < strides.size(); ++i) strides_[i] = strides[i];
  check_extent(rank_, shape_, strides_, dtype_);
}

TensorView::TensorView(const DeviceStorage* storage, std::int64_t offset, DType dtype,
                       const std::vector<std::int64_t>& shape, const std::vector<std::int64_t>& strides)
    : TensorView(nullptr, dtype, shape, strides) {
  device_ = storage;
  device_offset_ = offset;
}

TensorView::TensorView(const Tensor& t) : data_(t.data()), dtype_(t.dtype()) {
  set_shape(rank_, shape_, t.shape().data(), t.shape().size());
  contiguous_strides(rank_, shape_, strides_);
}

std::vector<std::int64_t> TensorView::shape() const {
  return std::vector<std::int64_t>(shape_.begin(), shape_.begin() + rank_);
}

std::int64_t TensorView::numel() const {
  std::int64_t n = 1;
  for (int i = 0; i < rank_; ++i) n *= shape_[static_cast<std::size_t>(i)];
  return n;
}

bool TensorView::is_contiguous() const {
  std::int64_t s = 1;
  for (int i = rank_ - 1; i >= 0; --i) {
    const auto d = shape_[static_cast<std::size_t>(i)];
    if (d != 1 && strides_[static_cast<std::size_t>(i)] != s) return false;
    s *= d;
  }
  return true;
}

std::int64_t TensorView::offset(std::initializer_list<std::int64_t> idx) const {
  std::int64_t off = 0;
  std::size_t i = 0;
  for (auto x : idx) off += x * strides_[i++];
  return off;
}

TensorView TensorView::slice(int d, std::int64_t begin, std::int64_t end) const {
  if (d < 0 || d >= rank_ || begin < 0 || end < begin || end > shape_[static_cast<std::size_t>(d)])
    throw Error(ErrorCode::invalid_argument, "slice: range [" + std::to_string(begin) + ", " +
                                                 std::to_string(end) + ") of dimension " + std::to_string(d) +
                                                 " is out of bounds for " + shape_string(shape()));
  TensorView v = *this;
  v.shape_[static_cast<std::size_t>(d)] = end - begin;
  if (device_ != nullptr) {
    v.device_offset_ += begin * strides_[static_cast<std::size_t>(d)];
    return v;
  }
  v.data_ = static_cast<const std::byte*>(data_) +
            begin * strides_[static_cast<std::size_t>(d)] * static_cast<std::int64_t>(dtype_size(dtype_));
  return v;
}

Tensor::Tensor(DType dtype, std::vector<std::int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  if (shape_.size() > static_cast<std::size_t>(kMaxRank))
    throw Error(ErrorCode::shape_mismatch,
                "tensor rank " + std::to_string(shape_.size()) + " exceeds the maximum of 4");
  for (auto d : shape_)
    if (d < 0)
      throw Error(ErrorCode::shape_mismatch,
                  "tensor shape " + shape_string(shape_) + " has a negative dimension");
  const auto what = [&] { return shape_string(shape_) + " of " + std::string(dtype_name(dtype_)); };
  const auto n = checked_numel(shape_.data(), shape_.size());
  const auto bytes = n ? checked_mul(*n, static_cast<std::int64_t>(dtype_size(dtype_))) : std::nullopt;
  if (!bytes || *bytes > kMaxTensorBytes)
    throw Error(ErrorCode::invalid_argument,
                "tensor shape " + what() + " is too large: " +
                    (bytes ? std::to_string(*bytes) + " bytes" : "its size overflows int64") +
                    ", the maximum is 2^47 bytes");
  nbytes_ = static_cast<std::size_t>(*bytes);
  storage_ = allocate_zeroed(nbytes_, what());
}

namespace {
// Whether n contiguous elements of a float dtype hold a NaN or an infinity: all exponent bits set.
// Branch-free so that the compiler vectorises it (this runs over whole outputs).
template <class U>
bool any_nonfinite(const void* data, std::int64_t n, U exponent) {
  const U* u = static_cast<const U*>(data);
  bool bad = false;
  for (std::int64_t i = 0; i < n; ++i) bad |= (u[i] & exponent) == exponent;
  return bad;
}
bool any_nonfinite(const void* data, DType t, std::int64_t n) {
  switch (t) {
    case DType::f32:
      return any_nonfinite<std::uint32_t>(data, n, 0x7f800000u);
    case DType::f16:
      return any_nonfinite<std::uint16_t>(data, n, 0x7c00u);
    case DType::bf16:
      return any_nonfinite<std::uint16_t>(data, n, 0x7f80u);
    default:
      return false;
  }
}
}  // namespace

bool all_finite(const TensorView& t) {
  if (!is_float(t.dtype()) || t.numel() == 0) return true;
  if (t.is_contiguous()) return !any_nonfinite(t.data(), t.dtype(), t.numel());
  // Right-aligned to 4 dims; rows along the innermost dimension (contiguous or not).
  std::array<std::int64_t, kMaxRank> dims{1, 1, 1, 1}, st{0, 0, 0, 0};
  const int r = t.rank();
  for (int i = 0; i < r; ++i) {
    dims[static_cast<std::size_t>(kMaxRank - r + i)] = t.dim(i);
    st[static_cast<std::size_t>(kMaxRank - r + i)] = t.stride(i);
  }
  const auto* base = static_cast<const std::byte*>(t.data());
  const auto es = static_cast<std::int64_t>(dtype_size(t.dtype()));
  for (std::int64_t a = 0; a < dims[0]; ++a)
    for (std::int64_t b = 0; b < dims[1]; ++b)
      for (std::int64_t c = 0; c < dims[2]; ++c) {
        const std::byte* row = base + (a * st[0] + b * st[1] + c * st[2]) * es;
        if (st[3] == 1) {
          if (any_nonfinite(row, t.dtype(), dims[3])) return false;
        } else {
          for (std::int64_t d = 0; d < dims[3]; ++d)
            if (any_nonfinite(row + d * st[3] * es, t.dtype(), 1)) return false;
        }
      }
  return true;
}

std::int64_t Tensor::numel() const {
  std::int64_t n = 1;
  for (auto d : shape_) n *= d;
  return n;
}

Tensor Tensor::copy_of(const TensorView& v, DType to) {
  if (v.on_device())
    throw Error(ErrorCode::invalid_argument, "a device-resident tensor " + shape_string(v.shape()) +
                                                 " cannot be read on the host here: copy it with "
                                                 "DeviceTensor::to_host() first");
  const bool from_float = is_float(v.dtype()), to_float = is_float(to);
  if (is_kv8(v.dtype()) || is_kv8(to)) {  // 8-bit codes are copied, never converted
    if (v.dtype() != to)
      throw Error(ErrorCode::unsupported_dtype,
                  std::string("cannot convert ") + std::string(dtype_name(v.dtype())) + " to " +
                      std::string(dtype_name(to)) + " (8-bit codes are copied as they are)");
    Tensor t(to, v.shape());
    std::vector<std::int64_t> idx(static_cast<std::size_t>(v.rank()), 0);
    auto* dst = static_cast<std::uint8_t*>(t.data());
    const auto* src = static_cast<const std::uint8_t*>(v.data());
    for (std::int64_t o = 0; o < t.numel(); ++o) {
      std::int64_t off = 0;
      for (int i = 0; i < v.rank(); ++i) off += idx[static_cast<std::size_t>(i)] * v.stride(i);
      dst[o] = src[off];
      for (int i = v.rank() - 1; i >= 0; --i) {
        if (++idx[static_cast<std::size_t>(i)] < v.dim(i)) break;
        idx[static_cast<std::size_t>(i)] = 0;
      }
    }
    return t;
  }
  if (from_float != to_float)
    throw Error(ErrorCode::unsupported_dtype, std::string("cannot convert ") +
                                                  std::string(dtype_name(v.dtype())) + " to " +
                                                  std::string(dtype_name(to)));
  Tensor t(to, v.shape());
  const int r = v.rank();
  std::array<std::int64_t, kMaxRank> dims{1, 1, 1, 1}, st{0, 0, 0, 0};
  // Right-align into 4 dims so one loop nest serves every rank.
  for (int i = 0; i < r; ++i) {
    dims[static_cast<std::size_t>(kMaxRank - r + i)] = v.dim(i);
    st[static_cast<std::size_t>(kMaxRank - r + i)] = v.stride(i);
  }
  const auto* src = static_cast<const std::byte*>(v.data());
  const auto es = static_cast<std::int64_t>(dtype_size(v.dtype()));
  std::size_t o = 0;
  for (std::int64_t a = 0; a < dims[0]; ++a)
    for (std::int64_t b = 0; b < dims[1]; ++b)
      for (std::int64_t c = 0; c < dims[2]; ++c)
        for (std::int64_t d = 0; d < dims[3]; ++d, ++o) {
          const std::byte* e = src + (a * st[0] + b * st[1] + c * st[2] + d * st[3]) * es;
          if (from_float) {
            store_from_float(t.data(), to, o, load_as_float(e, v.dtype(), 0));
          } else {
            std::int64_t x = v.dtype() == DType::i32 ? *reinterpret_cast<const std::int32_t*>(e)
                                                     : *reinterpret_cast<const std::int64_t*>(e);
            if (to == DType::i32) {
              if (x < std::numeric_limits<std::int32_t>::min() ||
                  x > std::numeric_limits<std::int32_t>::max())
                throw Error(ErrorCode::invalid_argument,
                            "integer value " + std::to_string(x) + " does not fit in i32");
              t.data_as<std::int32_t>()[o] = static_cast<std::int32_t>(x);
            } else {
              t.data_as<std::int64_t>()[o] = x;
            }
          }
        }
  return t;
}

}  // namespace attnops
