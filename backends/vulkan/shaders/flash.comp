#version 450
// Flash / blocksparse attention: one pass over the non-empty kv tiles of the row's q block
// with an online softmax (running max m, running sum l, unnormalised accumulator acc),
// rescaled once per kv tile. Empty tiles are never listed; full tiles evaluate no static mask.
#include "common.glsl"

void main() {
  const int qb = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int r = int(gl_LocalInvocationID.x);
  const int i = qb * int(gl_WorkGroupSize.x) + r;
  if (i >= pc.Tq) return;  // no barriers below, so idle rows may leave early
  const int hk = h / (pc.Hq / pc.Hkv);  // GQA: q head h reads kv head h / group

  const uint qbase = pc.q_off + uint(b) * pc.q_sb + uint(i) * pc.q_st + uint(h * HEAD_D);
  for (int d = 0; d < HEAD_D; ++d) qv[d] = load_q(qbase + uint(d));
  for (int d = 0; d < HEAD_DV; ++d) acc[d] = 0.0;

  int lo = 0, hi = pc.Tk;
  if (has(FLAG_PARAM_MASK)) param_interval(i, lo, hi);
  const int seg_i = has(FLAG_SEGMENTS) ? seg_q[b * pc.Tq + i] : 0;

  float m = NEG_BIG, l = 0.0;
  bool seen = false, poisoned = false;  // poisoned: a NaN or +inf logit (the row is NaN)
  float s[BK];
  const int hh = pc.map_heads > 1 ? h : 0;
  const uint e0 = row_start[hh * pc.nq + qb], e1 = row_start[hh * pc.nq + qb + 1];
  for (uint e = e0; e < e1; ++e) {
    const int j0 = int(entries[e] >> 1) * BK;
    const int nj = min(BK, pc.Tk - j0);
    const uint krow0 = pc.k_off + uint(b) * pc.k_sb + uint(j0) * pc.k_st + uint(hk * HEAD_D);  // k row of key j0
    const uint kstride = pc.k_st;  // between keys
    const uint vis = tile_visibility(e, r, j0, nj, lo, hi, b, seg_i);
    if (vis == 0u) continue;
    float bm = NEG_BIG;
    uint live = 0u;  // visible keys of a finite logit (attn_io.glsl's logit_class)
    if (has(FLAG_VEC)) {
      for (int t0 = 0; t0 < nj; t0 += 4) {
        const uint g = (vis >> uint(t0)) & 15u;
        if (g == 0u) continue;
        // Keys past the tile's end read the last key instead (finite values, result unused).
        const uvec4 t4 = uvec4(min(ivec4(t0, t0 + 1, t0 + 2, t0 + 3), ivec4(nj - 1)));
        const vec4 dots = dot_qk4(krow0 + t4 * kstride);
        for (int c = 0; c < 4; ++c)
          if (((g >> uint(c)) & 1u) != 0u) {
            const float x = logit(dots[c], b, h, i, j0 + t0 + c);
            const uint cls = logit_class(x);
            poisoned = poisoned || cls == LOGIT_POISON;
            if (cls != LOGIT_LIVE) continue;
            live |= 1u << uint(t0 + c);
            s[t0 + c] = x;
            bm = max(bm, x);
          }
      }
    } else {
      for (int t = 0; t < nj; ++t)
        if (((vis >> uint(t)) & 1u) != 0u) {
          const float x = logit(dot_qk(krow0 + uint(t) * kstride), b, h, i, j0 + t);
          const uint cls = logit_class(x);
          poisoned = poisoned || cls == LOGIT_POISON;
          if (cls != LOGIT_LIVE) continue;
          live |= 1u << uint(t);
          s[t] = x;
          bm = max(bm, x);
        }
    }
    if (live == 0u) continue;  // nothing this tile adds
    const float m_new = max(m, bm);
    const float alpha = seen ? exp(m - m_new) : 0.0;
    seen = true;
    m = m_new;
    l *= alpha;
    for (int t = 0; t < nj; ++t) {
      s[t] = ((live >> uint(t)) & 1u) != 0u ? exp(s[t] - m) : 0.0;
      l += s[t];
    }
    if (alpha != 1.0)
      for (int d = 0; d < HEAD_DV; ++d) acc[d] *= alpha;
    const uint vrow0 = pc.v_off + uint(b) * pc.v_sb + uint(j0) * pc.v_st + uint(hk * HEAD_DV);
    const uint vstride = pc.v_st;
    if (has(FLAG_VEC)) {
      for (int t0 = 0; t0 < nj; t0 += 4) {
        if (((live >> uint(t0)) & 15u) == 0u) continue;
        const ivec4 t4 = ivec4(t0, t0 + 1, t0 + 2, t0 + 3);
        const vec4 p = vec4(t4.x < nj ? s[t4.x] : 0.0, t4.y < nj ? s[t4.y] : 0.0, t4.z < nj ? s[t4.z] : 0.0,
                            t4.w < nj ? s[t4.w] : 0.0);
        add_weighted_v4(p, vrow0 + uvec4(min(t4, ivec4(nj - 1))) * vstride);
      }
    } else {
      for (int t = 0; t < nj; ++t)
        if ((floatBitsToUint(s[t]) << 1) != 0u) add_weighted_v(s[t], vrow0 + uint(t) * vstride);  // weight 0: nothing
    }
  }

  const uint obase = uint(((b * pc.Tq + i) * pc.Hq + h) * HEAD_DV);
  const uint lse_at = uint((b * pc.Hq + h) * pc.Tq + i);
  // attn_io.glsl's row end: a fully masked row (every key masked or of logit -inf) gives 0 and
  // -inf, a poisoned row (a NaN or +inf logit) NaN; lse is over the visible keys only; a sink adds
  // probability mass without value.
  if (has(FLAG_LSE)) lse_u32[lse_at] = row_lse_bits(m, l, poisoned);
  const float factor = row_factor(m, l, h);
  const bool out_nan = poisoned || (l != 0.0 && sink_poisons(h));
  for (int d = 0; d < HEAD_DV; ++d) out_u32[obase + uint(d)] = out_bits(acc[d], factor, out_nan);
}
