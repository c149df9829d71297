#version 450
// Split-KV merge (the second pass of flash-decoding): the partials (o_s unnormalised, m_s, l_s)
// of the nsplit chunks of one row, in scratch [B, Hq, Tq, nsplit, Dv + 2], combine by
// log-sum-exp:
//   m = max_s m_s,  l = sum_s l_s e^(m_s - m),  out = sum_s o_s e^(m_s - m) / (l + e^(sink - m)),
//   lse = m + log l (over the visible keys; the sink is not included).
// A row with l == 0 (every key masked or -inf in every chunk) gives out 0 and lse -inf; a chunk
// that saw a NaN or +inf logit (l NaN) makes the row NaN. One workgroup per row: gl_WorkGroupID = (i, h, b).
#extension GL_GOOGLE_include_directive : require
#include "attn_io.glsl"

layout(local_size_x_id = 0) in;

void main() {
  const int i = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const uint row = uint((b * pc.Hq + h) * pc.Tq + i);
  const uint stride = uint(pc.Dv + 2);
  const uint base = row * uint(pc.nsplit) * stride;
  // Every invocation computes m and l itself (nsplit is small): no shared memory, no barrier.
  // A chunk's m is finite (NEG_BIG when it saw nothing); its l is NaN when it saw a NaN or +inf
  // logit, which poisons the row.
  float m = NEG_BIG;
  bool poisoned = false;
  for (int s = 0; s < pc.nsplit; ++s) {
    const uint at = base + uint(s) * stride + uint(pc.Dv);
    m = max(m, scratch[at]);
    poisoned = poisoned || is_nan_bits(scratch[at + 1u]);
  }
  float l = 0.0;
  for (int s = 0; s < pc.nsplit; ++s) {
    const uint at = base + uint(s) * stride + uint(pc.Dv);
    if (!is_nan_bits(scratch[at + 1u])) l += scratch[at + 1u] * exp(scratch[at] - m);
  }
  if (gl_LocalInvocationIndex == 0u && has(FLAG_LSE)) lse_u32[row] = row_lse_bits(m, l, poisoned);
  const float factor = row_factor(m, l, h);
  const bool out_nan = poisoned || (l != 0.0 && sink_poisons(h));
  const uint obase = uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv);
  for (int d = int(gl_LocalInvocationIndex); d < pc.Dv; d += int(gl_WorkGroupSize.x)) {
    float acc = 0.0;
    for (int s = 0; s < pc.nsplit; ++s) {
      const uint at = base + uint(s) * stride;
      // A chunk that saw nothing has o = 0 and l = 0: weight exp(NEG_BIG - m) or 1, o adds 0.
      acc += scratch[at + uint(d)] * exp(scratch[at + uint(pc.Dv)] - m);
    }
    out_u32[obase + uint(d)] = out_bits(acc, factor, out_nan);
  }
}
