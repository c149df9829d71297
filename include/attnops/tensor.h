// Tensor (owning, contiguous, row-major) and TensorView (non-owning, strided).
//
// Layouts used across attnops (BTHD, as EasyDeL):
//   q    [B, Tq, Hq, D]      k [B, Tk, Hkv, D]      v [B, Tk, Hkv, Dv]
//   out  [B, Tq, Hq, Dv]     lse [B, Hq, Tq] (f32)  weights [B, Hq, Tq, Tk] (f32)
//   bias [B|1, Hq|1, Tq, Tk] sinks [Hq]             segment ids [B, Tq] / [B, Tk]
// A view may have any strides on the outer dimensions (e.g. a slice of a KV cache); kernels
// require the innermost dimension to be contiguous (stride 1), which validation checks.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "attnops/dtype.h"

namespace attnops {

inline constexpr int kMaxRank = 4;
// The largest tensor, in bytes, attnops allocates: 2^47 (128 TiB), the x86-64 user address
// space, so no larger request can succeed. Shapes whose element or byte count would exceed it
// (or overflow int64) are an Error(invalid_argument) naming the shape, never a wrapped size.
inline constexpr std::int64_t kMaxTensorBytes = std::int64_t{1} << 47;

class Tensor;
class DeviceStorage;

class TensorView {
 public:
  TensorView() = default;
  // Every constructor checks the shape: rank <= 4, dimensions >= 0, and an element count (and,
  // for explicit strides, a byte extent) that fits in int64; otherwise Error(shape_mismatch /
  // invalid_argument) naming the shape.
  // Contiguous row-major view over `data`.
  TensorView(const void* data, DType dtype, std::initializer_list<std::int64_t> shape);
  TensorView(const void* data, DType dtype, const std::vector<std::int64_t>& shape);
  // Fully strided view; strides in elements.
  TensorView(const void* data, DType dtype, const std::vector<std::int64_t>& shape,
             const std::vector<std::int64_t>& strides);
  TensorView(const Tensor& t);  // NOLINT(google-explicit-constructor): Tensor -> view is free
  // A view of GPU memory (made by DeviceTensor::view()); `offset` in elements.
  TensorView(const DeviceStorage* storage, std::int64_t offset, DType dtype, const std::vector<std::int64_t>& shape,
             const std::vector<std::int64_t>& strides);

  bool empty() const { return data_ == nullptr && device_ == nullptr && rank_ == 0; }
  // Device views (DeviceTensor): data() is null; the elements live in device_storage() from
  // element device_offset() on. Only the gpu backend reads them.
  bool on_device() const { return device_ != nullptr; }
  const DeviceStorage* device_storage() const { return device_; }
  std::int64_t device_offset() const { return device_offset_; }
  const void* data() const { return data_; }
  template <class T> const T* data_as() const { return static_cast<const T*>(data_); }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  std::int64_t stride(int i) const { return strides_[static_cast<std::size_t>(i)]; }
  std::vector<std::int64_t> shape() const;
  std::int64_t numel() const;
  bool is_contiguous() const;
  // Element offset (in elements) of a multi-index; idx has rank() entries.
  std::int64_t offset(std::initializer_list<std::int64_t> idx) const;
  // A view over rows [begin, end) of dimension `d` (no copy).
  TensorView slice(int d, std::int64_t begin, std::int64_t end) const;

 private:
  const void* data_ = nullptr;
  DType dtype_ = DType::f32;
  int rank_ = 0;
  std::array<std::int64_t, kMaxRank> shape_{};
  std::array<std::int64_t, kMaxRank> strides_{};
  const DeviceStorage* device_ = nullptr;
  std::int64_t device_offset_ = 0;
};

class Tensor {
 public:
  Tensor() = default;
  // Zero-initialised, 64-byte aligned. Throws Error(invalid_argument) for a shape of more than
  // kMaxTensorBytes bytes and Error(out_of_memory) when the allocation fails. Large tensors are
  // mapped from the OS (already zero, no memset; transparent huge pages requested).
  Tensor(DType dtype, std::vector<std::int64_t> shape);
  static Tensor zeros(DType dtype, std::vector<std::int64_t> shape) { return Tensor(dtype, std::move(shape)); }
  // Deep copy of any host view into a contiguous tensor (Error invalid_argument for a device
  // view: use DeviceTensor::to_host), converting float dtypes (f32/f16/bf16 among
  // themselves, i32/i64 among themselves with a range check).
  static Tensor copy_of(const TensorView& v, DType to);
  static Tensor copy_of(const TensorView& v) { return copy_of(v, v.dtype()); }

  TensorView view() const { return TensorView(*this); }
  void* data() { return storage_.get(); }
  const void* data() const { return storage_.get(); }
  template <class T> T* data_as() { return reinterpret_cast<T*>(storage_.get()); }
  template <class T> const T* data_as() const { return reinterpret_cast<const T*>(storage_.get()); }
  DType dtype() const { return dtype_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  const std::vector<std::int64_t>& shape() const { return shape_; }
  std::int64_t numel() const;
  std::size_t nbytes() const { return nbytes_; }
  // Element i (flat) as float / set from float; float dtypes only. Convenience, not for kernels.
  float at(std::size_t i) const { return load_as_float(data(), dtype_, i); }
  void set(std::size_t i, float v) { store_from_float(data(), dtype_, i, v); }

 private:
  DType dtype_ = DType::f32;
  std::vector<std::int64_t> shape_;
  // 64-byte aligned storage so that kernels may use aligned vector loads on contiguous tensors.
  // Copies of a Tensor share storage (as torch.Tensor does); copy_of makes a deep copy.
  std::shared_ptr<std::byte> storage_;
  std::size_t nbytes_ = 0;
  friend class TensorView;
};

// "[2, 128, 8, 64]"
std::string shape_string(const std::vector<std::int64_t>& shape);

// True when no element of the view is NaN or +-inf (integer views: always). One pass over the
// elements (exponent bits only), any strides.
bool all_finite(const TensorView& t);

}  // namespace attnops
