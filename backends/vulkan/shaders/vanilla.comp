#version 450
// Vanilla attention: the row's scores are materialised in `scratch` ([B, Hq, Tq, Tk] f32, which
// is the weights output when the caller asked for weights), then an exact two-pass softmax
// (max, then sum) and the weighted sum of v. Only the row's non-empty kv tiles are visited;
// the host zero-fills scratch, so skipped and masked entries read back as weight 0.
#include "common.glsl"

void main() {
  const int qb = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int r = int(gl_LocalInvocationID.x);
  const int i = qb * int(gl_WorkGroupSize.x) + r;
  if (i >= pc.Tq) return;
  const int hk = h / (pc.Hq / pc.Hkv);

  const uint qbase = pc.q_off + uint(b) * pc.q_sb + uint(i) * pc.q_st + uint(h * HEAD_D);
  for (int d = 0; d < HEAD_D; ++d) qv[d] = load_q(qbase + uint(d));

  int lo = 0, hi = pc.Tk;
  if (has(FLAG_PARAM_MASK)) param_interval(i, lo, hi);
  const int seg_i = has(FLAG_SEGMENTS) ? seg_q[b * pc.Tq + i] : 0;
  const uint srow = uint(((b * pc.Hq + h) * pc.Tq + i) * pc.Tk);
  const int hh = pc.map_heads > 1 ? h : 0;
  const uint e0 = row_start[hh * pc.nq + qb], e1 = row_start[hh * pc.nq + qb + 1];

  // Pass 1: scores of the visible keys, and their max. Masked keys keep NEG_BIG in scratch.
  float m = NEG_BIG;
  bool any = false;
  for (uint e = e0; e < e1; ++e) {
    const int j0 = int(entries[e] >> 1) * BK;
    const int nj = min(BK, pc.Tk - j0);
    const uint vis = tile_visibility(e, r, j0, nj, lo, hi, b, seg_i);
    const uint krow0 = pc.k_off + uint(b) * pc.k_sb + uint(j0) * pc.k_st + uint(hk * HEAD_D), kstride = pc.k_st;
    for (int t = 0; t < nj; ++t)
      if (((vis >> uint(t)) & 1u) == 0u) scratch[srow + uint(j0 + t)] = NEG_BIG;
    if (vis == 0u) continue;
    any = true;
    if (has(FLAG_VEC)) {  // four keys at a time, as flash.comp
      for (int t0 = 0; t0 < nj; t0 += 4) {
        const uint g = (vis >> uint(t0)) & 15u;
        if (g == 0u) continue;
        const vec4 dots = dot_qk4(krow0 + uvec4(min(ivec4(t0, t0 + 1, t0 + 2, t0 + 3), ivec4(nj - 1))) * kstride);
        for (int c = 0; c < 4; ++c)
          if (((g >> uint(c)) & 1u) != 0u) {
            const float sj = logit(dots[c], b, h, i, j0 + t0 + c);
            scratch[srow + uint(j0 + t0 + c)] = sj;
            m = max(m, sj);
          }
      }
    } else {
      for (int t = 0; t < nj; ++t)
        if (((vis >> uint(t)) & 1u) != 0u) {
          const float sj = logit(dot_qk(krow0 + uint(t) * kstride), b, h, i, j0 + t);
          scratch[srow + uint(j0 + t)] = sj;
          m = max(m, sj);
        }
    }
  }

  const uint obase = uint(((b * pc.Tq + i) * pc.Hq + h) * HEAD_DV);
  const uint lse_at = uint((b * pc.Hq + h) * pc.Tq + i);
  // Pass 2: the sum of exp over the visible keys (masked ones hold NEG_BIG: exp gives 0).
  float l = 0.0;
  if (any) {
    for (uint e = e0; e < e1; ++e) {
      const int j0 = int(entries[e] >> 1) * BK;
      const int nj = min(BK, pc.Tk - j0);
      for (int t = 0; t < nj; ++t) {
        const float sj = scratch[srow + uint(j0 + t)];
        if (sj != NEG_BIG) l += exp(sj - m);
      }
    }
  }
  // Fully masked row (every key masked or of logit -inf): weights 0, out 0, lse -inf. A NaN l
  // (a NaN or +inf logit) runs on and makes the row NaN, as the non-finite policy says.
  if (!any || l == 0.0) {
    for (uint e = e0; e < e1; ++e) {
      const int j0 = int(entries[e] >> 1) * BK;
      const int nj = min(BK, pc.Tk - j0);
      for (int t = 0; t < nj; ++t) scratch[srow + uint(j0 + t)] = 0.0;
    }
    if (has(FLAG_LSE)) lse_f32[lse_at] = uintBitsToFloat(0xff800000u);
    for (int d = 0; d < HEAD_DV; ++d) out_f32[obase + uint(d)] = 0.0;
    return;
  }
  if (has(FLAG_LSE)) lse_f32[lse_at] = m + log(l);
  float denom = l;  // a sink takes probability mass without contributing value
  if (has(FLAG_SINKS)) denom += exp(sinks_f32[h] - m);

  // Pass 3: probabilities (written back as the weights) and the weighted sum of v.
  for (int d = 0; d < HEAD_DV; ++d) acc[d] = 0.0;
  for (uint e = e0; e < e1; ++e) {
    const int j0 = int(entries[e] >> 1) * BK;
    const int nj = min(BK, pc.Tk - j0);
    const uint vrow0 = pc.v_off + uint(b) * pc.v_sb + uint(j0) * pc.v_st + uint(hk * HEAD_DV), vstride = pc.v_st;
    for (int t0 = 0; t0 < nj; t0 += 4) {
      vec4 w = vec4(0.0);
      for (int c = 0; c < 4 && t0 + c < nj; ++c) {
        const uint at = srow + uint(j0 + t0 + c);
        const float sj = scratch[at];
        w[c] = sj != NEG_BIG ? exp(sj - m) / denom : 0.0;
        scratch[at] = w[c];
      }
      if (w == vec4(0.0)) continue;
      if (has(FLAG_VEC)) {
        add_weighted_v4(w, vrow0 + uvec4(min(ivec4(t0, t0 + 1, t0 + 2, t0 + 3), ivec4(nj - 1))) * vstride);
      } else {
        for (int c = 0; c < 4 && t0 + c < nj; ++c)
          if (w[c] != 0.0) add_weighted_v(w[c], vrow0 + uint(t0 + c) * vstride);
      }
    }
  }
  for (int d = 0; d < HEAD_DV; ++d) out_f32[obase + uint(d)] = acc[d];
}
