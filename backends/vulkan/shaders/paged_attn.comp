#version 450
// The paged work list's first pass: one workgroup per (task, q head). A task is one query row's
// keys [kv_begin, kv_end) of one sequence (all visible; a KV split of the row's visible range
// for decode-like sequences, the whole range otherwise), read through the page table in place.
// Online softmax over blocks of WG keys: each invocation computes one key's logit (the q row sits
// in shared memory), invocation 0 takes the block's max and weights in key order (a fixed order:
// the result does not depend on the batch), then each invocation accumulates its own output
// dimensions over the block's keys in key order. Writes the partial state (acc, m, l) of the
// task; paged_merge.comp combines a row's tasks. fp32 statistics and accumulators. 8-bit pools:
// a key's logit is its code dot product times its k scale, its weight times its v scale.
#extension GL_GOOGLE_include_directive : require
#include "paged_io.glsl"

#define WG 64
layout(local_size_x = WG) in;
const int MAXD = 512;        // head dims up to 512 (vk_paged.cpp refuses larger)
const int ACC = MAXD / WG;   // output dimensions per invocation

shared float q_s[MAXD];
shared float p_s[WG];   // the block's logits, then their weights
shared uint vrow_s[WG]; // element offset of each key's v row
shared float vscale_s[WG]; // each key's v scale (8-bit pools; 1 otherwise)
shared float alpha_s;

void main() {
  // The q heads of one task are adjacent workgroups (x): they read the same keys and values
  // (GQA: the same kv head for a group), which then meet in the device's caches.
  const uint item = gl_WorkGroupID.y + gl_WorkGroupID.z * pc.fold;
  if (item >= pc.num_items) return;  // the whole workgroup: no barrier is skipped by some only
  const int h = int(gl_WorkGroupID.x), tid = int(gl_LocalInvocationID.x);
  const ivec4 t = tasks[item];
  const int hk = h / pc.group;  // GQA: q head h reads kv head h / group
  const uint qbase = pc.q_off + uint(t.x) * pc.q_sn + uint(h) * pc.q_sh;
  for (int d = tid; d < pc.D; d += WG) q_s[d] = q_elem(qbase + uint(d));
  float acc[ACC];
  for (int c = 0; c < ACC; ++c) acc[c] = 0.0;
  float m = NEG_BIG, l = 0.0;  // kept by invocation 0
  barrier();

  for (int j0 = t.z; j0 < t.w; j0 += WG) {
    const int nj = min(WG, t.w - j0);
    if (tid < nj) {
      const int j = j0 + tid;
      const int pi = j / pc.page_size;
      const int page = page_ids[t.y + pi];
      const int r = j - pi * pc.page_size;
      const uint kb = pc.k_off + uint(page) * pc.k_sp + uint(r) * pc.k_sr + uint(hk) * pc.k_sh;
      float dot = 0.0;
      for (int d = 0; d < pc.D; ++d) dot += q_s[d] * k_elem(kb + uint(d));
      p_s[tid] = paged_logit(dot * k_scale_of(page, r, hk));
      vrow_s[tid] = pc.v_off + uint(page) * pc.v_sp + uint(r) * pc.v_sr + uint(hk) * pc.v_sh;
      vscale_s[tid] = v_scale_of(page, r, hk);
    }
    barrier();
    if (tid == 0) {
      // A NaN logit makes its weight NaN whatever max() returns; +inf gives m = inf and NaN
      // weights (inf - inf); -inf gives weight 0.
      float bm = NEG_BIG;
      for (int u = 0; u < nj; ++u) bm = max(bm, p_s[u]);
      const float m_new = max(m, bm);
      const float alpha = exp(m - m_new);
      l *= alpha;
      for (int u = 0; u < nj; ++u) {
        const float p = exp(p_s[u] - m_new);
        p_s[u] = p;
        l += p;
      }
      m = m_new;
      alpha_s = alpha;
    }
    barrier();
    const float alpha = alpha_s;
    for (int c = 0; c < ACC; ++c) {
      const int d = tid + c * WG;
      if (d >= pc.Dv) break;
      float a = alpha != 1.0 ? acc[c] * alpha : acc[c];
      for (int u = 0; u < nj; ++u) {
        const float p = p_s[u];
        if (p != 0.0) a += (p * vscale_s[u]) * v_elem(vrow_s[u] + uint(d));  // weight 0: v never multiplied
      }
      acc[c] = a;
    }
    barrier();  // p_s / vrow_s are rewritten by the next block
  }

  const uint stride = uint(pc.Dv + 2);
  const uint base = (item * uint(pc.Hq) + uint(h)) * stride;
  for (int c = 0; c < ACC; ++c) {
    const int d = tid + c * WG;
    if (d >= pc.Dv) break;
    partials[base + uint(d)] = acc[c];
  }
  if (tid == 0) {
    partials[base + uint(pc.Dv)] = m;
    partials[base + uint(pc.Dv) + 1u] = l;
  }
}
