#version 450
// Vanilla, pass 2 of 3: the exact softmax of one row of scratch [B, Hq, Tq, Tk] in place, which
// leaves the probabilities (= the weights) there, and the row's lse. Masked keys hold -inf and
// get weight 0; a row whose keys are all masked or -inf gets weights 0 and lse -inf; a sink adds
// mass without value: p_j = e^(s_j - m) / (sum_j e^(s_j - m) + e^(sink - m)); a NaN or +inf
// logit makes the row's visible weights, out and lse NaN.
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

// A flag over the workgroup (any invocation's `x`): a max of 0 / 1 through the same reduction.
bool reduce_any(bool x) { return reduce(x ? 1.0 : 0.0, true) > 0.5; }

void main() {
  const int i = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const uint row = uint((b * pc.Hq + h) * pc.Tq + i);
  const uint srow = row * uint(pc.Tk);
  const int t = int(gl_LocalInvocationIndex);
  // Scores are classified by their bits (attn_io.glsl's logit_class): -inf (a mask, or a masked
  // key) weight 0; NaN / +inf poison the row (its visible weights, out and lse NaN); the rest
  // take part in the softmax.
  float m = NEG_BIG;
  bool poisoned = false;
  for (int j = t; j < pc.Tk; j += 64) {
    const float x = scratch[srow + uint(j)];
    const uint cls = logit_class(x);
    poisoned = poisoned || cls == LOGIT_POISON;
    if (cls == LOGIT_LIVE) m = max(m, x);
  }
  m = reduce(m, true);
  poisoned = reduce_any(poisoned);
  float l = 0.0;
  for (int j = t; j < pc.Tk; j += 64) {
    const float x = scratch[srow + uint(j)];
    if (logit_class(x) == LOGIT_LIVE) l += exp(x - m);
  }
  l = reduce(l, false);
  if (t == 0 && has(FLAG_LSE)) lse_u32[row] = row_lse_bits(m, l, poisoned);
  const float factor = row_factor(m, l, h);
  const bool nan_row = poisoned || (l != 0.0 && sink_poisons(h));
  for (int j = t; j < pc.Tk; j += 64) {
    const uint at = srow + uint(j);
    const float x = scratch[at];
    const uint cls = logit_class(x);
    uint w = 0u;
    if (cls != LOGIT_MASKED) w = nan_row ? NAN_BITS : floatBitsToUint(exp(x - m) * factor);
    scratch_u32[at] = w;
  }
}
