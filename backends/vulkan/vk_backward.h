// The backward's launch code (shaders/backward_*.comp) on the runtime's Batch interface: the
// Vulkan side of vulkan::check_backward_inputs / vulkan::run_backward. Internal to backends/vulkan.
#pragma once

#include <optional>

#include "attnops/backward.h"
#include "attnops/decision.h"
#include "attnops/ext/backward_problem.h"
#include "backends/vulkan/vk_instance.h"

namespace attnops::vulkan {

// Why the device `pd` cannot run the backward of `bp` (dtype, head dims, buffer sizes over
// maxStorageBufferRange, dispatch sizes), or nullopt.
std::optional<Reason> backward_limits_reason(const BackwardProblem& bp, const rt::PhysicalDevice& pd);

// One backward call in one submission: uploads q, k, v, out, lse, dout (and bias, sinks,
// segment ids, the block map's row and column indexes), runs the dq pass (which also writes the
// row statistics), the dk/dv pass (dbias too) and, with sinks, the dsinks pass, and reads the
// gradients back into `grads` (rounded to the storage dtype). Fills grads.run. Throws
// Error(gpu_error) on runtime failure; `grads` is then untouched.
void launch_backward(const BackwardProblem& bp, const GpuSettings& settings, GradientBuffers& grads);

}  // namespace attnops::vulkan
