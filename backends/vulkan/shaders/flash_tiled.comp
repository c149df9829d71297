#version 450
// Flash / blocksparse attention with subgroup tiles (the "flash_subgroup" variant), also the
// first pass of split-KV decode.
//
// A workgroup owns q_rows query positions x head_rows q heads of one kv head (GQA: those heads
// share every staged K/V tile) of one batch: gl_WorkGroupID = (q block * nsplit + split,
// head block, batch). Its invocations form teams of DS consecutive subgroup lanes; a team
// owns RPT rows, and each lane of the team holds a DS-th of the row's head dimension: vec4
// number lane + DS*k (k < DK4) of q and of the output accumulator, so that S = Q K^T is a
// partial dot product per lane summed with subgroupShuffleXor over the team.
//
// Per non-empty kv tile of the block map (BC keys; empty tiles are never listed): K and V of the
// tile are staged in shared memory as f32 vec4 (head dims padded with zeros to 4*DS*DK4 inside
// the kernel), the static mask applies only to partial tiles (full tiles evaluate none), then,
// KU keys at a time, S is computed for the team's rows, the online softmax (running max m, sum
// l) rescales the accumulator and P V is accumulated in registers. Statistics and accumulators
// are fp32 whatever the storage dtype.
//
// SPLIT = 1 (split-KV): the row's tile list is cut into nsplit contiguous chunks, one per
// workgroup, and each writes its partial (o unnormalised, m, l) to scratch for attn_merge.comp.
//
// Code shape: loads and stores outside the key loop go through small private arrays in loops
// that are not unrolled, so that the shader holds few memory instructions. CPU implementations
// (lavapipe) emit each memory instruction as a loop over the lanes, and LLVM's coroutine pass
// (their workgroups are coroutines) grows with the square of the resulting basic blocks.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "attn_io.glsl"

layout(local_size_x_id = 0) in;                // invocations: (rows / RPT) teams of DS lanes
layout(constant_id = 1) const uint DTYPE = 0u;  // 0 f32, 1 f16, 2 bf16
layout(constant_id = 2) const uint DS = 1u;     // lanes per team (power of two <= subgroup size)
layout(constant_id = 3) const uint RPT = 1u;    // rows per team
layout(constant_id = 4) const uint BC = 32u;    // keys per kv tile (<= 32: one visibility word)
layout(constant_id = 5) const uint DK4 = 16u;   // vec4 of q / k per lane: D <= 4 * DS * DK4
layout(constant_id = 6) const uint DV4 = 16u;   // vec4 of v / out per lane: Dv <= 4 * DS * DV4
layout(constant_id = 7) const uint SPLIT = 0u;  // 1: write split-KV partials
layout(constant_id = 8) const uint KU = 8u;     // keys per online-softmax step (divides BC)
// 1: the workgroup is one subgroup (as many invocations as the subgroup has lanes, all of them
// present): subgroup barriers order the shared-memory tiles.
layout(constant_id = 9) const uint ONE_SUBGROUP = 0u;
layout(constant_id = 10) const uint ALIGNED = 0u;  // 1: as FLAG_ALIGNED4 (rows start at multiples of 4)

const uint KROW = DK4 * DS;  // vec4 per staged key (k) row
const uint VROW = DV4 * DS;  // vec4 per staged value (v) row
shared vec4 ks[BC * KROW];
shared vec4 vs[BC * VROW];

void tile_barrier() {
  if (ONE_SUBGROUP != 0u) {
    subgroupMemoryBarrierShared();
    subgroupBarrier();
  } else {
    barrier();
  }
}

// Elements d .. d+3 of q / k / v (attn_io.glsl's qkv_load4 under this shader's specialization).
vec4 load4(uint which, uint base, int d, int n) { return qkv_load4(which, base, d, n, ALIGNED != 0u, DTYPE); }

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint WG = gl_WorkGroupSize.x;
  // Teams are DS consecutive lanes of one subgroup, numbered by the subgroup's own lane index
  // (Vulkan does not promise that local invocation indices map onto subgroup lanes in order):
  // the shuffles below pair lanes by gl_SubgroupInvocationID. The selection takes DS > 1 only
  // where every subgroup is full (full subgroups, or a fixed size dividing the workgroup), so
  // that gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID numbers every invocation once.
  const uint lane = DS == 1u ? 0u : gl_SubgroupInvocationID % DS;
  const uint team = DS == 1u ? tid : (gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID) / DS;
  const int qb = int(gl_WorkGroupID.x) / pc.nsplit, split = int(gl_WorkGroupID.x) % pc.nsplit;
  const int b = int(gl_WorkGroupID.z);
  const int h0 = int(gl_WorkGroupID.y) * pc.head_rows;
  const int hk = h0 / (pc.Hq / pc.Hkv);  // the kv head of every head of the block
  const int rows = pc.q_rows * pc.head_rows;

  // The team's rows: local row rr = team * RPT + r is q head h0 + rr / q_rows at position
  // qb * q_rows + rr % q_rows.
  int row_i[RPT], row_h[RPT], row_local[RPT], lo[RPT], hi[RPT], seg[RPT];
  bool live[RPT];
  [[unroll]] for (uint r = 0; r < RPT; ++r) {
    const int rr = int(team * RPT + r);
    row_local[r] = rr % pc.q_rows;
    row_h[r] = h0 + rr / pc.q_rows;
    row_i[r] = qb * pc.q_rows + row_local[r];
    live[r] = rr < rows && row_i[r] < pc.Tq;
    lo[r] = 0;
    hi[r] = pc.Tk;
    if (has(FLAG_PARAM_MASK)) param_interval(row_i[r], lo[r], hi[r]);
  }
  // q, scaled (a loop over a private array: one load instruction in the shader).
  vec4 q_in[RPT * DK4];
  int seg_in[RPT];
  for (uint x = 0; x < RPT * DK4; ++x) {
    const uint r = x / DK4, k = x % DK4;
    const int rr = int(team * RPT + r);
    const int i = qb * pc.q_rows + rr % pc.q_rows, h = h0 + rr / pc.q_rows;
    const bool ok = rr < rows && i < pc.Tq;
    q_in[x] = ok ? load4(0u, q_at(b, i, h), int(4u * (lane + DS * k)), pc.D) * pc.scale
                 : vec4(0.0);
    if (k == 0u) seg_in[r] = (has(FLAG_SEGMENTS) && ok) ? seg_q[b * pc.Tq + i] : 0;
  }
  vec4 q[RPT][DK4];
  vec4 o[RPT][DV4];
  float m[RPT], l[RPT];
  bool poisoned[RPT];  // a NaN or +inf logit: the row is NaN
  [[unroll]] for (uint r = 0; r < RPT; ++r) {
    [[unroll]] for (uint k = 0; k < DK4; ++k) q[r][k] = q_in[r * DK4 + k];
    [[unroll]] for (uint k = 0; k < DV4; ++k) o[r][k] = vec4(0.0);
    m[r] = NEG_BIG;
    l[r] = 0.0;
    poisoned[r] = false;
    seg[r] = seg_in[r];
  }

  // The tiles of this q block (and this split of them).
  const int hh = pc.map_heads > 1 ? h0 : 0;  // head_rows == 1 with per-head maps
  const int e_first = int(row_start[hh * pc.nq + qb]), e_last = int(row_start[hh * pc.nq + qb + 1]);
  const int per_split = (e_last - e_first + pc.nsplit - 1) / pc.nsplit;
  const int e0 = min(e_last, e_first + split * per_split), e1 = min(e_last, e0 + per_split);
  const uint kstride = pc.k_st, vstride = pc.v_st;  // between consecutive keys

  for (int e = e0; e < e1; ++e) {
    const uint entry = entries[e];
    const int j0 = int(entry >> 1) * int(BC);
    const int nj = min(int(BC), pc.Tk - j0);
    // Stage K and V of keys j0 .. j0 + nj - 1 (keys past Tk and dims past D / Dv read 0).
    tile_barrier();  // every team is done with the previous tile
    const uint kbase = k_at(b, j0, hk), vbase = v_at(b, j0, hk);
    for (uint idx = tid; idx < BC * KROW; idx += WG) {
      const uint c = idx / KROW, v4 = idx % KROW;
      ks[idx] = int(c) < nj ? load4(1u, kbase + c * kstride, int(4u * v4), pc.D) : vec4(0.0);
    }
    for (uint idx = tid; idx < BC * VROW; idx += WG) {
      const uint c = idx / VROW, v4 = idx % VROW;
      vs[idx] = int(c) < nj ? load4(2u, vbase + c * vstride, int(4u * v4), pc.Dv) : vec4(0.0);
    }
    tile_barrier();

    // Which keys of the tile each row sees.
    uint vis_in[RPT];
    for (uint r = 0; r < RPT; ++r) {
      const int rr = int(team * RPT + r);
      const int i = qb * pc.q_rows + rr % pc.q_rows;
      int lo_r = 0, hi_r = pc.Tk;
      if (has(FLAG_PARAM_MASK)) param_interval(i, lo_r, hi_r);
      uint v = (rr < rows && i < pc.Tq) ? static_bits(uint(e), rr % pc.q_rows, j0, nj, lo_r, hi_r, pc.q_rows) : 0u;
      if (has(FLAG_SEGMENTS) && v != 0u) v &= segment_bits(b, j0, nj, seg_in[r]);
      vis_in[r] = v;
    }
    uint vis[RPT];
    [[unroll]] for (uint r = 0; r < RPT; ++r) vis[r] = vis_in[r];

    // Keys are taken KU at a time, each group a step of the online softmax.
    [[dont_unroll]] for (uint c0 = 0; c0 < BC; c0 += KU) {
      if (int(c0) >= nj) break;
      // S = Q K^T: each lane's partial dot products, then summed over the team.
      float s[RPT][KU];
      [[unroll]] for (uint c = 0; c < KU; ++c) {
        [[unroll]] for (uint r = 0; r < RPT; ++r) s[r][c] = 0.0;
        [[unroll]] for (uint k = 0; k < DK4; ++k) {
          const vec4 kv = ks[(c0 + c) * KROW + lane + DS * k];
          [[unroll]] for (uint r = 0; r < RPT; ++r) s[r][c] += dot(q[r][k], kv);
        }
      }
      if (DS > 1u) {
        [[unroll]] for (uint c = 0; c < KU; ++c)
          [[unroll]] for (uint r = 0; r < RPT; ++r)
            [[unroll]] for (uint off = 1u; off < DS; off *= 2u) s[r][c] += subgroupShuffleXor(s[r][c], off);
      }

      // Logits and the online softmax; s becomes P (0 for masked keys and -inf logits, which
      // stay out of the max as the finite NEG_BIG; a NaN / +inf logit poisons the row). Written
      // with selects, not branches: CPU implementations compile each branch of this unrolled
      // body into basic blocks, which their coroutine pass pays for quadratically.
      uint keep[RPT][KU];  // all ones where P != 0: the key's value is multiplied in
      [[unroll]] for (uint r = 0; r < RPT; ++r) {
        const uint bits_r = vis[r] >> c0;
        float step_max = NEG_BIG;
        uint live = 0u;
        [[unroll]] for (uint c = 0; c < KU; ++c) {
          const bool visible = ((bits_r >> c) & 1u) != 0u;
          float y = NEG_BIG;
          if (visible) y = finish_logit(s[r][c], b, row_h[r], row_i[r], j0 + int(c0 + c));
          const uint cls = visible ? logit_class(y) : LOGIT_MASKED;
          poisoned[r] = poisoned[r] || cls == LOGIT_POISON;
          live |= cls == LOGIT_LIVE ? 1u << c : 0u;
          s[r][c] = cls == LOGIT_LIVE ? y : NEG_BIG;
          step_max = max(step_max, s[r][c]);
        }
        const float m_new = max(m[r], step_max);
        const float alpha = exp(m[r] - m_new);
        m[r] = m_new;
        // alpha is 1 unless the running max grew (rare after the first keys): skip the rescale
        // then.
        if (alpha != 1.0) {
          l[r] *= alpha;
          [[unroll]] for (uint k = 0; k < DV4; ++k) o[r][k] *= alpha;
        }
        [[unroll]] for (uint c = 0; c < KU; ++c) {
          s[r][c] = ((live >> c) & 1u) != 0u ? exp(s[r][c] - m_new) : 0.0;
          keep[r][c] = (floatBitsToUint(s[r][c]) << 1) != 0u ? 0xffffffffu : 0u;
          l[r] += s[r][c];
        }
      }

      // O += P V. A key of weight 0 for a row (masked by a partial tile or a -inf bias, past the
      // sequence, or underflowed) adds nothing to it: its value goes through an integer mask, so
      // that NaN/Inf in a masked key's v never leaks (as 0 x NaN).
      [[unroll]] for (uint c = 0; c < KU; ++c)
        [[unroll]] for (uint k = 0; k < DV4; ++k) {
          const uvec4 vv = floatBitsToUint(vs[(c0 + c) * VROW + lane + DS * k]);
          [[unroll]] for (uint r = 0; r < RPT; ++r) o[r][k] += s[r][c] * uintBitsToFloat(vv & uvec4(keep[r][c]));
        }
    }
  }

  // Results: normalised rows (or split-KV partials) through a private array, stored in a loop
  // (attn_io.glsl's row_factor / row_lse_bits / out_bits: a fully masked row gives 0 and lse
  // -inf, a poisoned row NaN, a sink adds probability mass without value).
  vec4 o_out[RPT * DV4];
  float row_m[RPT], row_l[RPT];
  bool row_nan[RPT], out_nan[RPT];
  [[unroll]] for (uint r = 0; r < RPT; ++r) {
    const float factor = SPLIT == 0u ? row_factor(m[r], l[r], row_h[r]) : 1.0;
    // factor 0 (fully masked, or a +inf sink's row): 0 even where an infinite value made o inf.
    [[unroll]] for (uint k = 0; k < DV4; ++k) o_out[r * DV4 + k] = factor == 0.0 ? vec4(0.0) : o[r][k] * factor;
    row_m[r] = m[r];
    row_l[r] = l[r];
    row_nan[r] = poisoned[r];
    out_nan[r] = poisoned[r] || (SPLIT == 0u && l[r] != 0.0 && sink_poisons(row_h[r]));
  }
  for (uint r = 0; r < RPT; ++r) {
    const int rr = int(team * RPT + r);
    const int i = qb * pc.q_rows + rr % pc.q_rows, h = h0 + rr / pc.q_rows;
    if (rr >= rows || i >= pc.Tq) continue;
    const uint row = uint((b * pc.Hq + h) * pc.Tq + i);  // [B, Hq, Tq] index
    uint base;
    if (SPLIT != 0u) {
      // Partial of this split: o unnormalised, then m and l (l NaN: the chunk poisoned the row).
      base = (row * uint(pc.nsplit) + uint(split)) * uint(pc.Dv + 2);
      if (lane == 0u) {
        scratch[base + uint(pc.Dv)] = row_m[r];
        scratch_u32[base + uint(pc.Dv) + 1u] = row_nan[r] ? NAN_BITS : floatBitsToUint(row_l[r]);
      }
    } else {
      base = uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv);
      // lse is over the visible keys only.
      if (has(FLAG_LSE) && lane == 0u) lse_u32[row] = row_lse_bits(row_m[r], row_l[r], row_nan[r]);
    }
    for (uint x = 0; x < DV4 * 4u; ++x) {
      const int d = int(4u * (lane + DS * (x / 4u)) + x % 4u);
      if (d >= pc.Dv) break;
      const uint val = out_bits(o_out[r * DV4 + x / 4u][x % 4u], 1.0, out_nan[r]);
      if (SPLIT != 0u)
        scratch_u32[base + uint(d)] = val;
      else
        out_u32[base + uint(d)] = val;
    }
  }
}
