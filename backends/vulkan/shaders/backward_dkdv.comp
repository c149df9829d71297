#version 450
// Backward, pass 2: dk, dv and dbias. One invocation owns one key j of one (batch, kv head); a
// workgroup one kv block: gl_WorkGroupID = (kv block, kv head, batch). The key's k, v and its dk,
// dv accumulators are private; for every q head of the GQA group (the GQA sum is this loop) and
// every tile of the kv block's column of the map (increasing q block), for each visible row i it
// recomputes P from lz, dP = dout_i . v_j, dS, and adds P dout_i to dv and dS q_i to dk.
//
// dbias (i, j) of one (bias batch, bias head) is accumulated by the invocation owning key j in a
// fixed order. When the bias was broadcast over batches or kv heads (loop_b / loop_h), one
// invocation walks all of them in order (the dispatch then has 1 group along that axis), so the
// sum never crosses invocations. No shared memory, no barriers, no atomics.
#include "backward_common.glsl"

layout(std430, set = 0, binding = 11) writeonly buffer DkBuf { float dk_f32[]; };
layout(std430, set = 0, binding = 12) writeonly buffer DvBuf { float dv_f32[]; };
layout(std430, set = 0, binding = 13) buffer DbiasBuf { float dbias_f32[]; };  // zero-filled

float kv[DMAX];   // k_j
float vv[DMAX];   // v_j
float dkv[DMAX];  // sum_i dS_ij q_i
float dvv[DMAX];  // sum_i P_ij dout_i

DEFINE_FILL(fill_k, kv, pc.D, load_k)
DEFINE_FILL(fill_v, vv, pc.Dv, load_v)
DEFINE_ROW_OPS(k, kv, q_vec, pc.D, load_q)     // dot_k: k_j . q_i
DEFINE_ROW_OPS(v, vv, g_vec, pc.Dv, load_g)    // dot_v: v_j . dout_i
DEFINE_ROW_OPS(dk, dkv, q_vec, pc.D, load_q)   // axpy_dk: dk += w q_i
DEFINE_ROW_OPS(dv, dvv, g_vec, pc.Dv, load_g)  // axpy_dv: dv += w dout_i

// Bit r set: local row r (< nr) of tile `e` sees key j (local column c) under the static mask
// and the segments.
uint column_visibility(uint e, int i0, int nr, int j, int c, int b, int seg_j) {
  const uvec2 ent = map_entries[e];
  uint vis;
  if ((ent.x & 1u) != 0u) {
    vis = low_bits(nr);
  } else if (has(FLAG_PARAM_MASK)) {
    vis = 0u;
    for (int r = 0; r < nr; ++r) {
      int lo, hi;
      param_interval(i0 + r, lo, hi);
      if (lo <= j && j < hi) vis |= 1u << uint(r);
    }
  } else {
    vis = map_bits[(ent.y * uint(TILE) + uint(c)) * uint(pc.words)] & low_bits(nr);
  }
  if (has(FLAG_SEGMENTS) && vis != 0u)
    for (int r = 0; r < nr; ++r)
      if (((vis >> uint(r)) & 1u) != 0u && seg_q[b * pc.Tq + i0 + r] != seg_j) vis &= ~(1u << uint(r));
  return vis;
}

void main() {
  const int kb = int(gl_WorkGroupID.x);
  const int c = int(gl_LocalInvocationID.x);
  const int j = kb * TILE + c;
  if (j >= pc.Tk) return;  // no barriers below
  const int G = pc.Hq / pc.Hkv;
  const int b0 = pc.loop_b != 0 ? 0 : int(gl_WorkGroupID.z), b1 = pc.loop_b != 0 ? pc.B : b0 + 1;
  const int k0 = pc.loop_h != 0 ? 0 : int(gl_WorkGroupID.y), k1 = pc.loop_h != 0 ? pc.Hkv : k0 + 1;
  const uint doff = delta_offset();

  for (int b = b0; b < b1; ++b) {
    const int seg_j = has(FLAG_SEGMENTS) ? seg_kv[b * pc.Tk + j] : 0;
    for (int hk = k0; hk < k1; ++hk) {
      const uint kbase = k_row(b, j, hk), vbase = v_row(b, j, hk);
      fill_k(kbase);
      fill_v(vbase);
      for (int d = 0; d < pc.D; ++d) dkv[d] = 0.0;
      for (int d = 0; d < pc.Dv; ++d) dvv[d] = 0.0;
      for (int gi = 0; gi < G; ++gi) {
        const int h = hk * G + gi;
        const int hh = pc.map_heads > 1 ? h : 0;
        const uint e0 = map_start[hh * pc.nk + kb], e1 = map_start[hh * pc.nk + kb + 1];
        // Row (i0, j) of this head's dbias.
        const int bb = pc.bias_B == 1 ? 0 : b, hb = pc.bias_H == 1 ? 0 : h;
        const uint dbias_head = uint((bb * pc.bias_H + hb) * pc.Tq) * uint(pc.Tk);
        for (uint e = e0; e < e1; ++e) {
          const int i0 = int(map_entries[e].x >> 1) * TILE;
          const int nr = min(TILE, pc.Tq - i0);
          uint vis = column_visibility(e, i0, nr, j, c, b, seg_j);
          if (has(FLAG_VEC)) {
            // Four rows at a time (as the dq pass's keys).
            for (int r0 = 0; r0 < nr; r0 += 4) {
              const uint g = (vis >> uint(r0)) & 15u;
              if (g == 0u) continue;
              const ivec4 i4 = i0 + min(ivec4(r0, r0 + 1, r0 + 2, r0 + 3), ivec4(nr - 1));
              const uvec4 qb = uvec4(((b * pc.Tq + i4) * pc.Hq + h) * pc.D);
              const uvec4 gb = uvec4(((b * pc.Tq + i4) * pc.Hq + h) * pc.Dv);
              const vec4 dots = dot4_k(qb), dp = dot4_v(gb);
              vec4 p = vec4(0.0), ds = vec4(0.0);
              uint live = 0u;  // visible, not fully masked, a logit above -inf
              for (int t = 0; t < 4; ++t) {
                if (((g >> uint(t)) & 1u) == 0u) continue;
                const int i = i0 + r0 + t;
                const uint st = stat_index(b, h, i);
                const float lz = stats[st];
                if (is_pos_inf_bits(lz)) continue;  // a fully masked row: nothing
                float th;
                const float x = logit(dots[t], b, h, i, j, th);
                if (is_neg_inf_bits(x)) continue;  // a -inf logit masks the pair
                live |= 1u << uint(t);
                p[t] = exp(x - lz);
                ds[t] = p[t] * (dp[t] - stats[doff + st]);
                if (has(FLAG_BIAS)) dbias_f32[dbias_head + uint(i * pc.Tk + j)] += ds[t];
                if (has(FLAG_SOFT_CAP)) ds[t] *= 1.0 - th * th;
              }
              if (live != 0u) {
                axpy4_dv(p, gb, live);
                axpy4_dk(ds, qb, live);
              }
            }
          } else {
            while (vis != 0u) {
              const int r = findLSB(vis);
              vis &= vis - 1u;
              const int i = i0 + r;
              const uint st = stat_index(b, h, i);
              const float lz = stats[st];
              if (is_pos_inf_bits(lz)) continue;  // a fully masked row: nothing
              const uint qbase = q_row(b, i, h), gbase = g_row(b, i, h);
              float th;
              const float x = logit(dot_k(qbase), b, h, i, j, th);
              if (is_neg_inf_bits(x)) continue;  // a -inf logit masks the pair
              const float p = exp(x - lz);
              float ds = p * (dot_v(gbase) - stats[doff + st]);
              if (has(FLAG_BIAS)) dbias_f32[dbias_head + uint(i * pc.Tk + j)] += ds;
              if (has(FLAG_SOFT_CAP)) ds *= 1.0 - th * th;
              axpy_dv(p, gbase);
              axpy_dk(ds, qbase);
            }
          }
        }
      }
      for (int d = 0; d < pc.D; ++d) dk_f32[kbase + uint(d)] = dkv[d] * pc.scale;
      for (int d = 0; d < pc.Dv; ++d) dv_f32[vbase + uint(d)] = dvv[d];
    }
  }
}
