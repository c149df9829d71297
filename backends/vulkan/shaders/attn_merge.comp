#version 450
// Split-KV merge (the second pass of flash-decoding): the partials (o_s unnormalised, m_s, l_s)
// of the nsplit chunks of one row, in scratch [B, Hq, Tq, nsplit, Dv + 2], combine by
// log-sum-exp:
//   m = max_s m_s,  l = sum_s l_s e^(m_s - m),  out = sum_s o_s e^(m_s - m) / (l + e^(sink - m)),
//   lse = m + log l (over the visible keys; the sink is not included).
// A row with l == 0 (every key masked or -inf in every chunk) gives out 0 and lse -inf; NaN in
// any chunk makes l NaN and propagates. One workgroup per row: gl_WorkGroupID = (i, h, b).
#extension GL_GOOGLE_include_directive : require
#include "attn_io.glsl"

layout(local_size_x_id = 0) in;

void main() {
  const int i = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const uint row = uint((b * pc.Hq + h) * pc.Tq + i);
  const uint stride = uint(pc.Dv + 2);
  const uint base = row * uint(pc.nsplit) * stride;
  // Every invocation computes m and l itself (nsplit is small): no shared memory, no barrier.
  float m = NEG_BIG;
  for (int s = 0; s < pc.nsplit; ++s) m = max(m, scratch[base + uint(s) * stride + uint(pc.Dv)]);
  float l = 0.0;
  for (int s = 0; s < pc.nsplit; ++s) {
    const uint at = base + uint(s) * stride + uint(pc.Dv);
    l += scratch[at + 1u] * exp(scratch[at] - m);
  }
  const bool masked = l == 0.0;
  if (gl_LocalInvocationIndex == 0u && has(FLAG_LSE)) lse_f32[row] = masked ? NEG_INF : m + log(l);
  float denom = l;
  if (has(FLAG_SINKS)) denom += exp(sinks_f32[h] - m);
  const uint obase = uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv);
  for (int d = int(gl_LocalInvocationIndex); d < pc.Dv; d += int(gl_WorkGroupSize.x)) {
    float acc = 0.0;
    for (int s = 0; s < pc.nsplit; ++s) {
      const uint at = base + uint(s) * stride;
      const float w = exp(scratch[at + uint(pc.Dv)] - m);
      // A chunk that saw nothing has o = 0 and weight 0 (or 1 when no chunk saw anything).
      acc += scratch[at + uint(d)] * w;
    }
    out_f32[obase + uint(d)] = masked ? 0.0 : acc / denom;
  }
}
