// The Vulkan paged forward (ragged_paged's paged_gpu): a ragged batch over a paged KV cache in two
// passes of one submission (shaders/paged_attn.comp, shaders/paged_merge.comp), with the page
// table and the work list in storage buffers and the page pools read in place when the cache is
// device-resident (DeviceTensor storage; a host cache's pools are uploaded whole).
//
// The work list (built on the host from the plan, once per call): for every query row, its
// visible key interval (causal / window / chunk, per sequence) cut into tasks: at the plan's
// kv_split_tokens boundaries (from key 0) for stream sequences (decode-like: few query rows, so
// the splits give the device parallelism), whole for tile sequences. Pass 1 runs one workgroup per
// (task, q head) and writes a partial state; pass 2 merges each row's tasks in key order. Both
// choices depend only on the sequence, and every reduction runs in a fixed order, so a sequence's
// output is bitwise the same alone or inside any batch on a given device and driver.
#pragma once

#include <optional>

#include "attnops/decision.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/metadata.h"

namespace attnops::vulkan {

// Why the selected device cannot run `p` (no device, head dims over 512, buffers over the
// device's limits, device views it cannot address), or nullopt.
std::optional<Reason> check_paged_inputs(const PagedProblem& p, const GpuSettings& settings);

// Runs one paged call into `buffers` (out [N, Hq, Dv] and lse on the host; when q is a device
// tensor the output is left on the device in buffers.device_out instead). Fills buffers.run.
// Throws Error(gpu_error) on a runtime failure (the caller's buffers untouched),
// Error(backend_unavailable) without a device, Error(unsupported_feature) past the limits.
void run_paged(const PagedProblem& p, const GpuSettings& settings, PagedBuffers& buffers);

}  // namespace attnops::vulkan
