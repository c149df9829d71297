// The attention kernels' launch code on the runtime's Batch interface: the variant selected for
// the device (vk_kernel_select.h), its launch plan (vk_launch.h: flash_tiled / flash_coopmat /
// flash.comp, split-KV + attn_merge, vanilla's three GEMM passes), convert.comp for device
// outputs in 16-bit dtypes. Internal to backends/vulkan.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "attnops/decision.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/vulkan/vk_instance.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vulkan_backend.h"

namespace attnops::vulkan {

// Why the device `pd` cannot run `p` with `kernel` as the selected variant plans it (size
// limits, head_dim, dtype, device views it cannot address), or nullopt.
std::optional<Reason> device_limits_reason(Kernel kernel, const AttentionProblem& p,
                                           const rt::PhysicalDevice& pd);

// One call: the variant chosen and self-checked (vk_selfcheck.h), then run_selected.
void run_attention(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
                   AttentionBuffers& buffers);

// The variant for `p` on `pd` (vk_kernel_select.h) under the test / bench override
// (vulkan_debug.h), passing over `disabled` ones. Pure.
Selection select_for(Kernel kernel, const AttentionProblem& p, const rt::PhysicalDevice& pd,
                     const std::vector<DisabledVariant>& disabled = {});
// Why `pd` cannot run `p` with `kernel` as `sel` plans it, or nullopt. Pure.
std::optional<Reason> limits_reason(Kernel kernel, const AttentionProblem& p, const rt::PhysicalDevice& pd,
                                    const Selection& sel);
// One call with a chosen variant: uploads the host inputs (device-resident ones are bound where
// they are), one submission with the attention pass (and the convert pass for a 16-bit device
// output), reads back what the caller keeps on the host; writes the pipeline cache to
// `pipeline_cache` when it is set. Fills buffers.run. `clear_alignment` (kVec / kAligned4 of
// vk_flags.h): alignment flags to clear although `p` has them (the self-check runs a call's
// pipelines, whose alignment may be less than its own packed problem's). `compile_only`: the same
// submission with no workgroup dispatched and nothing read back, so that a driver that compiles
// its pipelines at their first dispatch (lavapipe) does it then (the self-check's warm-up: its
// timed check then measures the kernels alone); buffers are left as they are.
namespace rt {
class Device;
}
void run_selected(Kernel kernel, const AttentionProblem& p, const BlockMap* map,
                  const std::shared_ptr<rt::Device>& dev, const Selection& sel,
                  const std::string& pipeline_cache, AttentionBuffers& buffers,
                  std::uint32_t clear_alignment = 0, bool compile_only = false);

// Helpers of the launch files (vk_attention.cpp, vk_backward.cpp).
namespace rt {
class Batch;
struct Slice;
}  // namespace rt
// The shaders' dtype code (specialization constant DTYPE): 0 f32, 1 f16, 2 bf16.
std::uint32_t dtype_code(DType t);
// Bytes of a packed q/k/v array, rounded up to whole 16-byte vectors (the shaders read uvec4s).
std::uint64_t packed_bytes(std::int64_t elements, std::size_t elem_size);
// Elements of the bias buffer the shaders index (b * stride_b + h * stride_h + i * Tk + j).
std::uint64_t bias_elements(const AttentionProblem& p);
// The largest storage buffer to plan with: maxStorageBufferRange, or less under
// debug::set_max_buffer_bytes.
std::uint64_t buffer_range(const rt::PhysicalDevice& pd);
std::string mib(std::uint64_t bytes);  // "12.5 MiB"
// Copies a BTHD view (any outer strides, innermost contiguous) into a packed [B, T, H, D] array.
void pack_bthd(const TensorView& t, void* dst);
// min(v, hi) as int32 (mask parameters past the sequence act like no bound).
std::int32_t clip32(std::int64_t v, std::int64_t hi);
// A host array uploaded into a scratch slice of `batch` (an invalid slice, bound to the dummy,
// when empty).
rt::Slice upload_array(rt::Batch& batch, const void* data, std::uint64_t bytes);

}  // namespace attnops::vulkan
