// One logical device and everything created on it once: the compute queue, a command pool with
// one reusable command buffer and fence, descriptor sets (one shared set layout), a timestamp
// query pool, the pipeline cache and pipelines, the memory pools and the staging ring.
// Everything is created on first use and then reused: a call in steady state creates nothing.
// Internal to backends/vulkan.
//
// Thread safety: every member function except physical()/caps()/handle() requires mutex().
#pragma once

#include <vulkan/vulkan.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "attnops/metadata.h"
#include "backends/vulkan/vk_device_desc.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_memory.h"
#include "backends/vulkan/vk_shader_table.h"
#include "backends/vulkan/vk_util.h"

namespace attnops::vulkan::rt {

// A pipeline: a shader of the table and its specialization state. Specialization constant i
// (constant_id = i in GLSL) takes spec[i] for i < spec_count.
struct PipelineKey {
  static constexpr std::uint32_t kMaxSpec = 12;  // flash_tiled.comp declares 11
  ShaderId shader = ShaderId::count_;
  std::array<std::uint32_t, kMaxSpec> spec{};
  std::uint32_t spec_count = 0;
  std::uint32_t subgroup_size = 0;  // requiredSubgroupSize (0 = the driver's choice); needs caps
  bool full_subgroups = false;      // VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT
  auto operator<=>(const PipelineKey&) const = default;
};

// The pipeline cache file's bytes to seed a device's VkPipelineCache with, or nothing: read with
// a bound (kMaxPipelineCacheBytes) and only from a regular file; a file that cannot be used is
// treated as absent with a warning on stderr, data of another device or driver silently
// (vk_pipelines.cpp).
inline constexpr std::size_t kMaxPipelineCacheBytes = std::size_t{64} << 20;
std::string pipeline_cache_seed(const std::string& path, const PhysicalDevice& pd);

// While it lives, the fence waits of this thread's submissions time out after at most `ns` (the
// self-check's tiny problem: a hung kernel costs that, not the call's timeout); nests.
class ScopedFenceTimeout {
 public:
  explicit ScopedFenceTimeout(std::uint64_t ns);
  ~ScopedFenceTimeout();
  ScopedFenceTimeout(const ScopedFenceTimeout&) = delete;
  ScopedFenceTimeout& operator=(const ScopedFenceTimeout&) = delete;

 private:
  std::uint64_t saved_;
};

class Device {
 public:
  // Descriptor bindings 0..kBindings-1 (storage buffers) of the one set layout every pipeline
  // shares, and the push-constant range (the guaranteed minimum of maxPushConstantsSize).
  static constexpr std::uint32_t kBindings = 16;
  static constexpr std::uint32_t kPushConstantBytes = 128;

  Device(const PhysicalDevice& pd, const GpuSettings& settings);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const PhysicalDevice& physical() const { return pd_; }
  const DeviceCaps& caps() const { return pd_.caps; }
  VkDevice handle() const { return device_; }
  std::mutex& mutex() { return mu_; }
  // Destroys every Vulkan object (after waiting for the queue unless the device is lost).
  // Later calls fail with gpu_error; slices freed afterwards are ignored.
  void shutdown();
  bool shut_down() const { return device_ == VK_NULL_HANDLE; }
  // A lost device (or one released) fails every call; the runtime replaces a lost one.
  bool lost() const { return !lost_reason_.empty(); }
  const std::string& lost_reason() const { return lost_reason_; }
  void mark_lost(std::string why) { lost_reason_ = std::move(why); }
  // A fence wait that timed out: the device is abandoned as lost with work still running on it,
  // so its memory is neither freed nor reused, and the runtime destroys it only once that work is
  // known to have finished (vk_runtime.cpp).
  void mark_hung(std::string why) {
    hung_ = true;
    mark_lost(std::move(why));
  }
  bool hung() const { return hung_; }
  // Waits up to `ns` for the last submission; true when it has finished. Requires mutex().
  bool wait_last_submission(std::uint64_t ns);
  // Test support (debug::Fault::hang): an event, reset (created on first use), that the last
  // command of a submission waits for and only the host sets: the queue does not finish until
  // release_hang() sets it. release_hang() does not take mutex() (the thread that waits on the
  // hung submission holds it).
  VkEvent hang_event();
  void release_hang();
  // Throws Error(gpu_error) when the device cannot take work.
  void check_usable() const;

  // Pipelines, created on first use through the pipeline cache.
  VkPipeline pipeline(const PipelineKey& key);
  VkPipelineLayout pipeline_layout() const { return pipeline_layout_.get(); }
  // Writes the pipeline cache to `path` when it holds pipelines not yet written there.
  void persist_cache(const std::string& path);
  // The float controls declared on the attention modules created so far (vk_spirv.h), e.g.
  // "SignedZeroInfNanPreserve 32", or empty (none supported, ATTNOPS_VK_FLOAT_CONTROLS=0).
  const std::string& float_controls() const { return float_controls_; }

  // Memory.
  MemoryPool& memory() { return *memory_; }
  MemoryPool& staging_pool() { return *staging_pool_; }
  StagingRing& staging() { return *staging_; }
  // Whether device memory is written through its host mapping (upload copies skipped).
  bool direct_access() const { return memory_ && memory_->host_visible(); }
  // Whether read-backs read device memory through its mapping: only where that memory is the
  // host's own (UMA: integrated GPUs, software devices). On a discrete GPU whose memory is
  // host-visible (resizable BAR) a mapped read is an uncached PCIe read per element, so
  // downloads go through the host-cached staging ring there.
  bool direct_reads() const {
    return direct_access() && (pd_.info.type == "integrated" || pd_.info.type == "cpu");
  }
  // How data moves, for RunInfo: "device memory mapped (no copies)", ...
  std::string data_path() const;
  // 256 zero bytes bound to bindings a kernel does not use.
  const Slice& dummy() const { return dummy_; }

  // What one submission uses (Batch).
  VkQueue queue() const { return queue_; }
  VkCommandBuffer command_buffer() const { return cmd_; }
  VkFence fence() const { return fence_.get(); }
  VkDescriptorSetLayout set_layout() const { return set_layout_.get(); }
  // Descriptor set `i` of a submission (each dispatch of one submission needs its own); more
  // are allocated when a submission needs more than ever before.
  VkDescriptorSet descriptor_set(std::uint32_t i);
  // A timestamp query pool with at least `n` queries (grows only), or null without timestamps.
  VkQueryPool query_pool(std::uint32_t n);
  // ATTNOPS_VK_TIMEOUT_MS (default 120 s), or a ScopedFenceTimeout's shorter cap on this thread.
  std::uint64_t fence_timeout_ns() const;

 private:
  void create(const GpuSettings& settings);
  void create_pipeline_objects(const GpuSettings& settings);  // vk_pipelines.cpp
  PhysicalDevice pd_;
  std::mutex mu_;
  VkDevice device_ = VK_NULL_HANDLE;
  VkQueue queue_ = VK_NULL_HANDLE;
  std::string lost_reason_;
  Owned<VkCommandPool> command_pool_;
  VkCommandBuffer cmd_ = VK_NULL_HANDLE;
  Owned<VkFence> fence_;
  Owned<VkDescriptorSetLayout> set_layout_;
  Owned<VkPipelineLayout> pipeline_layout_;
  std::vector<Owned<VkDescriptorPool>> descriptor_pools_;
  std::vector<VkDescriptorSet> sets_;
  Owned<VkQueryPool> queries_;
  std::uint32_t query_count_ = 0;
  Owned<VkPipelineCache> cache_;
  std::string saved_path_;
  bool cache_dirty_ = false;
  std::vector<Owned<VkShaderModule>> modules_;  // by ShaderId, created on first use
  std::string float_controls_;
  std::map<PipelineKey, Owned<VkPipeline>> pipelines_;
  std::unique_ptr<MemoryPool> memory_, staging_pool_;
  std::unique_ptr<StagingRing> staging_;
  Slice dummy_;
  bool hung_ = false;
  std::mutex hang_mu_;
  Owned<VkEvent> hang_event_;
  bool hang_set_ = false;
};

// The cooperative-matrix extensions a device is created with: those it offers and this build
// holds shaders for (an extension no shader uses is not enabled: Debian 12's glslc has no
// GL_KHR_cooperative_matrix, and enabling VK_KHR_cooperative_matrix anyway put a feature structure
// the validation layers of that release do not know into the chain, which on the first real GPU
// run, an H100, was VUID-VkDeviceCreateInfo-pNext-pNext at every device creation).
struct CoopMatEnables {
  bool khr = false, nv = false;
};
CoopMatEnables coopmat_enables(const DeviceCaps& caps, const BuildCaps& built);

}  // namespace attnops::vulkan::rt
