// DeviceTensor: a tensor kept in GPU memory between calls, with Tensor's shape, stride and view
// rules. Operators take device tensors wherever they take host tensors (a DeviceTensor converts
// to a TensorView that is on_device()); a call whose q is on the device leaves its output there
// (AttentionOutput::device_out).
//
//   auto cache_k = attnops::DeviceTensor::zeros(DType::f16, {B, Tmax, Hkv, D}, gpu);  // KV cache
//   cache_k.slice(1, 0, T).copy_from(k_prefill);      // writes rows [0, T): only those bytes move
//   auto out = attn(q, cache_k.slice(1, 0, T), cache_v.slice(1, 0, T));  // a view: no copy
//   cache_k.slice(1, T, T + 1).copy_from(k_step);     // append one row; the rest stays put
//   attnops::Tensor host = out.device_out.to_host();
//
// Device memory belongs to the process's GPU state: after attnops::release_gpu() (gpu.h) a
// device tensor can no longer be read or used (Error gpu_error), only destroyed.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnops/dtype.h"
#include "attnops/metadata.h"
#include "attnops/tensor.h"

namespace attnops {

// GPU memory that device tensors view: opaque here, implemented by the GPU backend
// (attnops/ext/device_storage.h).
class DeviceStorage;

class DeviceTensor {
 public:
  DeviceTensor() = default;
  // A zero-filled device tensor on the GPU `gpu` selects (same rules as the gpu backend:
  // gpu.allow_software or ATTNOPS_VK_ALLOW_SOFTWARE=1 for lavapipe). Error(backend_unavailable)
  // without a device, Error(gpu_error) when device memory runs out.
  static DeviceTensor zeros(DType dtype, std::vector<std::int64_t> shape, const GpuSettings& gpu = {});
  // A contiguous device copy of a host tensor or view (any strides).
  static DeviceTensor from_host(const TensorView& host, const GpuSettings& gpu = {});

  // A contiguous host copy.
  Tensor to_host() const;
  // Overwrites the elements of this tensor (or view) with `src`: same shape and dtype (else
  // Error shape_mismatch / unsupported_dtype). Only these elements move to the device.
  void copy_from(const TensorView& src);
  // A view over rows [begin, end) of dimension `d` (no copy), as TensorView::slice.
  DeviceTensor slice(int d, std::int64_t begin, std::int64_t end) const;
  // The device view operators take (TensorView::on_device() is true; data() is null).
  TensorView view() const;
  operator TensorView() const { return view(); }  // NOLINT(google-explicit-constructor)

  bool empty() const { return storage_ == nullptr; }
  DType dtype() const { return dtype_; }
  int rank() const { return rank_; }
  std::int64_t dim(int i) const { return shape_[static_cast<std::size_t>(i)]; }
  std::int64_t stride(int i) const { return strides_[static_cast<std::size_t>(i)]; }
  std::vector<std::int64_t> shape() const { return view().shape(); }
  std::int64_t numel() const { return view().numel(); }
  bool is_contiguous() const { return view().is_contiguous(); }
  std::int64_t offset() const { return offset_; }  // of element 0, in elements from the storage start
  const std::shared_ptr<DeviceStorage>& storage() const { return storage_; }
  // The device that holds it, e.g. "Vulkan device [0] llvmpipe (LLVM 15.0.6, 256 bits)"; empty
  // for an empty tensor.
  std::string device() const;

  // For backends: a device tensor over `storage` (contiguous, from element 0).
  DeviceTensor(std::shared_ptr<DeviceStorage> storage, DType dtype, const std::vector<std::int64_t>& shape);

 private:
  std::shared_ptr<DeviceStorage> storage_;
  DType dtype_ = DType::f32;
  int rank_ = 0;
  std::array<std::int64_t, kMaxRank> shape_{}, strides_{};
  std::int64_t offset_ = 0;
};

// DeviceTensor::from_host.
inline DeviceTensor to_device(const TensorView& host, const GpuSettings& gpu = {}) {
  return DeviceTensor::from_host(host, gpu);
}

}  // namespace attnops
