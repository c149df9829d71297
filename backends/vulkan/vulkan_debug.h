// Test-visible diagnostics of the Vulkan backend: validation-layer counters, fault injection and
// deliberate mistakes that prove the counters work. Not part of the public API.
//
// Validation is enabled when the process-wide Vulkan instance is created (the first call into
// the backend) with ATTNOPS_VK_VALIDATION=1 in the environment: the Khronos validation layer
// with synchronization validation, and a VK_EXT_debug_utils messenger that counts what it says.
#pragma once

#include <cstdint>
#include <optional>
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

// Fault injection, for tests of the fallback and cleanup paths. While a fault is set:
//  - device_lost: the next submission fails with VK_ERROR_DEVICE_LOST and the device is marked
//    lost (every later call on it fails fast; the runtime replaces it on the next call);
//  - out_of_memory: every device-memory allocation fails with VK_ERROR_OUT_OF_DEVICE_MEMORY;
//  - hang: every submission (of every variant, or of the one named by set_fault_variant /
//    ATTNOPS_VK_INJECT_FAULT=hang:NAME) ends waiting for an event only the host sets, in
//    release_injected_hangs() (as a hung kernel): the fence wait times out
//    (ATTNOPS_VK_TIMEOUT_MS; the self-check's shorter one), the device is abandoned as lost and
//    the call fails with gpu_error (the self-check disables the variant instead);
//  - wrong_result: the self-check (README "Self-check") sees a wrong answer from every variant,
//    or from the one named by set_fault_variant / ATTNOPS_VK_INJECT_FAULT=wrong_result:NAME.
// ATTNOPS_VK_INJECT_FAULT in the environment does the same: 1 or device_lost, oom, hang[:VARIANT],
// wrong_result[:VARIANT].
enum class Fault { none, device_lost, out_of_memory, hang, wrong_result };
void set_inject_fault(Fault f);
inline void set_inject_fault(bool on) {
  set_inject_fault(on ? Fault::device_lost : Fault::none);
}
// The fault in force (the setter's, else the environment's).
Fault injected_fault();
bool inject_fault_active();  // injected_fault() != Fault::none
// Lets every submission the hang fault stopped finish (the runtime's release() calls it too).
void release_injected_hangs();
// hang and wrong_result for one variant only ("" = every variant; the environment's ":NAME"
// otherwise), and whether the fault in force applies to `variant`.
void set_fault_variant(const std::string& variant);
std::string fault_variant();
bool fault_applies_to(const std::string& variant);

// Caps the device memory the runtime reserves per pool (0 = only the device's budget), so tests
// reach the out-of-memory path with small problems.
void set_memory_limit(std::uint64_t bytes);
std::uint64_t memory_limit();

// Forces the staging path (copies through the staging ring) on devices whose memory is
// host-visible; read when a device is created (so call release() around it). Also
// ATTNOPS_VK_FORCE_STAGING=1.
void set_force_staging(bool on);
bool force_staging();

// An injected device description, for tests of behaviour that depends on what the device is
// (the read-back path of a discrete GPU, split counts on a device of many compute units, the
// limits of a large GPU). The fields set replace what the driver reports, for every device, when
// the instance is next created (call release() around it). Only what the real device can honour
// is overridable: the type, the compute-unit count, and the buffer limits (lowered only).
struct DeviceOverride {
  std::optional<std::string> type;  // "discrete", "integrated", "cpu", ...
  std::optional<std::uint32_t> compute_units;
  std::optional<std::uint64_t> max_storage_buffer_range, max_allocation;  // never above the driver's
};
void set_device_override(std::optional<DeviceOverride> o);
std::optional<DeviceOverride> device_override();

// Vulkan objects the runtime created so far, process-wide (the steady-state test: a call of a
// shape class that already ran creates none; submissions: one per call).
struct ObjectCounts {
  std::uint64_t devices = 0, buffers = 0, memory = 0, descriptor_pools = 0, descriptor_sets = 0,
                command_pools = 0, command_buffers = 0, pipelines = 0, query_pools = 0, fences = 0,
                submissions = 0;
  bool operator==(const ObjectCounts&) const = default;
};
ObjectCounts object_counts();

// Bytes of device memory the selected device's pool holds in blocks / hands out in slices
// (throws Error(backend_unavailable) without a device).
struct MemoryUse {
  std::uint64_t reserved = 0, live = 0;
  bool direct_access = false;  // device memory used through its mapping
};
MemoryUse memory_use(const GpuSettings& settings = {});

// What the runtime knows about the selected device (subgroups, shared memory, cooperative
// matrices, timestamps, memory): a one-line summary for `attnops info` and failure messages.
std::string device_summary(const GpuSettings& settings = {});

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
