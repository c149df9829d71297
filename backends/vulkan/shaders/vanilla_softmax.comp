#version 450
// Vanilla, pass 2 of 3: the exact softmax of one row of scratch [B, Hq, Tq, Tk] in place, which
// leaves the probabilities (= the weights) there, and the row's lse. Masked keys hold -inf and
// get weight 0; a row whose keys are all masked or -inf gets weights 0 and lse -inf; a sink adds
// mass without value: p_j = e^(s_j - m) / (sum_j e^(s_j - m) + e^(sink - m)). NaN propagates.
// One workgroup per row: gl_WorkGroupID = (i, h, b); the max and the sum are reduced through
// shared memory.
#extension GL_GOOGLE_include_directive : require
#include "attn_io.glsl"

layout(local_size_x = 64) in;
shared float red[64];

// The workgroup's reduction of x (max when take_max, else sum); every invocation gets it.
float reduce(float x, bool take_max) {
  const uint t = gl_LocalInvocationIndex;
  red[t] = x;
  barrier();
  for (uint s = 32u; s > 0u; s >>= 1) {
    if (t < s) red[t] = take_max ? max(red[t], red[t + s]) : red[t] + red[t + s];
    barrier();
  }
  const float r = red[0];
  barrier();  // red is reused by the next reduction
  return r;
}

void main() {
  const int i = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const uint row = uint((b * pc.Hq + h) * pc.Tq + i);
  const uint srow = row * uint(pc.Tk);
  const int t = int(gl_LocalInvocationIndex);
  float m = NEG_BIG;
  for (int j = t; j < pc.Tk; j += 64) m = max(m, scratch[srow + uint(j)]);
  m = reduce(m, true);
  float l = 0.0;
  for (int j = t; j < pc.Tk; j += 64) l += exp(scratch[srow + uint(j)] - m);
  l = reduce(l, false);
  const bool masked = l == 0.0;
  if (t == 0 && has(FLAG_LSE)) lse_f32[row] = masked ? NEG_INF : m + log(l);
  float denom = l;
  if (has(FLAG_SINKS)) denom += exp(sinks_f32[h] - m);
  for (int j = t; j < pc.Tk; j += 64) {
    const uint at = srow + uint(j);
    scratch[at] = masked ? 0.0 : exp(scratch[at] - m) / denom;
  }
}
