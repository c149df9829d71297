#version 450
// Decode-shaped flash attention (the "flash_decode" variant): a few query rows per kv head (a
// decode step, a short speculative query, the q heads of a GQA group) over a long context.
//
// flash_tiled.comp gives a workgroup 32-64 rows and puts every lane on its rows; a decode has
// 1-16 rows per kv head, so most of those lanes would idle (B1 H16 Tq1: 15 of 16 rows). Here a
// workgroup splits the *keys* instead. Its invocations form TEAMS = BC / KU teams of DS
// consecutive subgroup lanes; team t takes keys t, t + TEAMS, ..., t + (KU-1) * TEAMS of every kv
// tile (BC keys), and a lane holds 8 consecutive elements of the head dimension per chunk (chunk
// lane + DS*k, k < DK8 for q / k, < DV8 for v / o). A key's K and V slices are read straight from
// global memory, one 16-byte load per chunk for 16-bit data on 16-byte-aligned rows (FLAG_VEC;
// two for f32): each key is read once per workgroup, so nothing is staged in shared memory and
// no barrier runs in the key loop. The team's partial dot products are summed with
// subgroupShuffleXor over its DS lanes.
//
// Each team keeps its own online softmax (m, l, o) for the workgroup's rows. At the end the
// teams' states are combined by log-sum-exp, first within each subgroup (shuffles between teams),
// then across subgroups (shared memory), and written as the rows' outputs or, with SPLIT, as
// split-KV partials for attn_merge.comp (the layout of flash_tiled.comp's: o unnormalised, m, l).
//
// Rows (as flash_tiled.comp): q_rows query positions x head_rows q heads of one kv head, at most
// R; gl_WorkGroupID = (q block * nsplit + split, head block, batch). The selection
// (vk_kernel_select.cpp, decode_tiles) requires full subgroups or a fixed subgroup size that
// divides the workgroup, so that gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID
// numbers every invocation once and every shuffle partner is present.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "attn_io.glsl"

layout(local_size_x_id = 0) in;                   // TEAMS * DS invocations
layout(constant_id = 1) const uint DTYPE = 0u;     // 0 f32, 1 f16, 2 bf16
layout(constant_id = 2) const uint DS = 16u;       // lanes per team (power of two <= subgroup size)
layout(constant_id = 3) const uint R = 1u;         // rows per workgroup at most
layout(constant_id = 4) const uint BC = 32u;       // keys per kv tile (<= 32: one visibility word)
layout(constant_id = 5) const uint DK8 = 1u;       // 8-element chunks of q / k per lane: D <= 8 * DS * DK8
layout(constant_id = 6) const uint DV8 = 1u;       // 8-element chunks of v / o per lane: Dv <= 8 * DS * DV8
layout(constant_id = 7) const uint SPLIT = 0u;     // 1: write split-KV partials
layout(constant_id = 8) const uint KU = 4u;        // keys per team per tile (BC / TEAMS)
layout(constant_id = 9) const uint MAXSG = 4u;     // subgroups per workgroup at most
layout(constant_id = 10) const uint ALIGNED = 0u;  // 0 element loads, 1 FLAG_ALIGNED4, 2 also FLAG_VEC

const uint TEAMS = BC / KU;
const uint DVW = 8u * DS * DV8;  // elements of a row's o held by one team (Dv padded)
// The subgroups' combined states (step 2 of the combination).
shared float red_o[MAXSG * R * DVW];
shared float red_m[MAXSG * R];
shared float red_l[MAXSG * R];
shared uint red_nan[MAXSG * R];

// Elements d .. d+3 of q / k / v (attn_io.glsl's qkv_load4 under this shader's specialization).
vec4 load4(uint which, uint base, int d, int n) { return qkv_load4(which, base, d, n, ALIGNED != 0u, DTYPE); }

// Elements d .. d+7 (d a multiple of 8) as two vec4. 16-bit rows of whole 16-byte vectors on
// 16-byte boundaries (ALIGNED 2: n is a multiple of 8) are one 16-byte load.
void load8(uint which, uint base, int d, int n, out vec4 lo, out vec4 hi) {
  if (ALIGNED == 2u && DTYPE != 0u) {
    lo = vec4(0.0);
    hi = vec4(0.0);
    if (d >= n) return;
    const uint e = (base + uint(d)) >> 3;
    const uvec4 w = which == 0u ? q_vec[e] : which == 1u ? k_vec[e] : v_vec[e];
    lo = vec4(unpack_pair_of(w.x, DTYPE), unpack_pair_of(w.y, DTYPE));
    hi = vec4(unpack_pair_of(w.z, DTYPE), unpack_pair_of(w.w, DTYPE));
    return;
  }
  lo = load4(which, base, d, n);
  hi = load4(which, base, d + 4, n);
}

void main() {
  const uint flat_id = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
  const uint lane = flat_id % DS, team = flat_id / DS;
  const int qb = int(gl_WorkGroupID.x) / pc.nsplit, split = int(gl_WorkGroupID.x) % pc.nsplit;
  const int b = int(gl_WorkGroupID.z);
  const int h0 = int(gl_WorkGroupID.y) * pc.head_rows;
  const int hk = h0 / (pc.Hq / pc.Hkv);  // the kv head of every head of the block
  const int rows = pc.q_rows * pc.head_rows;

  // Local row r is q head h0 + r / q_rows at position qb * q_rows + r % q_rows.
  int row_i[R], row_h[R];
  [[unroll]] for (uint r = 0; r < R; ++r) {
    row_i[r] = qb * pc.q_rows + int(r) % pc.q_rows;
    row_h[r] = h0 + int(r) / pc.q_rows;
  }
  // q, scaled: the lane's chunks (a loop over a private array: one load site in the shader).
  vec4 q_in[R * DK8 * 2];
  int seg_in[R];
  for (uint x = 0; x < R * DK8; ++x) {
    const uint r = x / DK8, k = x % DK8;
    const int i = qb * pc.q_rows + int(r) % pc.q_rows, h = h0 + int(r) / pc.q_rows;
    const bool ok = int(r) < rows && i < pc.Tq;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (ok) load8(0u, q_at(b, i, h), int(8u * (lane + DS * k)), pc.D, lo, hi);
    q_in[2u * x] = lo * pc.scale;
    q_in[2u * x + 1u] = hi * pc.scale;
    if (k == 0u) seg_in[r] = (has(FLAG_SEGMENTS) && ok) ? seg_q[b * pc.Tq + i] : 0;
  }
  vec4 q[R][DK8 * 2];
  vec4 o[R][DV8 * 2];
  float m[R], l[R];
  bool poisoned[R];  // a NaN or +inf logit: the row is NaN
  [[unroll]] for (uint r = 0; r < R; ++r) {
    [[unroll]] for (uint k = 0; k < DK8 * 2u; ++k) q[r][k] = q_in[r * DK8 * 2u + k];
    [[unroll]] for (uint k = 0; k < DV8 * 2u; ++k) o[r][k] = vec4(0.0);
    m[r] = NEG_BIG;
    l[r] = 0.0;
    poisoned[r] = false;
  }

  // The tiles of this q block (and this split of them).
  const int hh = pc.map_heads > 1 ? h0 : 0;  // head_rows == 1 with per-head maps
  const int e_first = int(row_start[hh * pc.nq + qb]), e_last = int(row_start[hh * pc.nq + qb + 1]);
  const int per_split = (e_last - e_first + pc.nsplit - 1) / pc.nsplit;
  const int e0 = min(e_last, e_first + split * per_split), e1 = min(e_last, e0 + per_split);

  for (int e = e0; e < e1; ++e) {
    const uint entry = entries[e];
    const int j0 = int(entry >> 1) * int(BC);
    const int nj = min(int(BC), pc.Tk - j0);

    // Which keys of the tile each row sees (bit c for key j0 + c).
    uint vis_in[R];
    for (uint r = 0; r < R; ++r) {
      const int i = qb * pc.q_rows + int(r) % pc.q_rows;
      int lo_r = 0, hi_r = pc.Tk;
      if (has(FLAG_PARAM_MASK)) param_interval(i, lo_r, hi_r);
      uint v = (int(r) < rows && i < pc.Tq) ? static_bits(uint(e), int(r) % pc.q_rows, j0, nj, lo_r, hi_r, pc.q_rows) : 0u;
      if (has(FLAG_SEGMENTS) && v != 0u) v &= segment_bits(b, j0, nj, seg_in[r]);
      vis_in[r] = v;
    }
    uint vis[R];
    [[unroll]] for (uint r = 0; r < R; ++r) vis[r] = vis_in[r];

    // S = Q K^T for the team's KU keys of the tile: every K load is issued before the products.
    vec4 kk[KU][DK8 * 2];
    [[unroll]] for (uint u = 0; u < KU; ++u) {
      const int c = int(team + TEAMS * u);
      [[unroll]] for (uint k = 0; k < DK8; ++k) {
        kk[u][2u * k] = vec4(0.0);
        kk[u][2u * k + 1u] = vec4(0.0);
        if (c < nj) load8(1u, k_at(b, j0 + c, hk), int(8u * (lane + DS * k)), pc.D, kk[u][2u * k], kk[u][2u * k + 1u]);
      }
    }
    float s[R][KU];
    [[unroll]] for (uint u = 0; u < KU; ++u)
      [[unroll]] for (uint r = 0; r < R; ++r) {
        float acc = 0.0;
        [[unroll]] for (uint k = 0; k < DK8 * 2u; ++k) acc += dot(q[r][k], kk[u][k]);
        s[r][u] = acc;
      }
    if (DS > 1u) {
      [[unroll]] for (uint u = 0; u < KU; ++u)
        [[unroll]] for (uint r = 0; r < R; ++r)
          [[unroll]] for (uint off = 1u; off < DS; off *= 2u) s[r][u] += subgroupShuffleXor(s[r][u], off);
    }

    // Logits and the online softmax, as flash_tiled.comp: s becomes P (0 for masked keys and -inf
    // logits, kept out of the max as the finite NEG_BIG; a NaN / +inf logit poisons the row).
    uint keep[R][KU];  // all ones where P != 0: the key's value is multiplied in
    [[unroll]] for (uint r = 0; r < R; ++r) {
      float step_max = NEG_BIG;
      uint live = 0u;
      [[unroll]] for (uint u = 0; u < KU; ++u) {
        const uint c = team + TEAMS * u;
        const bool visible = ((vis[r] >> c) & 1u) != 0u;
        float y = NEG_BIG;
        if (visible) y = finish_logit(s[r][u], b, row_h[r], row_i[r], j0 + int(c));
        const uint cls = visible ? logit_class(y) : LOGIT_MASKED;
        poisoned[r] = poisoned[r] || cls == LOGIT_POISON;
        live |= cls == LOGIT_LIVE ? 1u << u : 0u;
        s[r][u] = cls == LOGIT_LIVE ? y : NEG_BIG;
        step_max = max(step_max, s[r][u]);
      }
      const float m_new = max(m[r], step_max);
      const float alpha = exp(m[r] - m_new);
      m[r] = m_new;
      if (alpha != 1.0) {  // only when the running max grew
        l[r] *= alpha;
        [[unroll]] for (uint k = 0; k < DV8 * 2u; ++k) o[r][k] *= alpha;
      }
      [[unroll]] for (uint u = 0; u < KU; ++u) {
        s[r][u] = ((live >> u) & 1u) != 0u ? exp(s[r][u] - m_new) : 0.0;
        keep[r][u] = (floatBitsToUint(s[r][u]) << 1) != 0u ? 0xffffffffu : 0u;
        l[r] += s[r][u];
      }
    }

    // O += P V. V of a key no row weighs is not read (the same for every lane of the team); a
    // key of weight 0 for a row adds nothing to it, through an integer mask on v's bits (NaN / Inf
    // in a masked key's v never leaks as 0 x NaN).
    [[unroll]] for (uint u = 0; u < KU; ++u) {
      uint any_keep = 0u;
      [[unroll]] for (uint r = 0; r < R; ++r) any_keep |= keep[r][u];
      if (any_keep == 0u) continue;
      const int c = int(team + TEAMS * u);
      [[unroll]] for (uint k = 0; k < DV8; ++k) {
        vec4 lo, hi;
        load8(2u, v_at(b, j0 + c, hk), int(8u * (lane + DS * k)), pc.Dv, lo, hi);
        const uvec4 vlo = floatBitsToUint(lo), vhi = floatBitsToUint(hi);
        [[unroll]] for (uint r = 0; r < R; ++r) {
          o[r][2u * k] += s[r][u] * uintBitsToFloat(vlo & uvec4(keep[r][u]));
          o[r][2u * k + 1u] += s[r][u] * uintBitsToFloat(vhi & uvec4(keep[r][u]));
        }
      }
    }
  }

  // Combination, step 1: the teams of a subgroup (lanes DS, 2 DS, ... apart) by log-sum-exp; a
  // team that saw nothing has m = NEG_BIG, l = 0, o = 0 and adds nothing.
  for (uint off = DS; off < gl_SubgroupSize; off *= 2u) {
    [[unroll]] for (uint r = 0; r < R; ++r) {
      const float m2 = subgroupShuffleXor(m[r], off), l2 = subgroupShuffleXor(l[r], off);
      const bool p2 = subgroupShuffleXor(poisoned[r] ? 1u : 0u, off) != 0u;
      const float mn = max(m[r], m2);
      const float a = exp(m[r] - mn), a2 = exp(m2 - mn);
      l[r] = l[r] * a + l2 * a2;
      [[unroll]] for (uint k = 0; k < DV8 * 2u; ++k) o[r][k] = o[r][k] * a + subgroupShuffleXor(o[r][k], off) * a2;
      m[r] = mn;
      poisoned[r] = poisoned[r] || p2;
    }
  }
  // Step 2: the first team of each subgroup publishes the subgroup's state; every invocation then
  // combines some (row, element) pairs over the subgroups and writes them.
  if (gl_SubgroupInvocationID < DS) {
    for (uint x = 0; x < R * DV8 * 2u; ++x) {
      const uint r = x / (DV8 * 2u), k = x % (DV8 * 2u);
      const uint at = gl_SubgroupID * R + r;
      const vec4 val = o[r][k];
      const uint e = at * DVW + 8u * (lane + DS * (k / 2u)) + 4u * (k % 2u);
      red_o[e] = val.x;
      red_o[e + 1u] = val.y;
      red_o[e + 2u] = val.z;
      red_o[e + 3u] = val.w;
      if (lane == 0u && k == 0u) {
        red_m[at] = m[r];
        red_l[at] = l[r];
        red_nan[at] = poisoned[r] ? 1u : 0u;
      }
    }
  }
  barrier();
  const uint nsg = gl_NumSubgroups;
  for (uint x = gl_LocalInvocationIndex; x < uint(rows * pc.Dv); x += gl_WorkGroupSize.x) {
    const uint r = x / uint(pc.Dv), d = x % uint(pc.Dv);
    const int i = qb * pc.q_rows + int(r) % pc.q_rows, h = h0 + int(r) / pc.q_rows;
    if (i >= pc.Tq) continue;
    float mm = NEG_BIG;
    bool pois = false;
    for (uint g = 0; g < nsg; ++g) {
      mm = max(mm, red_m[g * R + r]);
      pois = pois || red_nan[g * R + r] != 0u;
    }
    float ll = 0.0, acc = 0.0;
    for (uint g = 0; g < nsg; ++g) {
      const float w = exp(red_m[g * R + r] - mm);
      ll += red_l[g * R + r] * w;
      acc += red_o[(g * R + r) * DVW + d] * w;
    }
    const uint row = uint((b * pc.Hq + h) * pc.Tq + i);  // [B, Hq, Tq] index
    if (SPLIT != 0u) {
      // Partial of this split: o unnormalised, then m and l (l NaN: the chunk poisoned the row).
      const uint base = (row * uint(pc.nsplit) + uint(split)) * uint(pc.Dv + 2);
      scratch_u32[base + d] = out_bits(acc, 1.0, pois);
      if (d == 0u) {
        scratch[base + uint(pc.Dv)] = mm;
        scratch_u32[base + uint(pc.Dv) + 1u] = pois ? NAN_BITS : floatBitsToUint(ll);
      }
    } else {
      // Normalised (attn_io.glsl: a fully masked row gives 0 and lse -inf, a poisoned row NaN, a
      // sink adds probability mass without value); lse over the visible keys only.
      const bool out_nan = pois || (ll != 0.0 && sink_poisons(h));
      out_u32[uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv) + d] = out_bits(acc, row_factor(mm, ll, h), out_nan);
      if (d == 0u && has(FLAG_LSE)) lse_u32[row] = row_lse_bits(mm, ll, pois);
    }
  }
}
