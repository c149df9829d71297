// Test-visible diagnostics of the Vulkan backend: validation-layer counters, fault injection and
// deliberate mistakes that prove the counters work. Not part of the public API.
//
// Validation is enabled when the process-wide Vulkan instance is created (the first call into
// the backend) with ATTNOPS_VK_VALIDATION=1 in the environment: the Khronos validation layer
// with synchronization validation, and a VK_EXT_debug_utils messenger that counts what it says.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "attnops/metadata.h"
#include "backends/vulkan/vk_device_desc.h"
#include "backends/vulkan/vk_kernel_select.h"

namespace attnops::vulkan::debug {

struct ValidationCounts {
  std::uint64_t errors = 0;        // severity ERROR (invalid usage, sync hazards)
  std::uint64_t warnings = 0;      // severity WARNING (incl. performance warnings)
  std::uint64_t sync_hazards = 0;  // messages whose id starts with "SYNC-" (any severity)
};

// Whether the instance was created with the validation layer and messenger (false when the
// environment did not ask for it, the layer is not installed, or the backend is not compiled in).
bool validation_enabled();
ValidationCounts validation_counts();
// The most recent messages (at most 32), for failure output.
std::vector<std::string> validation_messages();
void reset_validation_counts();

// While on, run() fails with Error(gpu_error) after allocating its device buffers and before
// submitting, as a lost device would (ATTNOPS_VK_INJECT_FAULT=1 in the environment does the
// same). For testing the dispatcher's fallback and the backend's cleanup path.
void set_inject_fault(bool on);
// Whether the next run() fails by injection (the flag above or the environment variable).
bool inject_fault_active();

// Caps the storage buffer range the backend plans with below the device's
// maxStorageBufferRange (0 = no cap), so tests reach the size limits with small problems.
void set_max_buffer_bytes(std::uint64_t bytes);
std::uint64_t max_buffer_bytes();  // the cap, 0 when none

// Forces a kernel variant and / or tile sizes for later run() calls (tests reach every variant
// the device can run; the bench compares variants). A variant that cannot run the problem is
// replaced by the normal choice, and the decision says so. The environment does the same with
// ATTNOPS_VK_KERNEL=<variant name> and ATTNOPS_VK_TILES="ds=2,rpt=1,bc=16,ku=4,rows=16,split=4"
// (what set_kernel_override sets wins).
void set_kernel_override(const KernelOverride& o);
void clear_kernel_override();
KernelOverride kernel_override();  // the override in effect

// The selected device as the kernel selection sees it (throws Error(backend_unavailable)
// without one).
DeviceDesc device_desc(const GpuSettings& settings = {});

// Deliberate mistakes on the selected device (throws Error(backend_unavailable) without one):
enum class Mistake {
  invalid_usage,  // vkCreateBuffer with size 0 (VUID-VkBufferCreateInfo-size-00912)
  sync_hazard,    // vkCmdFillBuffer then vkCmdCopyBuffer from it without a barrier (RAW hazard)
};
void plant_mistake(Mistake m, const GpuSettings& settings = {});

}  // namespace attnops::vulkan::debug
