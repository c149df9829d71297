// The Vulkan implementation of attnops::DeviceStorage (device tensors): one pooled slice of a
// Device's memory, returned to the pool when the last tensor viewing it goes away.
// Internal to backends/vulkan.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "attnops/device_tensor.h"
#include "attnops/ext/device_storage.h"
#include "backends/vulkan/vk_device.h"

namespace attnops::vulkan::rt {

class VulkanStorage final : public DeviceStorage {
 public:
  // Takes `slice` of dev's memory (allocated by the caller under dev's mutex).
  VulkanStorage(std::shared_ptr<Device> dev, const Slice& slice, std::size_t bytes);
  ~VulkanStorage() override;
  std::size_t nbytes() const override { return bytes_; }
  std::string describe() const override;
  void write(const std::vector<Copy>& copies) override;
  void read(const std::vector<Copy>& copies) const override;

  Device& device() const { return *dev_; }
  const Slice& slice() const { return slice_; }

 private:
  std::shared_ptr<Device> dev_;
  Slice slice_;
  std::size_t bytes_;
};

// A new storage of `bytes` (rounded up to 16) on `dev`; caller holds dev->mutex().
std::shared_ptr<VulkanStorage> new_storage(const std::shared_ptr<Device>& dev, std::size_t bytes);

// The Vulkan storage behind a device view, checked to live on `dev` (Error invalid_argument
// naming `what` otherwise, Error gpu_error when its device was released or lost).
const VulkanStorage& storage_of(const TensorView& t, const Device& dev, const char* what);

}  // namespace attnops::vulkan::rt
