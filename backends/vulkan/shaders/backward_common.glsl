// Shared declarations of the backward shaders (backward_dq.comp, backward_dkdv.comp,
// backward_dsinks.comp): FlashAttention-2's backward, split like the CPU kernel
// (backends/cpu/tiled_backward.cpp) into a dq pass that owns query rows and a dk/dv pass that
// owns keys, so that every gradient element is written by one invocation in a fixed order: no
// atomics, results identical run to run.
//
// Per query row i (lz_i: the log of the softmax denominator, sink included; Delta_i the row term):
//   Delta_i = rowsum(dout_i * out_i)        lz_i = lse_i, or logaddexp(lse_i, sink_h) with sinks
//   x_ij = scale q_i.k_j -> cap tanh(x / cap) (soft cap) -> + bias      P_ij = exp(x_ij - lz_i)
//   dP_ij = dout_i . v_j       dS_ij = P_ij (dP_ij - Delta_i)  [* (1 - tanh^2) through the cap]
//   dq_i = scale sum_j dS_ij k_j    dk_j = scale sum_i dS_ij q_i    dv_j = sum_i P_ij dout_i
//   dbias_ij = P_ij (dP_ij - Delta_i) (before the cap's factor)
//   dsinks_h = -sum_i exp(sink_h - lz_i) Delta_i
// A fully masked row has lse = -inf: lz = +inf, Delta = 0, and it is skipped (zero gradients).
// The non-finite policy (README "Gradients"): a masked pair -- static mask, segment ids, or a
// logit of -inf -- contributes nothing, even where q_i, k_j, v_j or dout_i hold NaN or inf: it is
// skipped, and the four-at-a-time paths read its operand rows as zero bits (axpy4's `live`).
// Visible pairs follow IEEE arithmetic, so a NaN row (lse NaN) spreads NaN where the sums put it.
//
// The tiles are those of the forward (BQ = BK = 32, the block map of vk_tile_plan.h): the dq pass
// walks a q block's row of the map, the dk/dv pass a kv block's column (an index built on the
// host). Empty tiles are never listed, full tiles evaluate no mask, partial tiles evaluate the
// causal / window / chunk parameters (FLAG_PARAM_MASK) or read the tile's bitset: one uint per
// local row (dq: bit c = key c) or per local column (dk/dv: the transposed bitset, bit r = row r).
//
// Buffer layouts (packed by vk_backward.cpp; q/k/v/dout/out in DTYPE, read as raw uint words,
// 16-bit values two to a word, element e in the low half when e is even; padded to 16 bytes):
//   q [B, Tq, Hq, D]  k [B, Tk, Hkv, D]  v [B, Tk, Hkv, Dv]  dout, out [B, Tq, Hq, Dv]
//   lse [B, Hq, Tq] f32 (the forward's)   sinks [Hq] f32   seg_q [B, Tq], seg_kv [B, Tk] i32
//   bias f32, element (b, h, i, j) at b*bias_stride_b + h*bias_stride_h + i*Tk + j
//   stats [2][B, Hq, Tq] f32: lz, then Delta (written by the dq pass, read by the later passes)
//   map_start [heads * n + 1]: the tiles of (head copy hh, block x) are map_entries[map_start[hh*n+x] ..
//             map_start[hh*n+x+1]), n = nq (dq: rows of the map) or nk (dk/dv: its columns)
//   map_entries uvec2 per tile: (other block << 1 | 1 when full, bitset index or 0xffffffff)
//   map_bits  per distinct partial bitset, 32 uint words (dq: rows, dk/dv: columns) of
//             `words` uints each (the BlockMap's uint64 words as little-endian uint pairs)
//   dq [B, Tq, Hq, D], dk [B, Tk, Hkv, D], dv [B, Tk, Hkv, Dv], dbias [bias_B, bias_H, Tq, Tk],
//   dsinks [Hq]: f32 (the host rounds dq / dk / dv to the storage dtype)
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;                 // 32 rows (dq) / keys (dk/dv) per workgroup
layout(constant_id = 1) const uint DTYPE = 0u;  // 0 f32, 1 f16, 2 bf16
layout(constant_id = 2) const int DMAX = 64;    // >= max(D, Dv), a multiple of 8: private arrays
layout(constant_id = 3) const int TILE = 32;    // the map's bq = bk (one uint of bits per row / column)

layout(std430, set = 0, binding = 0) readonly buffer QBuf { uvec4 q_vec[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBuf { uvec4 k_vec[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBuf { uvec4 v_vec[]; };
layout(std430, set = 0, binding = 3) readonly buffer DoutBuf { uvec4 g_vec[]; };
layout(std430, set = 0, binding = 4) readonly buffer BiasBuf { float bias_f32[]; };
layout(std430, set = 0, binding = 5) readonly buffer SegQBuf { int seg_q[]; };
layout(std430, set = 0, binding = 6) readonly buffer SegKvBuf { int seg_kv[]; };
layout(std430, set = 0, binding = 7) readonly buffer MapStartBuf { uint map_start[]; };
layout(std430, set = 0, binding = 8) readonly buffer MapEntryBuf { uvec2 map_entries[]; };
layout(std430, set = 0, binding = 9) readonly buffer MapBitsBuf { uint map_bits[]; };
layout(std430, set = 0, binding = 10) buffer StatsBuf { float stats[]; };
// Bindings 11.. are each pass's own.

// Must match struct BackwardPush in vk_backward.cpp (std430 scalars, 4 bytes each).
layout(push_constant) uniform BackwardPush {
  int B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale;
  float soft_cap;  // > 0 when FLAG_SOFT_CAP
  uint flags;
  int win_left, win_right;  // FLAG_PARAM_MASK: < 0 = no bound on that side
  int chunk;                // FLAG_PARAM_MASK: > 0 = chunked causal
  uint bias_stride_b, bias_stride_h;
  int bias_B, bias_H;       // dbias's shape [bias_B, bias_H, Tq, Tk]
  int map_heads;            // 1 or Hq
  int nq, nk;               // q / kv blocks
  int words;                // uint words per bitset row (dq) or column (dk/dv)
  int loop_b, loop_h;       // dk/dv: one invocation walks every batch / kv head (broadcast dbias)
}
pc;

#include "mask_rules.glsl"  // FLAG_VEC here: D and Dv are multiples of VEC_ELEMS

const int VEC_ELEMS = DTYPE == 0u ? 4 : 8;  // elements of one 16-byte vector

// Elements 2c and 2c+1 of a vector of 16-bit values, as floats.
vec2 unpack_pair(uint w) {
  if (DTYPE == 1u) return unpackHalf2x16(w);
  return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));
}

// Element e of a packed buffer, as float.
#define DEFINE_LOAD(NAME, VEC)                                     \
  float NAME(uint e) {                                             \
    if (DTYPE == 0u) return uintBitsToFloat(VEC[e >> 2][e & 3u]);  \
    uint w = VEC[e >> 3][(e >> 1) & 3u];                           \
    uint h = ((e & 1u) != 0u) ? (w >> 16) : (w & 0xffffu);         \
    if (DTYPE == 1u) return unpackHalf2x16(h).x;                   \
    return uintBitsToFloat(h << 16);                               \
  }

// NAME(base): the private array ARR (module scope: GLSL passes arrays by value) = the row of N
// elements at element `base` of a packed buffer, read with LOAD.
#define DEFINE_FILL(NAME, ARR, N, LOAD)                    \
  void NAME(uint base) {                                   \
    for (int d = 0; d < N; ++d) ARR[d] = LOAD(base + uint(d)); \
  }

// Row operations between a private array ARR and rows of N elements of the packed buffer VEC
// (streamed past it), at element offsets `base`:
//   dot_SUFFIX(base) = ARR . row             axpy_SUFFIX(w, base): ARR += w * row
//   dot4_SUFFIX(bases) = ARR . row_c, c < 4  axpy4_SUFFIX(w, bases, live): ARR += sum_c w[c] * row_c
//                                            over the rows c whose bit is set in `live`
// axpy4 reads the rows of the other lanes as zero bits (an integer mask, which no compiler may
// fold): a masked pair's row never enters the sum, even as 0 x NaN or 0 x inf.
// The four-row forms need FLAG_VEC (every base a multiple of VEC_ELEMS, rows read 16 bytes at a
// time) and read each element of ARR once per four rows instead of once per row (private arrays
// live in memory on most implementations), as the forward's dot_qk4 / add_weighted_v4.
#define DEFINE_ROW_OPS(SUFFIX, ARR, VEC, N, LOAD)                                                    \
  float dot_##SUFFIX(uint base) {                                                                    \
    float sum = 0.0;                                                                                 \
    for (int d = 0; d < N; ++d) sum += ARR[d] * LOAD(base + uint(d));                                \
    return sum;                                                                                      \
  }                                                                                                  \
  void axpy_##SUFFIX(float w, uint base) {                                                           \
    for (int d = 0; d < N; ++d) ARR[d] += w * LOAD(base + uint(d));                                  \
  }                                                                                                  \
  vec4 dot4_##SUFFIX(uvec4 bases) {                                                                  \
    vec4 sum = vec4(0.0);                                                                            \
    const uvec4 at = bases / uint(VEC_ELEMS);                                                        \
    for (int d = 0; d < N; d += VEC_ELEMS) {                                                         \
      const uint o = uint(d / VEC_ELEMS);                                                            \
      const uvec4 w0 = VEC[at.x + o], w1 = VEC[at.y + o], w2 = VEC[at.z + o], w3 = VEC[at.w + o];    \
      if (DTYPE == 0u) {                                                                             \
        const vec4 a = vec4(ARR[d], ARR[d + 1], ARR[d + 2], ARR[d + 3]);                             \
        sum += vec4(dot(a, uintBitsToFloat(w0)), dot(a, uintBitsToFloat(w1)), dot(a, uintBitsToFloat(w2)), \
                    dot(a, uintBitsToFloat(w3)));                                                    \
      } else {                                                                                       \
        for (int c = 0; c < 4; ++c) {                                                                \
          const vec2 a = vec2(ARR[d + 2 * c], ARR[d + 2 * c + 1]);                                   \
          sum += vec4(dot(a, unpack_pair(w0[c])), dot(a, unpack_pair(w1[c])), dot(a, unpack_pair(w2[c])), \
                      dot(a, unpack_pair(w3[c])));                                                   \
        }                                                                                            \
      }                                                                                              \
    }                                                                                                \
    return sum;                                                                                      \
  }                                                                                                  \
  void axpy4_##SUFFIX(vec4 w, uvec4 bases, uint live) {                                              \
    const uvec4 at = bases / uint(VEC_ELEMS);                                                        \
    const uvec4 keep = uvec4(notEqual(uvec4(live) & uvec4(1u, 2u, 4u, 8u), uvec4(0u))) * 0xffffffffu; \
    for (int d = 0; d < N; d += VEC_ELEMS) {                                                         \
      const uint o = uint(d / VEC_ELEMS);                                                            \
      const uvec4 x0 = VEC[at.x + o] & keep.x, x1 = VEC[at.y + o] & keep.y, x2 = VEC[at.z + o] & keep.z, \
                  x3 = VEC[at.w + o] & keep.w;                                                       \
      if (DTYPE == 0u) {                                                                             \
        vec4 a = vec4(ARR[d], ARR[d + 1], ARR[d + 2], ARR[d + 3]);                                   \
        a += w.x * uintBitsToFloat(x0) + w.y * uintBitsToFloat(x1) + w.z * uintBitsToFloat(x2) +     \
             w.w * uintBitsToFloat(x3);                                                              \
        ARR[d] = a.x;                                                                                \
        ARR[d + 1] = a.y;                                                                            \
        ARR[d + 2] = a.z;                                                                            \
        ARR[d + 3] = a.w;                                                                            \
      } else {                                                                                       \
        for (int c = 0; c < 4; ++c) {                                                                \
          const vec2 a = vec2(ARR[d + 2 * c], ARR[d + 2 * c + 1]) + w.x * unpack_pair(x0[c]) +       \
                         w.y * unpack_pair(x1[c]) + w.z * unpack_pair(x2[c]) + w.w * unpack_pair(x3[c]); \
          ARR[d + 2 * c] = a.x;                                                                      \
          ARR[d + 2 * c + 1] = a.y;                                                                  \
        }                                                                                            \
      }                                                                                              \
    }                                                                                                \
  }

DEFINE_LOAD(load_q, q_vec)
DEFINE_LOAD(load_k, k_vec)
DEFINE_LOAD(load_v, v_vec)
DEFINE_LOAD(load_g, g_vec)

// Element offsets of rows of the packed buffers.
uint q_row(int b, int i, int h) { return uint(((b * pc.Tq + i) * pc.Hq + h) * pc.D); }
uint g_row(int b, int i, int h) { return uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv); }
uint k_row(int b, int j, int hk) { return uint(((b * pc.Tk + j) * pc.Hkv + hk) * pc.D); }
uint v_row(int b, int j, int hk) { return uint(((b * pc.Tk + j) * pc.Hkv + hk) * pc.Dv); }

// stats: lz of row (b, h, i) at stat_index, Delta B*Hq*Tq floats later.
uint stat_index(int b, int h, int i) { return uint((b * pc.Hq + h) * pc.Tq + i); }
uint delta_offset() { return uint(pc.B * pc.Hq * pc.Tq); }

const float TANH_CLAMP = 15.0;  // as the forward: tanh(15) rounds to 1 in fp32

// The logit of (row i, key j) from the raw dot product q_i.k_j, as the forward computes it
// (scale, soft cap, bias); t = tanh(scale dot / cap) for the cap's chain rule (0 without a cap).
float logit(float dot_qk, int b, int h, int i, int j, out float t) {
  float x = dot_qk * pc.scale;
  t = 0.0;
  if (has(FLAG_SOFT_CAP)) {
    // clamp of NaN is undefined: a NaN stays NaN (and so does its chain-rule factor).
    t = is_nan_bits(x) ? x : tanh(clamp(x / pc.soft_cap, -TANH_CLAMP, TANH_CLAMP));
    x = pc.soft_cap * t;
  }
  if (has(FLAG_BIAS)) x += bias_f32[uint(b) * pc.bias_stride_b + uint(h) * pc.bias_stride_h + uint(i * pc.Tk + j)];
  return x;
}

