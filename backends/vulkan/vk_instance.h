// The Vulkan instance (with optional validation), what each physical device offers
// (DeviceCaps: queried, never assumed) and device selection. Internal to backends/vulkan.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "attnops/host.h"
#include "attnops/metadata.h"
#include "backends/vulkan/vk_device_desc.h"
#include "backends/vulkan/vk_spirv.h"
#include "backends/vulkan/vk_util.h"
#include "backends/vulkan/vulkan_debug.h"

namespace attnops::vulkan::rt {

// One cooperative-matrix shape a device supports (VK_KHR_ / VK_NV_cooperative_matrix property
// lists). Component types are VkComponentTypeKHR values (e.g. 0 = f16, 1 = f32).
struct CoopMatShape {
  std::uint32_t M = 0, N = 0, K = 0;
  std::uint32_t a_type = 0, b_type = 0, c_type = 0, result_type = 0;
  bool saturating = false;
  std::uint32_t scope = 0;  // VkScopeKHR (3 = subgroup)
};

struct MemoryHeapInfo {
  std::uint64_t size = 0;
  bool device_local = false;
};

// What kernel selection needs to know about a device. Everything here is queried from the
// driver; a feature that is present is also enabled on the logical device (see Device).
struct DeviceCaps {
  // Subgroups: the default size, the size-control range and whether a compute pipeline may
  // require a size (requiredSubgroupSizeStages has COMPUTE) and full subgroups.
  std::uint32_t subgroup_size = 0, min_subgroup_size = 0, max_subgroup_size = 0;
  bool subgroup_size_control = false;  // feature subgroupSizeControl (enabled when present)
  bool required_subgroup_size_compute = false;
  bool compute_full_subgroups = false;      // feature computeFullSubgroups (enabled when present)
  VkSubgroupFeatureFlags subgroup_ops = 0;  // basic, vote, arithmetic, ballot, shuffle, ...
  bool subgroup_ops_compute = false;        // supportedStages has COMPUTE (subgroup_ops apply there)
  std::uint32_t compute_units = 0;          // SMs / CUs where the driver says (NV / AMD), else 0
  // Compute limits.
  std::uint32_t max_shared_memory = 0, max_invocations = 0, max_push_constants = 0;
  std::uint32_t max_group_size[3] = {0, 0, 0}, max_group_count[3] = {0, 0, 0};
  std::uint64_t max_storage_buffer_range = 0, max_allocation = UINT64_MAX;
  std::uint64_t min_storage_offset_alignment = 1, non_coherent_atom_size = 1;
  // Arithmetic and storage types (enabled when present).
  bool shader_float16 = false, shader_int8 = false, storage_16bit = false, storage_8bit = false;
  bool vulkan_memory_model = false;  // feature vulkanMemoryModel (the cooperative-matrix kernels)
  FloatControls float_controls;      // VkPhysicalDeviceFloatControlsProperties (vk_spirv.h)
  bool shader_bf16 = false;          // VK_KHR_shader_bfloat16 listed (reported; no kernel uses it yet)
  // Cooperative matrices (extension enabled with its feature when present).
  bool coopmat_khr = false, coopmat_nv = false;
  std::vector<CoopMatShape> coopmat_khr_shapes, coopmat_nv_shapes;
  // Timestamps on the compute queue: period in ns per tick, valid bits (0 = none).
  bool timestamps = false;
  double timestamp_period_ns = 0;
  std::uint32_t timestamp_valid_bits = 0;
  // Memory.
  std::vector<MemoryHeapInfo> heaps;
  bool device_local_host_visible = false;  // some DEVICE_LOCAL type is HOST_VISIBLE (UMA, ReBAR)
  bool memory_budget = false;              // VK_EXT_memory_budget (enabled when present)
  bool external_memory_host = false;       // VK_EXT_external_memory_host (enabled when present)
  std::uint64_t host_pointer_alignment = 0;
};

// One physical device with what attnops needs to know about it.
struct PhysicalDevice {
  VkPhysicalDevice handle = VK_NULL_HANDLE;
  GpuDeviceInfo info;  // qualifies / why_not filled in by list_devices()
  DeviceCaps caps;
  std::uint32_t api_version = 0;
  // Identity of the device and its driver: the pipeline cache's header
  // (VkPipelineCacheHeaderVersionOne) and the self-check cache are keyed by them.
  std::uint32_t vendor_id = 0, device_id = 0, driver_version = 0;
  std::uint8_t cache_uuid[16] = {};
  std::uint32_t compute_family = UINT32_MAX;  // UINT32_MAX: no compute queue
  std::vector<std::string> extensions;        // device extensions the driver offers
  bool has_extension(const char* name) const;
};

// Fills a PhysicalDevice from the driver's answers (vk_caps.cpp).
PhysicalDevice describe_device(VkInstance instance, VkPhysicalDevice h, int index);

// The device as the kernel selection sees it (vk_device_desc.h: plain data, no Vulkan types),
// from its DeviceCaps (vk_caps.cpp). Cooperative-matrix shapes of subgroup scope only.
DeviceDesc selection_desc(const PhysicalDevice& pd);

// The process's instance. ATTNOPS_VK_VALIDATION=1 at creation enables the validation layer
// (with synchronization validation) and the counting messenger. Owned by the Runtime
// (vk_runtime.h), destroyed only by release().
class Instance {
 public:
  Instance();
  ~Instance();
  Instance(const Instance&) = delete;
  Instance& operator=(const Instance&) = delete;
  VkInstance handle() const { return instance_; }
  bool validation() const { return messenger_ != VK_NULL_HANDLE; }
  const std::vector<PhysicalDevice>& devices() const { return devices_; }

 private:
  VkInstance instance_ = VK_NULL_HANDLE;
  VkDebugUtilsMessengerEXT messenger_ = VK_NULL_HANDLE;
  std::vector<PhysicalDevice> devices_;
};

// Devices with `qualifies` / `why_not` set under these settings and the environment
// (ATTNOPS_VK_DEVICE, ATTNOPS_VK_ALLOW_SOFTWARE).
std::vector<GpuDeviceInfo> list_devices(const Instance& inst, const GpuSettings& settings);
// Index (into inst.devices()) of the device to use, or -1 with *why set.
int select_device(const Instance& inst, const GpuSettings& settings, std::string* why);

// Counters of the validation messenger (vulkan_debug.h reads them).
void count_message(bool error, bool warning, bool sync, const std::string& text);
debug::ValidationCounts message_counts();
std::vector<std::string> recent_messages();
void reset_message_counts();

}  // namespace attnops::vulkan::rt
