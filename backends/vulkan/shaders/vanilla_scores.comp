#version 450
// Vanilla, pass 1 of 3: the scores S = mask(logit(Q K^T)) into scratch [B, Hq, Tq, Tk] f32, as a
// tiled GEMM. A workgroup owns one 32-row q block of one (head, batch) and walks the row of
// 32 x 32 tiles: tiles the block map lists are computed (Q and K staged in shared memory 16
// head-dim elements at a time, each invocation accumulating a 4 x 4 block of S in registers),
// masked entries and unlisted (empty) tiles are written as -inf, which the softmax pass reads as
// weight 0. gl_WorkGroupID = (q block, q head, batch).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "attn_io.glsl"

layout(local_size_x = 8, local_size_y = 8) in;
layout(constant_id = 0) const uint DTYPE = 0u;

const int TM = 32, TN = 32, TD = 16;  // score tile, head-dim step
shared float qs[TM][TD + 1];           // + 1: no bank conflicts on column reads
shared float ks[TN][TD + 1];

void main() {
  const int qb = int(gl_WorkGroupID.x), h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int hk = h / (pc.Hq / pc.Hkv);
  const int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  const int tid = ty * 8 + tx;
  const int i0 = qb * TM;
  const int hh = pc.map_heads > 1 ? h : 0;
  int e = int(row_start[hh * pc.nq + qb]);
  const int e_end = int(row_start[hh * pc.nq + qb + 1]);
  const int nk = (pc.Tk + TN - 1) / TN;

  // This invocation's rows i0 + 4*ty + r and their masks.
  int lo[4], hi[4], seg[4];
  [[unroll]] for (int r = 0; r < 4; ++r) {
    const int i = min(i0 + 4 * ty + r, pc.Tq - 1);
    lo[r] = 0;
    hi[r] = pc.Tk;
    if (has(FLAG_PARAM_MASK)) param_interval(i, lo[r], hi[r]);
    seg[r] = has(FLAG_SEGMENTS) ? seg_q[b * pc.Tq + i] : 0;
  }

  for (int kb = 0; kb < nk; ++kb) {
    const int j0 = kb * TN;
    const int nj = min(TN, pc.Tk - j0);
    const bool listed = e < e_end && int(entries[e] >> 1) == kb;
    float acc[4][4];
    [[unroll]] for (int r = 0; r < 4; ++r)
      [[unroll]] for (int c = 0; c < 4; ++c) acc[r][c] = 0.0;
    if (listed) {
      for (int d0 = 0; d0 < pc.D; d0 += TD) {
        barrier();
        // 32 x 16 elements of Q and of K, 8 per invocation.
        for (int x = tid; x < TM * TD; x += 64) {
          const int r = x / TD, d = d0 + x % TD;
          const int i = i0 + r, j = j0 + r;
          qs[r][x % TD] = (i < pc.Tq && d < pc.D) ? q_elem(q_at(b, i, h) + uint(d), DTYPE) : 0.0;
          ks[r][x % TD] = (j < pc.Tk && d < pc.D) ? k_elem(k_at(b, j, hk) + uint(d), DTYPE) : 0.0;
        }
        barrier();
        [[unroll]] for (int d = 0; d < TD; ++d) {
          float a[4], bv[4];
          [[unroll]] for (int r = 0; r < 4; ++r) a[r] = qs[4 * ty + r][d];
          [[unroll]] for (int c = 0; c < 4; ++c) bv[c] = ks[4 * tx + c][d];
          [[unroll]] for (int r = 0; r < 4; ++r)
            [[unroll]] for (int c = 0; c < 4; ++c) acc[r][c] += a[r] * bv[c];
        }
      }
    }
    [[unroll]] for (int r = 0; r < 4; ++r) {
      const int i = i0 + 4 * ty + r;
      if (i >= pc.Tq) continue;
      const uint vis = listed ? static_bits(uint(e), 4 * ty + r, j0, nj, lo[r], hi[r], TM) : 0u;
      const uint srow = uint(((b * pc.Hq + h) * pc.Tq + i)) * uint(pc.Tk);
      [[unroll]] for (int c = 0; c < 4; ++c) {
        const int t = 4 * tx + c, j = j0 + t;
        if (t >= nj) continue;
        // A masked key holds the bits of -inf, the logit class of a mask (attn_io.glsl): the
        // softmax pass tells classes apart by bits, never by arithmetic on infinities.
        if (((vis >> uint(t)) & 1u) != 0u && (!has(FLAG_SEGMENTS) || seg_kv[b * pc.Tk + j] == seg[r]))
          scratch[srow + uint(j)] = finish_logit(acc[r][c] * pc.scale, b, h, i, j);
        else
          scratch_u32[srow + uint(j)] = NEG_INF_BITS;
      }
    }
    if (listed) ++e;
  }
}
