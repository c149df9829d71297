#version 450
// Backward, pass 3 (with sinks only): dsinks_h = -sum over the rows (b, i) of head h of
// exp(sink_h - lz) Delta. One workgroup per head: invocation t sums rows t, t + N, t + 2N, ...
// in order, then a fixed tree in shared memory adds the N partial sums: the same order on every
// run (no atomics).
#include "backward_common.glsl"

layout(std430, set = 0, binding = 11) readonly buffer SinkBuf { float sinks_f32[]; };
layout(std430, set = 0, binding = 12) writeonly buffer DsinksBuf { float dsinks_f32[]; };

const int N = 64;  // invocations per workgroup (the host dispatches with local size 64)
shared float partial[N];

void main() {
  const int h = int(gl_WorkGroupID.x);
  const int t = int(gl_LocalInvocationID.x);
  const float a = sinks_f32[h];
  const uint doff = delta_offset();
  float sum = 0.0;
  for (int n = t; n < pc.B * pc.Tq; n += N) {
    const int b = n / pc.Tq, i = n - b * pc.Tq;
    const uint st = stat_index(b, h, i);
    const float lz = stats[st];
    if (!is_pos_inf_bits(lz)) sum += exp(a - lz) * stats[doff + st];  // fully masked rows add nothing
  }
  partial[t] = sum;
  barrier();
  for (int s = N / 2; s > 0; s >>= 1) {
    if (t < s) partial[t] += partial[t + s];
    barrier();
  }
  if (t == 0) dsinks_f32[h] = -partial[0];
}
