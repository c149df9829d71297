#version 450
// The paged work list's second pass: one workgroup per (q row, q head) combines the partial
// states (acc_s unnormalised, m_s, l_s) of the row's tasks in task order (key order: fixed, so a
// sequence's result does not depend on the batch) by log-sum-exp:
//   m = max_s m_s,  l = sum_s l_s e^(m_s - m),  out = sum_s acc_s e^(m_s - m) / (l + e^(sink - m)),
//   lse = m + log l (visible keys only; the sink is not included).
// A row with l == 0 (no task, or every key masked / of logit -inf) gives out 0 and lse -inf; a
// NaN anywhere makes l NaN and propagates. A task of weight 0 adds nothing (its acc is never
// multiplied: 0 x inf = NaN).
#extension GL_GOOGLE_include_directive : require
#include "paged_io.glsl"

#define WG 64
layout(local_size_x = WG) in;

void main() {
  const uint n = gl_WorkGroupID.y + gl_WorkGroupID.z * pc.fold;
  if (n >= pc.num_items) return;
  const int h = int(gl_WorkGroupID.x), tid = int(gl_LocalInvocationID.x);
  const ivec2 rt = row_tasks[n];
  const uint stride = uint(pc.Dv + 2);
  // Every invocation computes m and l itself (a row has few tasks): no shared memory, no barrier.
  float m = NEG_BIG;
  for (int s = 0; s < rt.y; ++s) m = max(m, partials[(uint(rt.x + s) * uint(pc.Hq) + uint(h)) * stride + uint(pc.Dv)]);
  float l = 0.0;
  for (int s = 0; s < rt.y; ++s) {
    const uint at = (uint(rt.x + s) * uint(pc.Hq) + uint(h)) * stride + uint(pc.Dv);
    l += partials[at + 1u] * exp(partials[at] - m);
  }
  const bool masked = l == 0.0;
  const uint row = n * uint(pc.Hq) + uint(h);
  if (tid == 0 && has_flag(PFLAG_LSE)) lse_f32[row] = masked ? NEG_INF : m + log(l);
  float denom = l;
  if (has_flag(PFLAG_SINKS)) denom += exp(sinks_f32[h] - m);
  for (int d = tid; d < pc.Dv; d += WG) {
    float acc = 0.0;
    for (int s = 0; s < rt.y; ++s) {
      const uint at = (uint(rt.x + s) * uint(pc.Hq) + uint(h)) * stride;
      const float w = exp(partials[at + uint(pc.Dv)] - m);
      if (w != 0.0) acc += partials[at + uint(d)] * w;
    }
    out_f32[row * uint(pc.Dv) + uint(d)] = masked ? 0.0 : acc / denom;
  }
}
