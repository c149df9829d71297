// Small Vulkan helpers shared by the runtime files: VkResult names and typed errors, zeroed
// structures, a move-only RAII handle, environment switches and the object-creation counters
// (vulkan_debug.h exposes them to the steady-state test). Internal to backends/vulkan.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <utility>

#include "attnops/error.h"

namespace attnops::vulkan::rt {

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ... ("VkResult(-13)" for codes not in the table).
std::string result_name(VkResult r);
// Error(gpu_error) "Vulkan: <what> failed (<VkResult name>)"; out-of-memory results say so
// first ("Vulkan: out of device memory: ..."), so that callers and the decision can tell.
[[noreturn]] void throw_vk(VkResult r, const std::string& what);
inline void check(VkResult r, const char* what) {
  if (r != VK_SUCCESS) throw_vk(r, what);
}

// A zero-initialised Vulkan structure with its sType set (aggregate initialisation with only
// sType would trip -Wmissing-field-initializers).
template <class T>
T make(VkStructureType type) {
  T s{};
  s.sType = type;
  return s;
}

// A device-owned handle destroyed with vkDestroyX(device, handle, nullptr). Move-only.
template <class T>
class Owned {
 public:
  using Destroy = void (*)(VkDevice, T, const VkAllocationCallbacks*);
  Owned() = default;
  Owned(VkDevice dev, T h, Destroy destroy) : dev_(dev), h_(h), destroy_(destroy) {}
  Owned(Owned&& o) noexcept : dev_(o.dev_), h_(std::exchange(o.h_, VK_NULL_HANDLE)), destroy_(o.destroy_) {}
  Owned& operator=(Owned&& o) noexcept {
    if (this != &o) {
      reset();
      dev_ = o.dev_;
      h_ = std::exchange(o.h_, VK_NULL_HANDLE);
      destroy_ = o.destroy_;
    }
    return *this;
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  ~Owned() { reset(); }
  void reset() {
    if (h_ != VK_NULL_HANDLE) destroy_(dev_, h_, nullptr);
    h_ = VK_NULL_HANDLE;
  }
  T get() const { return h_; }

 private:
  VkDevice dev_ = VK_NULL_HANDLE;
  T h_ = VK_NULL_HANDLE;
  Destroy destroy_ = nullptr;
};

// Environment helpers.
bool env_flag(const char* name);  // "1", "true", "on", "yes"
std::string env_string(const char* name);

// Every Vulkan object the runtime creates is counted by kind (vulkan_debug.h: object_counts).
enum class Created {
  device,
  buffer,
  memory,
  descriptor_pool,
  descriptor_set,
  command_pool,
  command_buffer,
  pipeline,
  query_pool,
  fence,
  submission,  // vkQueueSubmit calls (not objects: one per call in steady state)
  count_
};
void count_created(Created what, std::uint64_t n = 1);
std::uint64_t created(Created what);

}  // namespace attnops::vulkan::rt
