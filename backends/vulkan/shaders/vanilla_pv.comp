#version 450
// Vanilla, pass 3 of 3: out = P V as a tiled GEMM over the non-empty tiles of the block map
// (P = scratch [B, Hq, Tq, Tk], the weights; unlisted tiles are all 0 and skipped). A workgroup
// owns a 32-row x 32-column block of out for one (head, batch); per listed kv tile it stages P
// [32 x 32] and V [32 keys x 32 columns] in shared memory and each invocation accumulates a
// 4 x 4 block in registers. A key's value is multiplied in only where P != 0, so that NaN/Inf in
// the v of a key of weight 0 never leaks. That is every tile, not only the partial ones: a key of
// a full tile has weight 0 when segment ids mask it, when its logit is -inf (a bias, an infinite
// q or k) and when a +inf sink takes all the mass. gl_WorkGroupID = (q block * column blocks +
// column block, q head, batch).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#include "attn_io.glsl"

layout(local_size_x = 8, local_size_y = 8) in;
layout(constant_id = 0) const uint DTYPE = 0u;

const int TM = 32, TK = 32, TN = 32;  // rows, keys, output columns
shared float ps[TM][TK + 1];
shared float vsh[TK][TN + 1];

void main() {
  const int ncol = (pc.Dv + TN - 1) / TN;
  const int qb = int(gl_WorkGroupID.x) / ncol, cb = int(gl_WorkGroupID.x) % ncol;
  const int h = int(gl_WorkGroupID.y), b = int(gl_WorkGroupID.z);
  const int hk = h / (pc.Hq / pc.Hkv);
  const int tx = int(gl_LocalInvocationID.x), ty = int(gl_LocalInvocationID.y);
  const int tid = ty * 8 + tx;
  const int i0 = qb * TM, c0 = cb * TN;
  const int hh = pc.map_heads > 1 ? h : 0;
  const int e0 = int(row_start[hh * pc.nq + qb]), e1 = int(row_start[hh * pc.nq + qb + 1]);

  float acc[4][4];
  [[unroll]] for (int r = 0; r < 4; ++r)
    [[unroll]] for (int c = 0; c < 4; ++c) acc[r][c] = 0.0;
  for (int e = e0; e < e1; ++e) {
    const uint entry = entries[e];
    const int j0 = int(entry >> 1) * TK;
    barrier();
    for (int x = tid; x < TM * TK; x += 64) {
      const int r = x / TK, c = x % TK;
      const int i = i0 + r, j = j0 + c, d = c0 + c;
      ps[r][c] = (i < pc.Tq && j < pc.Tk) ? scratch[uint((b * pc.Hq + h) * pc.Tq + i) * uint(pc.Tk) + uint(j)] : 0.0;
      // Row r of the V tile is key j0 + r; column c is output column c0 + c.
      const int jv = j0 + r;
      vsh[r][c] = (jv < pc.Tk && d < pc.Dv) ? v_elem(v_at(b, jv, hk) + uint(d), DTYPE) : 0.0;
    }
    barrier();
    [[unroll]] for (int k = 0; k < TK; ++k) {
      float a[4], bv[4];
      [[unroll]] for (int r = 0; r < 4; ++r) a[r] = ps[4 * ty + r][k];
      [[unroll]] for (int c = 0; c < 4; ++c) bv[c] = vsh[k][4 * tx + c];
      [[unroll]] for (int r = 0; r < 4; ++r)
        [[unroll]] for (int c = 0; c < 4; ++c)
          acc[r][c] += a[r] * weighted_value(a[r], bv[c]);  // weight 0: nothing
    }
  }
  [[unroll]] for (int r = 0; r < 4; ++r) {
    const int i = i0 + 4 * ty + r;
    if (i >= pc.Tq) continue;
    [[unroll]] for (int c = 0; c < 4; ++c) {
      const int d = c0 + 4 * tx + c;
      if (d < pc.Dv) out_f32[uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv + d)] = acc[r][c];
    }
  }
}
