// DeviceTensor's shape, stride and view logic, its host copies, and zeros / from_host over the
// storage the GPU backend's registered allocator gives (core/device_memory.h).
#include "attnops/device_tensor.h"

#include <atomic>

#include "attnops/error.h"
#include "attnops/ext/device_storage.h"
#include "core/device_memory.h"

namespace attnops {

namespace {

// The contiguous byte runs of a strided view: innermost rows, merged with their neighbours
// while the view is contiguous over them. `fn(device_byte_offset, host_byte_offset, bytes)`.
template <class Fn>
void for_each_run(const TensorView& v, std::int64_t base, Fn&& fn) {
  const int r = v.rank();
  const auto es = static_cast<std::int64_t>(dtype_size(v.dtype()));
  if (v.numel() == 0) return;
  // Fold the innermost dims that are contiguous into one run.
  int inner = r;
  std::int64_t run = 1;
  while (inner > 0 && (v.dim(inner - 1) == 1 || v.stride(inner - 1) == run)) {
    run *= v.dim(inner - 1);
    --inner;
  }
  std::array<std::int64_t, kMaxRank> idx{};
  std::int64_t host = 0;
  for (;;) {
    std::int64_t off = base;
    for (int i = 0; i < inner; ++i) off += idx[static_cast<std::size_t>(i)] * v.stride(i);
    fn(off * es, host * es, run * es);
    host += run;
    int i = inner - 1;
    for (; i >= 0; --i) {
      if (++idx[static_cast<std::size_t>(i)] < v.dim(i)) break;
      idx[static_cast<std::size_t>(i)] = 0;
    }
    if (i < 0) return;
  }
}

// Constant-initialised: a backend may register from its static initialisers, in any order.
std::atomic<detail::DeviceAllocator> g_allocator{nullptr};

std::shared_ptr<DeviceStorage> allocate(std::size_t bytes, bool zeroed, const GpuSettings& gpu) {
  const detail::DeviceAllocator fn = g_allocator.load(std::memory_order_acquire);
  if (fn == nullptr)
    throw Error(ErrorCode::backend_unavailable, "device tensors: no GPU backend is linked into this program");
  return fn(bytes, zeroed, gpu);
}

}  // namespace

bool detail::register_device_allocator(DeviceAllocator allocate) {
  g_allocator.store(allocate, std::memory_order_release);
  return true;
}

DeviceTensor DeviceTensor::zeros(DType dtype, std::vector<std::int64_t> shape, const GpuSettings& gpu) {
  const TensorView shape_check(nullptr, dtype, shape);  // validates the shape before any allocation
  const auto bytes = static_cast<std::size_t>(shape_check.numel()) * dtype_size(dtype);
  return DeviceTensor(allocate(bytes, true, gpu), dtype, shape);
}

DeviceTensor DeviceTensor::from_host(const TensorView& host, const GpuSettings& gpu) {
  if (host.on_device())
    throw Error(ErrorCode::invalid_argument, "DeviceTensor::from_host: the source is on the device");
  const auto bytes = static_cast<std::size_t>(host.numel()) * dtype_size(host.dtype());
  DeviceTensor t(allocate(bytes, false, gpu), host.dtype(), host.shape());
  t.copy_from(host);
  return t;
}

DeviceTensor::DeviceTensor(std::shared_ptr<DeviceStorage> storage, DType dtype,
                           const std::vector<std::int64_t>& shape)
    : storage_(std::move(storage)), dtype_(dtype) {
  const TensorView v(nullptr, dtype, shape);  // validates the rank and computes contiguous strides
  rank_ = v.rank();
  for (int i = 0; i < rank_; ++i) {
    shape_[static_cast<std::size_t>(i)] = v.dim(i);
    strides_[static_cast<std::size_t>(i)] = v.stride(i);
  }
}

TensorView DeviceTensor::view() const {
  std::vector<std::int64_t> shape(shape_.begin(), shape_.begin() + rank_),
      strides(strides_.begin(), strides_.begin() + rank_);
  return TensorView(storage_.get(), offset_, dtype_, shape, strides);
}

DeviceTensor DeviceTensor::slice(int d, std::int64_t begin, std::int64_t end) const {
  const TensorView v = view().slice(d, begin, end);  // checks the range
  DeviceTensor t = *this;
  t.shape_[static_cast<std::size_t>(d)] = end - begin;
  t.offset_ = v.device_offset();
  return t;
}

std::string DeviceTensor::device() const {
  return storage_ ? storage_->describe() : std::string();
}

Tensor DeviceTensor::to_host() const {
  if (!storage_) throw Error(ErrorCode::invalid_argument, "DeviceTensor::to_host: the tensor is empty");
  Tensor t(dtype_, shape());
  std::vector<DeviceStorage::Copy> copies;
  auto* dst = static_cast<std::byte*>(t.data());
  for_each_run(view(), offset_, [&](std::int64_t dev, std::int64_t host, std::int64_t bytes) {
    DeviceStorage::Copy c;
    c.device_offset = static_cast<std::size_t>(dev);
    c.bytes = static_cast<std::size_t>(bytes);
    c.dst = dst + host;
    copies.push_back(c);
  });
  if (!copies.empty()) storage_->read(copies);
  return t;
}

void DeviceTensor::copy_from(const TensorView& src) {
  if (!storage_) throw Error(ErrorCode::invalid_argument, "DeviceTensor::copy_from: the tensor is empty");
  if (src.on_device())
    throw Error(ErrorCode::invalid_argument, "DeviceTensor::copy_from: the source must be a host tensor");
  if (src.shape() != shape())
    throw Error(ErrorCode::shape_mismatch, "DeviceTensor::copy_from: source shape " +
                                               shape_string(src.shape()) +
                                               " differs from the destination's " + shape_string(shape()));
  if (src.dtype() != dtype_)
    throw Error(ErrorCode::unsupported_dtype,
                "DeviceTensor::copy_from: source dtype " + std::string(dtype_name(src.dtype())) +
                    " differs from the destination's " + std::string(dtype_name(dtype_)));
  // The source is packed in the destination's element order first (any strides allowed).
  const Tensor packed = src.is_contiguous() ? Tensor() : Tensor::copy_of(src);
  const auto* base = static_cast<const std::byte*>(src.is_contiguous() ? src.data() : packed.data());
  std::vector<DeviceStorage::Copy> copies;
  for_each_run(view(), offset_, [&](std::int64_t dev, std::int64_t host, std::int64_t bytes) {
    DeviceStorage::Copy c;
    c.device_offset = static_cast<std::size_t>(dev);
    c.bytes = static_cast<std::size_t>(bytes);
    c.src = base + host;
    copies.push_back(c);
  });
  if (!copies.empty()) storage_->write(copies);
}

}  // namespace attnops
