// The Vulkan runtime under the backend: the process-wide instance (with optional validation),
// device enumeration and selection, one lazily created context per selected device, and small
// RAII wrappers. Internal to backends/vulkan.
//
// Thread safety: instance() and context() are safe to call from any thread; a Context
// serialises everything that touches its queue or its pipeline table with its own mutex.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "attnops/error.h"
#include "attnops/host.h"
#include "attnops/metadata.h"
#include "backends/vulkan/vk_device_desc.h"
#include "backends/vulkan/vk_pipeline_key.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::rt {

// "VK_ERROR_OUT_OF_DEVICE_MEMORY", ... ("VkResult(-13)" for codes not in the table).
std::string result_name(VkResult r);
// Error(gpu_error) "gpu: <what> failed (<VkResult name>)".
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
  // Gives up ownership (for handles that must outlive a failed, still pending submission).
  T release() { return std::exchange(h_, VK_NULL_HANDLE); }

 private:
  VkDevice dev_ = VK_NULL_HANDLE;
  T h_ = VK_NULL_HANDLE;
  Destroy destroy_ = nullptr;
};

// One physical device with what attnops needs to know about it.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  GpuDeviceInfo info;  // qualifies / why_not filled in by list_devices()
  std::uint32_t api_version = 0;
  std::uint32_t compute_family = UINT32_MAX;  // UINT32_MAX: no compute queue
  std::uint32_t max_group_count[3] = {0, 0, 0};
  std::uint32_t max_group_size_x = 0;
  std::uint32_t max_push_constants = 0;
  std::uint64_t max_allocation = 0;  // VkPhysicalDeviceMaintenance3Properties
  // What the kernel selection reads (vk_device_query.h); the optional features it lists are
  // enabled when the context creates the device.
  DeviceDesc desc;
};

// The process-wide instance. Created on first use; ATTNOPS_VK_VALIDATION=1 at that moment
// enables the validation layer (with synchronization validation) and the counting messenger.
class Instance {
 public:
  VkInstance handle() const { return instance_; }
  bool validation() const { return messenger_ != VK_NULL_HANDLE; }
  const std::vector<PhysicalDevice>& devices() const { return devices_; }
  ~Instance();

 private:
  friend const Instance& instance();
  Instance();
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::vector<PhysicalDevice> devices_;
};
// Throws Error(backend_unavailable) when the loader has no usable Vulkan 1.2 instance.
const Instance& instance();

// Devices with `qualifies` / `why_not` set under these settings and the environment
// (ATTNOPS_VK_DEVICE, ATTNOPS_VK_ALLOW_SOFTWARE). Throws Error(backend_unavailable) without
// an instance.
std::vector<GpuDeviceInfo> list_devices(const GpuSettings& settings);
// Index (into instance().devices()) of the device run() would use, or -1 with *why set.
int select_device(const GpuSettings& settings, std::string* why);

// A host-visible storage buffer with its own memory, persistently mapped.
struct Buffer {
  Owned<VkDeviceMemory> memory;  // declared first: destroyed after the buffer bound to it
  Owned<VkBuffer> buffer;
  void* mapped = nullptr;
  VkDeviceSize size = 0;
  bool coherent = false;
};

// Makes host writes visible to the device / device writes visible to the host, for memory
// that is not coherent (no-ops otherwise).
void flush(VkDevice dev, const Buffer& b);
void invalidate(VkDevice dev, const Buffer& b);

using vulkan::PipelineKey;
using vulkan::ShaderId;

// One dispatch of a multi-pass kernel (see Context::dispatch_steps).
struct DispatchStep {
  VkPipeline pipeline = VK_NULL_HANDLE;
  const void* push = nullptr;  // push_bytes of push constants
  std::uint32_t push_bytes = 0;
  std::uint32_t groups[3] = {1, 1, 1};
};

// A logical device with one compute queue and everything created on it.
class Context {
 public:
  Context(const PhysicalDevice& pd, const GpuSettings& settings);
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const PhysicalDevice& physical() const { return pd_; }
  VkDevice device() const { return device_; }
  // Everything from recording to reading back runs under this lock (one queue, one pool).
  std::mutex& mutex() { return mu_; }

  Buffer make_buffer(VkDeviceSize size, VkBufferUsageFlags usage = 0);  // caller holds mutex()
  VkDescriptorSetLayout set_layout() const { return set_layout_.get(); }
  VkPipelineLayout pipeline_layout() const { return pipeline_layout_.get(); }
  // Created on first use (through the pipeline cache), with the key's specialization constants
  // and subgroup requirements. Throws Error(gpu_error) for a shader not compiled into this build.
  // Caller holds mutex().
  VkPipeline pipeline(const PipelineKey& key);
  // Records with `record`, submits, waits on a fence (timeout ATTNOPS_VK_TIMEOUT_MS, default
  // 120000). Throws Error(gpu_error) on failure; after a lost device (also one lost while
  // waiting out a timeout) the context is marked broken and every later call fails fast.
  // Caller holds mutex().
  template <class F>
  void submit(F&& record) {
    begin();
    record(cmd_);
    end_and_wait();
  }
  // Writes the pipeline cache to `path` (GpuSettings.pipeline_cache of the current call) when it
  // holds pipelines not yet written there; no-op for an empty path. Caller holds mutex().
  void persist_cache(const std::string& path);
  // Binds bufs[0 .. kBindings) to a fresh descriptor set (bindings 0..13 of the set layout),
  // pushes `push_bytes` of constants, dispatches `groups` workgroups, makes the shader's writes
  // visible to the host, submits and waits. Caller holds mutex().
  void dispatch(VkPipeline pipeline, const Buffer* bufs, const void* push, std::uint32_t push_bytes,
                const std::uint32_t (&groups)[3]);
  // As dispatch(), for several dispatches over the same buffers in one submission: a
  // compute-to-compute memory barrier between consecutive steps (each step may read what the
  // previous ones wrote), then the host barrier. Caller holds mutex().
  void dispatch_steps(const Buffer* bufs, const DispatchStep* steps, std::size_t count);
  bool broken() const { return !broken_reason_.empty(); }
  const std::string& broken_reason() const { return broken_reason_; }
  void mark_broken(std::string why) { broken_reason_ = std::move(why); }
  static constexpr std::uint32_t kBindings = 14;            // bindings 0..13 of attn_io.glsl
  static constexpr std::uint32_t kPushConstantBytes = 128;  // the minimum every device offers

 private:
  void begin();
  void end_and_wait();
  PhysicalDevice pd_;
  std::string saved_path_;    // where the cache was last written
  bool cache_dirty_ = false;  // pipelines created since
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::mutex mu_;
  Owned<VkCommandPool> pool_;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  Owned<VkFence> fence_;
  Owned<VkPipelineCache> cache_;
  Owned<VkDescriptorSetLayout> set_layout_;
  Owned<VkPipelineLayout> pipeline_layout_;
  VkShaderModule module(ShaderId id);  // created on first use
  std::map<ShaderId, Owned<VkShaderModule>> modules_;
  std::map<PipelineKey, Owned<VkPipeline>> pipelines_;
  std::string broken_reason_;
};

// The context of the device select_device() picks under `settings` (created on first use).
// Throws Error(backend_unavailable) when no device qualifies, Error(gpu_error) when creating
// the device fails.
Context& context(const GpuSettings& settings);

// Environment helpers.
bool env_flag(const char* name);  // "1", "true", "on", "yes"
std::string env_string(const char* name);

// Counters of the validation messenger (vulkan_debug.h reads them).
void count_message(bool error, bool warning, bool sync, const std::string& text);
debug::ValidationCounts message_counts();
std::vector<std::string> recent_messages();
void reset_message_counts();

}  // namespace attnops::vulkan::rt
