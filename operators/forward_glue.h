// Shared glue of the forward_* functions: allocate the outputs, handle empty problems (no
// queries, or no keys: every row fully masked -> out 0, lse -inf) without calling a kernel,
// run the kernel, wrap the buffers into an AttentionOutput. A problem whose q is on the device
// always reaches the kernel (the gpu backend makes the device output; its shaders never multiply
// a weight of 0 by v, so they need no guard).
//
// The non-finite guard: fast kernels multiply every processed key's weight by its value, so a
// masked key (weight 0) whose v holds NaN or inf would leak 0 x inf = NaN into rows that never
// see it. That can only show as a non-finite output, so after the kernel the output is scanned
// (one pass over out, cheap next to the kernel); only when it holds a NaN / inf and v does too is
// the call run again with guard_nonfinite_v, where kernels skip weight-0 keys. Finite inputs
// never pay for the second run.
#pragma once

#include <limits>

#include "attnops/ext/problem.h"
#include "attnops/options.h"

namespace attnops {

template <class Kernel>
AttentionOutput run_forward(const AttentionProblem& p, Kernel&& kernel) {
  AttentionBuffers buffers = allocate_buffers(p);
  if (p.q.on_device()) {
    kernel(p, buffers);  // the gpu kernel allocates the device output, empty problems included
  } else if (p.B > 0 && p.Tq > 0 && p.Hq > 0) {
    if (p.Tk > 0) {
      kernel(p, buffers);
      if (!p.guard_nonfinite_v && !p.v.on_device() && !all_finite(buffers.out) && !all_finite(p.v)) {
        AttentionProblem guarded = p;  // views and shared storage: a cheap copy
        guarded.guard_nonfinite_v = true;
        buffers = allocate_buffers(guarded);
        kernel(guarded, buffers);
      }
    } else if (buffers.lse) {
      float* lse = buffers.lse->data_as<float>();
      for (std::int64_t i = 0; i < buffers.lse->numel(); ++i)
        lse[i] = -std::numeric_limits<float>::infinity();
    }
  }
  AttentionOutput out;
  out.out = std::move(buffers.out);
  out.lse = std::move(buffers.lse);
  out.attention_weights = std::move(buffers.weights);
  out.device_out = std::move(buffers.device_out);
  out.decision.run = std::move(buffers.run);
  return out;
}

}  // namespace attnops
