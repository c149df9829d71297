#version 450
// The paged work list's stream sequences (decode, speculative steps): one workgroup per (unit,
// kv head), a unit being up to R rows of one split of one sequence (the q heads of the kv head x
// its queries: the whole GQA group shares each K / V read). flash_decode.comp's structure over
// the page table: the workgroup's invocations form TEAMS teams of DS consecutive subgroup lanes;
// team t takes keys kv_begin + t, + TEAMS, ... of the split, and a lane holds 8 consecutive
// elements of the head dimension per chunk (chunk lane + DS * c), read straight from the pools
// (a 16-byte load per chunk for 16-bit rows on 16-byte boundaries, 8 bytes for 8-bit ones: VEC),
// with nothing staged and no barrier in the key loop; a team's partial dot products are summed
// with subgroupShuffleXor over its DS lanes.
//
// Each team keeps its own online softmax (m, l, o) per row; at the end the teams are combined by
// log-sum-exp (shuffles within a subgroup, shared memory across subgroups) and each row's state
// is written as the partial of its slot row_tasks[n].x + split; paged_merge.comp merges a row's
// slots in split order. A key outside a row's visible range, or of weight 0, adds nothing to it
// (its v is never multiplied), a NaN / +inf logit makes the row NaN (as paged_attn.comp).
// 8-bit pools: a logit is the code dot product times the key's k scale, a weight is multiplied by
// the key's v scale.
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require
#include "paged_io.glsl"

layout(local_size_x_id = 3) in;                // TEAMS * DS invocations
layout(constant_id = 4) const uint DS = 8u;    // lanes per key (power of two <= subgroup size)
layout(constant_id = 5) const uint R = 4u;     // rows per workgroup at most
layout(constant_id = 6) const uint DK8 = 1u;   // 8-element chunks of q / k per lane: D <= 8 * DS * DK8
layout(constant_id = 7) const uint DV8 = 1u;   // of v / o: Dv <= 8 * DS * DV8
layout(constant_id = 8) const uint MAXSG = 4u; // subgroups per workgroup at most
layout(constant_id = 9) const uint VEC = 0u;   // 1: whole 8-element chunks on 32-byte (f32) / 16-byte
                                               // (16-bit) / 8-byte (8-bit) boundaries: vector loads

const uint DVW = 8u * DS * DV8;  // elements of a row's o held by one team (Dv padded)
shared float red_o[MAXSG * R * DVW];
shared float red_m[MAXSG * R];
shared float red_l[MAXSG * R];

// Elements d .. d+7 (d a multiple of 8) of a pool row starting at element `base` as two vec4
// (values, or code values for 8-bit pools); 0 past n.
void load8(bool is_v, uint base, int d, int n, out vec4 lo, out vec4 hi) {
  lo = vec4(0.0);
  hi = vec4(0.0);
  if (d >= n) return;
  if (VEC != 0u) {
    if (KVTYPE == 0u) {  // eight f32 values: two 16-byte loads
      const uint e4 = (base + uint(d)) >> 2;
      lo = uintBitsToFloat(is_v ? v_vec[e4] : k_vec[e4]);
      hi = uintBitsToFloat(is_v ? v_vec[e4 + 1u] : k_vec[e4 + 1u]);
      return;
    }
    if (KVTYPE <= 2u) {  // eight 16-bit values: one 16-byte load
      const uvec4 w = is_v ? v_vec[(base + uint(d)) >> 3] : k_vec[(base + uint(d)) >> 3];
      if (KVTYPE == 1u) {
        lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
        hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
      } else {
        lo = vec4(uintBitsToFloat(w.x << 16), uintBitsToFloat(w.x & 0xffff0000u), uintBitsToFloat(w.y << 16),
                  uintBitsToFloat(w.y & 0xffff0000u));
        hi = vec4(uintBitsToFloat(w.z << 16), uintBitsToFloat(w.z & 0xffff0000u), uintBitsToFloat(w.w << 16),
                  uintBitsToFloat(w.w & 0xffff0000u));
      }
      return;
    }
    const uvec2 w = is_v ? v_vec2[(base + uint(d)) >> 3] : k_vec2[(base + uint(d)) >> 3];  // eight codes
    lo = vec4(code_value(w.x & 0xffu), code_value((w.x >> 8) & 0xffu), code_value((w.x >> 16) & 0xffu),
              code_value(w.x >> 24));
    hi = vec4(code_value(w.y & 0xffu), code_value((w.y >> 8) & 0xffu), code_value((w.y >> 16) & 0xffu),
              code_value(w.y >> 24));
    return;
  }
  float x[8];
  [[unroll]] for (uint u = 0; u < 8u; ++u) {
    const int e = d + int(u);
    x[u] = e < n ? (is_v ? v_elem(base + uint(e)) : k_elem(base + uint(e))) : 0.0;
  }
  lo = vec4(x[0], x[1], x[2], x[3]);
  hi = vec4(x[4], x[5], x[6], x[7]);
}

void main() {
  const uint unit = gl_WorkGroupID.y + gl_WorkGroupID.z * pc.fold;
  if (unit >= pc.num_items) return;  // the whole workgroup: no barrier is skipped by some only
  const uint flat_id = gl_SubgroupID * gl_SubgroupSize + gl_SubgroupInvocationID;
  const uint lane = flat_id % DS, team = flat_id / DS;
  const uint TEAMS = gl_WorkGroupSize.x / DS;
  const int hk = int(gl_WorkGroupID.x);
  const ivec4 u0 = units[2u * unit], u1 = units[2u * unit + 1u];
  const int q_begin = u0.x, ql = u0.y, first_page = u0.z, split = u0.w;
  const int kv_begin = u1.x, kv_end = u1.y, row0 = u1.z;
  const int rows = min(int(R), pc.group * ql - row0);

  // Row r: row0 + r = g * ql + i is q head hk * group + g at query i: its q and visible keys.
  vec4 q[R][DK8 * 2];
  vec4 o[R][DV8 * 2];
  float m[R], l[R];
  int lo_r[R], hi_r[R];
  [[unroll]] for (uint r = 0; r < R; ++r) {
    const int rr = row0 + int(r), g = rr / max(ql, 1), i = rr - g * max(ql, 1);
    const bool ok = int(r) < rows;
    const int n = q_begin + i, h = hk * pc.group + g;
    const ivec2 lh = ok ? row_lohi[n] : ivec2(0, 0);
    lo_r[r] = lh.x, hi_r[r] = lh.y;
    const uint qbase = pc.q_off + uint(n) * pc.q_sn + uint(h) * pc.q_sh;
    [[unroll]] for (uint c = 0; c < DK8; ++c) {
      const int d = int(8u * (lane + DS * c));
      float x[8];
      [[unroll]] for (uint e = 0; e < 8u; ++e)
        x[e] = ok && d + int(e) < pc.D ? q_elem(qbase + uint(d) + e) : 0.0;  // scaled by paged_logit
      q[r][2u * c] = vec4(x[0], x[1], x[2], x[3]);
      q[r][2u * c + 1u] = vec4(x[4], x[5], x[6], x[7]);
    }
    [[unroll]] for (uint c = 0; c < DV8 * 2u; ++c) o[r][c] = vec4(0.0);
    m[r] = NEG_BIG;
    l[r] = 0.0;
  }

  for (int j = kv_begin + int(team); j < kv_end; j += int(TEAMS)) {
    const int pi = j / pc.page_size, page = page_ids[first_page + pi], prow = j - pi * pc.page_size;
    const uint kb = pc.k_off + uint(page) * pc.k_sp + uint(prow) * pc.k_sr + uint(hk) * pc.k_sh;
    vec4 kk[DK8 * 2];
    [[unroll]] for (uint c = 0; c < DK8; ++c)
      load8(false, kb, int(8u * (lane + DS * c)), pc.D, kk[2u * c], kk[2u * c + 1u]);
    float s[R];
    [[unroll]] for (uint r = 0; r < R; ++r) {
      float acc = 0.0;
      [[unroll]] for (uint c = 0; c < DK8 * 2u; ++c) acc += dot(q[r][c], kk[c]);
      s[r] = acc;
    }
    [[unroll]] for (uint off = 1u; off < DS; off *= 2u)
      [[unroll]] for (uint r = 0; r < R; ++r) s[r] += subgroupShuffleXor(s[r], off);
    const float ks = k_scale_of(page, prow, hk);
    float p[R];
    bool any = false;
    [[unroll]] for (uint r = 0; r < R; ++r) {
      p[r] = 0.0;
      if (int(r) >= rows || j < lo_r[r] || j >= hi_r[r]) continue;
      const float y = paged_logit(s[r] * ks);
      // A NaN logit makes its weight NaN whatever max() returns; +inf gives m = inf and NaN
      // weights (inf - inf); -inf gives weight 0.
      const float m_new = max(m[r], y);
      const float alpha = exp(m[r] - m_new);
      if (alpha != 1.0) {
        l[r] *= alpha;
        [[unroll]] for (uint c = 0; c < DV8 * 2u; ++c) o[r][c] *= alpha;
      }
      m[r] = m_new;
      p[r] = exp(y - m_new);
      l[r] += p[r];
      any = any || p[r] != 0.0;
    }
    if (!any) continue;  // the same for every lane of the team: no v read
    const uint vb = pc.v_off + uint(page) * pc.v_sp + uint(prow) * pc.v_sr + uint(hk) * pc.v_sh;
    const float vs = v_scale_of(page, prow, hk);
    [[unroll]] for (uint c = 0; c < DV8; ++c) {
      vec4 vlo, vhi;
      load8(true, vb, int(8u * (lane + DS * c)), pc.Dv, vlo, vhi);
      [[unroll]] for (uint r = 0; r < R; ++r) {
        if (p[r] == 0.0) continue;  // weight 0: v never multiplied (0 x inf = NaN)
        const float w = p[r] * vs;
        o[r][2u * c] += w * vlo;
        o[r][2u * c + 1u] += w * vhi;
      }
    }
  }

  // Combination, step 1: the teams of a subgroup (lanes DS, 2 DS, ... apart) by log-sum-exp; a
  // team that saw nothing has m = NEG_BIG, l = 0, o = 0 and adds nothing (a weight of 0 never
  // multiplies o).
  for (uint off = DS; off < gl_SubgroupSize; off *= 2u) {
    [[unroll]] for (uint r = 0; r < R; ++r) {
      const float m2 = subgroupShuffleXor(m[r], off), l2 = subgroupShuffleXor(l[r], off);
      const float mn = max(m[r], m2);
      const float a = exp(m[r] - mn), a2 = exp(m2 - mn);
      l[r] = l[r] * a + l2 * a2;
      [[unroll]] for (uint c = 0; c < DV8 * 2u; ++c) {
        const vec4 o2 = subgroupShuffleXor(o[r][c], off);
        o[r][c] = (a != 0.0 ? o[r][c] * a : vec4(0.0)) + (a2 != 0.0 ? o2 * a2 : vec4(0.0));
      }
      m[r] = mn;
    }
  }
  // Step 2: the first team of each subgroup publishes its state; every invocation then combines
  // some (row, element) pairs over the subgroups and writes the partials.
  if (gl_SubgroupInvocationID < DS) {
    [[unroll]] for (uint r = 0; r < R; ++r) {
      const uint at = gl_SubgroupID * R + r;
      [[unroll]] for (uint c = 0; c < DV8 * 2u; ++c) {
        const uint e = at * DVW + 8u * (lane + DS * (c / 2u)) + 4u * (c % 2u);
        red_o[e] = o[r][c].x;
        red_o[e + 1u] = o[r][c].y;
        red_o[e + 2u] = o[r][c].z;
        red_o[e + 3u] = o[r][c].w;
      }
      if (lane == 0u) {
        red_m[at] = m[r];
        red_l[at] = l[r];
      }
    }
  }
  barrier();
  const uint nsg = gl_NumSubgroups, stride = uint(pc.Dv + 2);
  for (uint x = gl_LocalInvocationIndex; x < uint(rows * pc.Dv); x += gl_WorkGroupSize.x) {
    const uint r = x / uint(pc.Dv), d = x % uint(pc.Dv);
    float mm = NEG_BIG;
    for (uint g = 0; g < nsg; ++g) mm = max(mm, red_m[g * R + r]);
    float ll = 0.0, acc = 0.0;
    for (uint g = 0; g < nsg; ++g) {
      const float w = exp(red_m[g * R + r] - mm);
      ll += red_l[g * R + r] * w;
      if (w != 0.0) acc += red_o[(g * R + r) * DVW + d] * w;
    }
    const int rr = row0 + int(r), g = rr / ql, i = rr - g * ql;
    const int n = q_begin + i, h = hk * pc.group + g;
    const uint base = (uint(row_tasks[n].x + split) * uint(pc.Hq) + uint(h)) * stride;
    partials[base + d] = acc;
    if (d == 0u) {
      partials[base + uint(pc.Dv)] = mm;
      partials[base + uint(pc.Dv) + 1u] = ll;
    }
  }
}
