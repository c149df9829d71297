// Device tensors on Vulkan: storage, reads and writes (one submission each), and the allocator
// behind DeviceTensor::zeros / from_host, registered with core.
#include "backends/vulkan/vk_storage.h"

#include <cstring>

#include "backends/vulkan/vk_batch.h"
#include "backends/vulkan/vk_runtime.h"
#include "core/device_memory.h"

namespace attnops::vulkan::rt {

VulkanStorage::VulkanStorage(std::shared_ptr<Device> dev, const Slice& slice, std::size_t bytes)
    : dev_(std::move(dev)), slice_(slice), bytes_(bytes) {}

VulkanStorage::~VulkanStorage() {
  // Bookkeeping only (no Vulkan call), so a tensor destroyed at exit is harmless.
  std::lock_guard<std::mutex> lock(dev_->mutex());
  if (!dev_->shut_down()) dev_->memory().free(slice_);
}

std::string VulkanStorage::describe() const {
  return "Vulkan device [" + std::to_string(dev_->physical().info.index) + "] " + dev_->physical().info.name;
}

void VulkanStorage::write(const std::vector<Copy>& copies) {
  std::lock_guard<std::mutex> lock(dev_->mutex());
  dev_->check_usable();
  for (const Copy& c : copies)
    if (c.device_offset + c.bytes > bytes_)
      throw Error(ErrorCode::internal, "device tensor write out of the storage's bounds");
  if (dev_->direct_access() && slice_.mapped != nullptr) {  // through the mapping: no submission
    dev_->check_usable();
    for (const Copy& c : copies) {
      std::memcpy(slice_.mapped + c.device_offset, c.src, c.bytes);
      dev_->memory().flush(slice_, c.device_offset, c.bytes);
    }
    return;
  }
  Batch batch(*dev_, false);
  for (const Copy& c : copies) {
    batch.upload(slice_, c.device_offset, c.bytes, [&](std::byte* dst) { std::memcpy(dst, c.src, c.bytes); });
  }
  batch.submit();
}

void VulkanStorage::read(const std::vector<Copy>& copies) const {
  std::lock_guard<std::mutex> lock(dev_->mutex());
  dev_->check_usable();
  for (const Copy& c : copies)
    if (c.device_offset + c.bytes > bytes_)
      throw Error(ErrorCode::internal, "device tensor read out of the storage's bounds");
  if (dev_->direct_reads() && slice_.mapped != nullptr) {
    // Every submission ends with a device-to-host barrier and a fence wait: read in place.
    dev_->check_usable();
    for (const Copy& c : copies) {
      dev_->memory().invalidate(slice_, c.device_offset, c.bytes);
      std::memcpy(c.dst, slice_.mapped + c.device_offset, c.bytes);
    }
    return;
  }
  Batch batch(*dev_, false);
  for (const Copy& c : copies) {
    batch.download(slice_, c.device_offset, c.bytes,
                   [&](const std::byte* src) { std::memcpy(c.dst, src, c.bytes); });
  }
  batch.submit();  // also orders the read after every earlier submission's writes
}

std::shared_ptr<VulkanStorage> new_storage(const std::shared_ptr<Device>& dev, std::size_t bytes) {
  dev->check_usable();
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 15) / 16 * 16;  // shaders read uvec4s
  const Slice s = dev->memory().allocate(rounded);
  try {
    return std::make_shared<VulkanStorage>(dev, s, bytes);
  } catch (...) {
    dev->memory().free(s);
    throw;
  }
}

const VulkanStorage& storage_of(const TensorView& t, const Device& dev, const char* what) {
  const auto* s = dynamic_cast<const VulkanStorage*>(t.device_storage());
  if (s == nullptr)
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": a device tensor of another GPU backend");
  if (&s->device() != &dev) {
    if (s->device().shut_down() || s->device().lost())
      throw Error(ErrorCode::gpu_error,
                  std::string(what) + ": its device is gone (" + s->device().lost_reason() + ")");
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + " lives on " + s->describe() + ", the call runs on Vulkan device [" +
                    std::to_string(dev.physical().info.index) + "] " + dev.physical().info.name);
  }
  return *s;
}

}  // namespace attnops::vulkan::rt

namespace attnops::vulkan::rt {

namespace {

// DeviceTensor's allocator (core/device_memory.h): a slice of the selected device's memory.
std::shared_ptr<DeviceStorage> allocate_storage(std::size_t bytes, bool zeroed, const GpuSettings& gpu) {
  const std::shared_ptr<Device> dev = device(gpu);
  std::lock_guard<std::mutex> lock(dev->mutex());
  std::shared_ptr<VulkanStorage> storage = new_storage(dev, bytes);
  if (zeroed) {
    const Slice& s = storage->slice();
    if (dev->direct_access() && s.mapped != nullptr) {
      std::memset(s.mapped, 0, s.size);
      dev->memory().flush(s, 0, s.size);
    } else {
      Batch batch(*dev, false);
      batch.zero(s, 0, s.size);
      batch.submit();
    }
  }
  return storage;
}

[[maybe_unused]] const bool registered = detail::register_device_allocator(&allocate_storage);

}  // namespace

}  // namespace attnops::vulkan::rt
