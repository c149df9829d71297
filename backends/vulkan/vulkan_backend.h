// The Vulkan compute backend's entry points (what operators' forward_gpu and the system host
// call). Built from the real implementation when ATTNOPS_WITH_VULKAN is on, else from a stub
// that reports backend_unavailable.
#pragma once

#include <optional>
#include <vector>

#include "attnops/backward.h"
#include "attnops/decision.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/host.h"
#include "attnops/metadata.h"
#include "backends/common/block_map.h"

namespace attnops::vulkan {

enum class Kernel { vanilla, flash, blocksparse };

// Whether the backend was compiled in.
bool compiled_in();
// Devices as the loader reports them, with `qualifies` set under these settings.
std::vector<GpuDeviceInfo> list_devices(const GpuSettings& settings);
// Whether some device qualifies (the one that would be used is named in detail).
Availability availability(const GpuSettings& settings);
// availability(settings).available without building the detail (the dispatcher asks per call).
bool available(const GpuSettings& settings);
// Whether the selected device can run this problem (size limits, head_dim, dtype).
std::optional<Reason> check_inputs(Kernel kernel, const AttentionProblem& p, const GpuSettings& settings);
// Runs one call. Inputs may be host or device views (TensorView::on_device()); when q is on the
// device the output is left there (buffers.device_out). With p.profile, buffers.run.timings
// holds the GPU timestamps of the call. `map` is the block map (blocksparse / flash skip empty blocks), may
// be null for vanilla. Throws Error(gpu_error) on runtime failure (nothing is left half-written in buffers
// that the caller would use), Error(backend_unavailable) when no device qualifies.
void run(Kernel kernel, const AttentionProblem& p, const BlockMap* map, const GpuSettings& settings,
         AttentionBuffers& buffers);

// The backward (every kernel runs the same one: the gradient does not depend on how the forward
// was computed): FlashAttention-2's, P recomputed from the lse tile by tile over the block map
// of the call's mask, deterministic. Host tensors only. check_backward_inputs: whether the
// selected device can run it (as check_inputs). run_backward fills the zero-initialised `grads`
// (dq, dk, dv in the storage dtype, dsinks / dbias f32) and grads.run; throws Error(gpu_error)
// on runtime failure (grads untouched), Error(backend_unavailable) when no device qualifies.
std::optional<Reason> check_backward_inputs(const BackwardProblem& bp, const GpuSettings& settings);
void run_backward(const BackwardProblem& bp, const GpuSettings& settings, GradientBuffers& grads);

// Shuts the process's GPU state down (devices, memory, pipelines, instance): attnops::release_gpu().
void release();

// The gpu side of auto's cost rule (attnops/cost.h), measured with a small calibration call on
// the selected device: kernel GFLOP/s from timestamps, upload / download GB/s and the fixed cost
// of a call. nullopt without a device (or when the calibration fails).
struct GpuRates {
  double gflops = 0, upload_gbps = 0, download_gbps = 0, call_us = 0;
};
std::optional<GpuRates> measure_rates(const GpuSettings& settings);

}  // namespace attnops::vulkan
