#version 450
// Backward, pass 1: the row statistics (lz, Delta) and dq. One invocation owns one query row
// (b, h, i), a workgroup one q block: gl_WorkGroupID = (q block, q head, batch), as the forward.
// The row's q, dout and dq accumulator are private; for every visible key of the row's tiles it
// recomputes P from lz, dP = dout . v, dS, and adds dS k to dq. No shared memory, no barriers.
#include "backward_common.glsl"

layout(std430, set = 0, binding = 11) readonly buffer OutBuf { uvec4 o_vec[]; };  // the forward's out
layout(std430, set = 0, binding = 12) readonly buffer LseBuf { float lse_f32[]; };
layout(std430, set = 0, binding = 13) readonly buffer SinkBuf { float sinks_f32[]; };
layout(std430, set = 0, binding = 14) writeonly buffer DqBuf { float dq_f32[]; };

float qv[DMAX];   // q_i
float gv[DMAX];   // dout_i
float acc[DMAX];  // sum_j dS_ij k_j

DEFINE_LOAD(load_o, o_vec)
DEFINE_FILL(fill_q, qv, pc.D, load_q)
DEFINE_FILL(fill_g, gv, pc.Dv, load_g)
DEFINE_ROW_OPS(q, qv, k_vec, pc.D, load_k)     // dot_q: q_i . k_j
DEFINE_ROW_OPS(g, gv, v_vec, pc.Dv, load_v)    // dot_g: dout_i . v_j
DEFINE_ROW_OPS(acc, acc, k_vec, pc.D, load_k)  // axpy_acc: acc += w k_j

// Bit t set: key j0 + t (t < nj) of tile `e` is visible to local row r (static mask, segments).
uint row_visibility(uint e, int r, int j0, int nj, int lo, int hi, int b, int seg_i) {
  const uvec2 ent = map_entries[e];
  uint vis;
  if ((ent.x & 1u) != 0u) {
    vis = low_bits(nj);
  } else if (has(FLAG_PARAM_MASK)) {
    const int a = clamp(lo - j0, 0, nj), c = clamp(hi - j0, 0, nj);
    vis = low_bits(c) & ~low_bits(a);
  } else {
    vis = map_bits[(ent.y * uint(TILE) + uint(r)) * uint(pc.words)] & low_bits(nj);
  }
  if (has(FLAG_SEGMENTS) && vis != 0u)
    for (int t = 0; t < nj; ++t)
      if (((vis >> uint(t)) & 1u) != 0u && seg_kv[b * pc.Tk + j0 + t] != seg_i) vis &= ~(1u << uint(t));
  return vis;
}

void main() {
  const int qb = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int r = int(gl_LocalInvocationID.x);
  const int i = qb * TILE + r;
  if (i >= pc.Tq) return;  // no barriers below
  const int hk = h / (pc.Hq / pc.Hkv);  // GQA: q head h reads kv head h / group

  // Row statistics: lz (the log of the denominator, sink included) and Delta = dout_i . out_i.
  const uint st = stat_index(b, h, i);
  const float lse = lse_f32[st];
  const uint gbase = g_row(b, i, h);
  // A fully masked row, or one whose +inf sink takes all the mass (output 0 whatever q, k, v):
  // zero gradients, nothing to dk, dv or dsinks (lz = +inf marks it for the other passes).
  const bool empty = is_neg_inf_bits(lse) || (has(FLAG_SINKS) && is_pos_inf_bits(sinks_f32[h]));
  float lz = POS_INF, delta = 0.0;
  if (!empty) {
    for (int d = 0; d < pc.Dv; ++d) delta += load_g(gbase + uint(d)) * load_o(gbase + uint(d));
    lz = lse;
    if (has(FLAG_SINKS)) {
      const float a = sinks_f32[h], m = max(lse, a);
      lz = m + log(exp(lse - m) + exp(a - m));
    }
  }
  stats[st] = lz;
  stats[delta_offset() + st] = delta;

  const uint dqbase = q_row(b, i, h);
  for (int d = 0; d < pc.D; ++d) acc[d] = 0.0;
  if (!empty) {
    fill_q(q_row(b, i, h));
    fill_g(gbase);
    int lo = 0, hi = pc.Tk;
    if (has(FLAG_PARAM_MASK)) param_interval(i, lo, hi);
    const int seg_i = has(FLAG_SEGMENTS) ? seg_q[b * pc.Tq + i] : 0;
    const int hh = pc.map_heads > 1 ? h : 0;
    const uint e0 = map_start[hh * pc.nq + qb], e1 = map_start[hh * pc.nq + qb + 1];
    for (uint e = e0; e < e1; ++e) {
      const int j0 = int(map_entries[e].x >> 1) * TILE;
      const int nj = min(TILE, pc.Tk - j0);
      uint vis = row_visibility(e, r, j0, nj, lo, hi, b, seg_i);
      if (has(FLAG_VEC)) {
        // Four keys at a time (a group with no visible key is skipped; keys past the tile's
        // end read the last key, and like masked keys they are left out of the sum).
        for (int t0 = 0; t0 < nj; t0 += 4) {
          const uint g = (vis >> uint(t0)) & 15u;
          if (g == 0u) continue;
          const ivec4 j4 = j0 + min(ivec4(t0, t0 + 1, t0 + 2, t0 + 3), ivec4(nj - 1));
          const uvec4 kb = uvec4(((b * pc.Tk + j4) * pc.Hkv + hk) * pc.D);
          const vec4 dots = dot4_q(kb);
          const vec4 dp = dot4_g(uvec4(((b * pc.Tk + j4) * pc.Hkv + hk) * pc.Dv));
          vec4 ds = vec4(0.0);
          uint live = 0u;  // visible and a logit above -inf
          for (int c = 0; c < 4; ++c)
            if (((g >> uint(c)) & 1u) != 0u) {
              float th;
              const float x = logit(dots[c], b, h, i, j0 + t0 + c, th);
              if (is_neg_inf_bits(x)) continue;  // a -inf logit masks the pair
              live |= 1u << uint(c);
              ds[c] = exp(x - lz) * (dp[c] - delta);
              if (has(FLAG_SOFT_CAP)) ds[c] *= 1.0 - th * th;
            }
          if (live != 0u) axpy4_acc(ds, kb, live);
        }
      } else {
        while (vis != 0u) {
          const int t = findLSB(vis);
          vis &= vis - 1u;
          const int j = j0 + t;
          const uint kbase = k_row(b, j, hk);
          float th;
          const float x = logit(dot_q(kbase), b, h, i, j, th);
          if (is_neg_inf_bits(x)) continue;  // a -inf logit masks the pair
          float ds = exp(x - lz) * (dot_g(v_row(b, j, hk)) - delta);
          if (has(FLAG_SOFT_CAP)) ds *= 1.0 - th * th;
          axpy_acc(ds, kbase);
        }
      }
    }
  }
  for (int d = 0; d < pc.D; ++d) dq_f32[dqbase + uint(d)] = acc[d] * pc.scale;
}
