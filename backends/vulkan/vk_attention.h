// The attention kernels' launch code (flash.comp / vanilla.comp, convert.comp for device
// outputs in 16-bit dtypes) on the runtime's Batch interface. Internal to backends/vulkan.
#pragma once

#include <optional>

#include "attnops/decision.h"
#include "attnops/problem.h"
#include "backends/common/block_map.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops::vulkan {

// Why the device `pd` cannot run `p` with `kernel` (size limits, head_dim, dtype, device views
// it cannot address), or nullopt.
std::optional<Reason> device_limits_reason(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd);

// One call: uploads the host inputs (device-resident ones are bound where they are), one
// submission with the attention pass (and the convert pass for a 16-bit device output), reads
// back what the caller keeps on the host. Fills buffers.run.
void run_attention(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
                   AttentionBuffers& buffers);

}  // namespace attnops::vulkan
