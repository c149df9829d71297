#include "attnops/tensor.h"

#include <cstdlib>
#include <limits>
#include <new>
#include <sstream>

#include "attnops/error.h"

namespace attnops {

namespace {

void set_shape(int& rank, std::array<std::int64_t, kMaxRank>& shape, const std::int64_t* dims, std::size_t n) {
  if (n > static_cast<std::size_t>(kMaxRank))
    throw Error(ErrorCode::shape_mismatch, "tensor rank " + std::to_string(n) + " exceeds the maximum of 4");
  rank = static_cast<int>(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (dims[i] < 0) throw Error(ErrorCode::shape_mismatch, "tensor dimension " + std::to_string(i) + " is negative");
    shape[i] = dims[i];
  }
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
    throw Error(ErrorCode::shape_mismatch, "tensor view: " + std::to_string(strides.size()) + " strides for rank " +
                                               std::to_string(shape.size()));
  for (std::size_t i = 0; i < strides.size(); ++i) strides_[i] = strides[i];
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
    throw Error(ErrorCode::invalid_argument, "slice: range [" + std::to_string(begin) + ", " + std::to_string(end) +
                                                 ") of dimension " + std::to_string(d) + " is out of bounds for " +
                                                 shape_string(shape()));
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
    throw Error(ErrorCode::shape_mismatch, "tensor rank " + std::to_string(shape_.size()) + " exceeds the maximum of 4");
  std::size_t n = 1;
  for (auto d : shape_) {
    if (d < 0) throw Error(ErrorCode::shape_mismatch, "tensor shape " + shape_string(shape_) + " has a negative dimension");
    if (d != 0 && n > std::numeric_limits<std::size_t>::max() / static_cast<std::size_t>(d))
      throw Error(ErrorCode::invalid_argument, "tensor shape " + shape_string(shape_) + " is too large");
    n *= static_cast<std::size_t>(d);
  }
  nbytes_ = n * dtype_size(dtype_);
  const std::size_t alloc = ((nbytes_ + 63) / 64) * 64 + 64;  // never zero; room for aligned overreads
  void* p = std::aligned_alloc(64, alloc);
  if (!p) throw std::bad_alloc();
  std::memset(p, 0, alloc);
  storage_ = std::shared_ptr<std::byte>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
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
  if (from_float != to_float)
    throw Error(ErrorCode::unsupported_dtype, std::string("cannot convert ") + std::string(dtype_name(v.dtype())) +
                                                  " to " + std::string(dtype_name(to)));
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
              if (x < std::numeric_limits<std::int32_t>::min() || x > std::numeric_limits<std::int32_t>::max())
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
