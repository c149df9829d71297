// What every attention shader shares: descriptor bindings, push constants, flags, element loads,
// the static-mask helpers and the logit. Included by flash.comp (through common.glsl),
// flash_tiled.comp, flash_coopmat.comp, attn_merge.comp and the vanilla_*.comp passes.
//
// Buffer layouts (row-major; built by vk_attention.cpp):
//   q     [B, Tq, Hq, D]  k [B, Tk, Hkv, D]  v [B, Tk, Hkv, Dv]   in DTYPE (f32/f16/bf16), at
//         the element offsets and batch / token strides of the push constants (heads packed, d
//         contiguous): packed host uploads have offset 0 and strides (T*H*D, H*D); device views
//         (a KV-cache slice) are read in place with their own. Read as raw uint words (16-bit
//         values two to a word, element e in the low half when e is even) so that no 16-bit
//         storage feature is needed; buffers padded to 16 bytes. q_at / k_at / v_at address them.
//   out   [B, Tq, Hq, Dv] f32, packed (the host rounds to the storage dtype, bit-exact RNE, or
//         convert.comp does for a 16-bit device output)
//   lse   [B, Hq, Tq] f32
//   bias  f32, element (b, h, i, j) at b*bias_stride_b + h*bias_stride_h + i*Tk + j
//   sinks [Hq] f32;  seg_q [B, Tq], seg_kv [B, Tk] i32
//   block map (BlockMap of backends/common/block_map_impl.h with bq = pc.q_rows rows for the
//   tiled kernels, bk = the kernel's kv tile):
//     row_start [heads*nq + 1]: tiles of (head copy hh, q block qb) are
//               entries[row_start[hh*nq+qb] .. row_start[hh*nq+qb+1]), increasing kv order
//     entries   one uint per non-empty tile: kv block << 1 | 1 when full (no mask evaluated),
//               kv block << 1 when partial; partial tiles list their bitset in part_index
//     part_index one int per entry: index of the partial tile's bitset (-1 when full)
//     bits      per unique partial bitset, bq rows of words_per_row uint words (the uint64
//               words of BlockMap read as little-endian uint pairs): local column c of local
//               row r is bit (c & 31) of word r*words_per_row + (c >> 5)
//   scratch   per kernel: vanilla's scores/probabilities [B, Hq, Tq, Tk] f32 (= the weights);
//             split-KV partials [B, Hq, Tq, nsplit, Dv + 2] f32 (o unnormalised, m, l)
// Unused bindings are bound to a small dummy buffer; flags say what is present.
//
// Non-finite values (the library's policy): NaN/Inf in q, k, v reach exactly the rows that see
// those keys; masked keys contribute nothing (their values are never multiplied in); a -inf
// logit is a mask; a row whose every logit is masked or -inf gives out 0 and lse -inf; a +inf
// sink takes all the mass (out 0).
#extension GL_GOOGLE_include_directive : require

layout(std430, set = 0, binding = 0) readonly buffer QBuf { uvec4 q_vec[]; };
layout(std430, set = 0, binding = 0) readonly buffer QBufW { uint q_w[]; };
layout(std430, set = 0, binding = 0) readonly buffer QBufW2 { uvec2 q_w2[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBuf { uvec4 k_vec[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBufW { uint k_w[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBufW2 { uvec2 k_w2[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBuf { uvec4 v_vec[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBufW { uint v_w[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBufW2 { uvec2 v_w2[]; };
layout(std430, set = 0, binding = 3) buffer OutBuf { float out_f32[]; };
layout(std430, set = 0, binding = 3) buffer OutBufU { uint out_u32[]; };
layout(std430, set = 0, binding = 4) writeonly buffer LseBuf { float lse_f32[]; };
layout(std430, set = 0, binding = 4) writeonly buffer LseBufU { uint lse_u32[]; };
layout(std430, set = 0, binding = 5) readonly buffer BiasBuf { float bias_f32[]; };
layout(std430, set = 0, binding = 6) readonly buffer SinkBuf { float sinks_f32[]; };
layout(std430, set = 0, binding = 7) readonly buffer SegQBuf { int seg_q[]; };
layout(std430, set = 0, binding = 8) readonly buffer SegKvBuf { int seg_kv[]; };
layout(std430, set = 0, binding = 9) readonly buffer RowStartBuf { uint row_start[]; };
layout(std430, set = 0, binding = 10) readonly buffer EntryBuf { uint entries[]; };
layout(std430, set = 0, binding = 11) readonly buffer PartBuf { int part_index[]; };
layout(std430, set = 0, binding = 12) readonly buffer BitsBuf { uint bits[]; };
layout(std430, set = 0, binding = 13) buffer ScratchBuf { float scratch[]; };
layout(std430, set = 0, binding = 13) buffer ScratchBufU { uint scratch_u32[]; };

// Must match struct PushConstants in vk_launch.h (std430 scalars, 4 bytes each; 124 of the
// runtime's 128 bytes).
layout(push_constant) uniform PushConstants {
  int B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale;
  float soft_cap;  // > 0 when FLAG_SOFT_CAP
  uint flags;
  int win_left, win_right;  // FLAG_PARAM_MASK: < 0 = no bound on that side
  int chunk;                // FLAG_PARAM_MASK: > 0 = chunked causal
  uint bias_stride_b, bias_stride_h;
  int map_heads;      // 1 or Hq
  int nq;             // q blocks of the map
  int words_per_row;  // uint words per bitset row
  uint q_off, k_off, v_off;                 // element offsets of q / k / v in their buffers
  uint q_sb, q_st, k_sb, k_st, v_sb, v_st;  // batch and token strides, in elements
  int q_rows;         // query positions per workgroup (= the map's bq)
  int head_rows;      // q heads per workgroup (tiled kernels; they share one kv head)
  int nsplit;         // kv splits per row (split-KV), 1 = none
  int kv_block;       // keys per kv tile (= the map's bk)
}
pc;

#include "mask_rules.glsl"

// The finite sentinel of the running max: "no logit yet", and the value a masked key takes in a
// max. Masking itself is never done by arithmetic on a sentinel or an infinity: masked keys are
// kept out by integer visibility bits (their weight is set to 0), so no inf - inf can arise and no
// result rests on how a compiler treats infinities.
const float NEG_BIG = -3.0e38;

// The non-finite policy of a visible key's logit x (bits only, see mask_rules.glsl):
//   LOGIT_LIVE    finite: takes part in the softmax
//   LOGIT_MASKED  -inf: a mask (weight 0, as a key the static mask hides)
//   LOGIT_POISON  NaN or +inf: the row's output and lse are NaN
const uint LOGIT_LIVE = 0u, LOGIT_MASKED = 1u, LOGIT_POISON = 2u;
uint logit_class(float x) {
  const uint u = floatBitsToUint(x);
  return (u & 0x7f800000u) != 0x7f800000u ? LOGIT_LIVE : u == 0xff800000u ? LOGIT_MASKED : LOGIT_POISON;
}

// v where the weight p is not +-0, else 0 (an integer mask on v's bits): a key of weight 0 adds
// nothing, not even 0 x NaN or 0 x inf.
vec4 weighted_value(float p, vec4 v) {
  return uintBitsToFloat(floatBitsToUint(v) & uvec4((floatBitsToUint(p) << 1) != 0u ? 0xffffffffu : 0u));
}
float weighted_value(float p, float v) {
  return uintBitsToFloat(floatBitsToUint(v) & ((floatBitsToUint(p) << 1) != 0u ? 0xffffffffu : 0u));
}

// The end of a row (backends/common/softmax_policy.h): out = acc * factor, lse over the visible
// keys. m: the max of the live logits, l: the sum of exp(x - m) over them, poisoned: a NaN or +inf
// logit was seen. A fully masked row (l == 0) gives 0 and lse -inf; a poisoned row NaN; a sink
// joins the denominator only, evaluated relative to max(m, sink) so that neither exponential
// overflows: a +inf sink gives 0, a NaN sink NaN. Special results are written as integer bits
// (out_u32, lse_u32, scratch_u32) by the callers, never computed.
const uint NAN_BITS = 0x7fc00000u, NEG_INF_BITS = 0xff800000u;
bool sink_poisons(int h) { return has(FLAG_SINKS) && is_nan_bits(sinks_f32[h]); }
float row_factor(float m, float l, int h) {
  if (l == 0.0) return 0.0;
  if (!has(FLAG_SINKS)) return 1.0 / l;
  const float a = sinks_f32[h];
  if (is_pos_inf_bits(a)) return 0.0;
  if (is_neg_inf_bits(a)) return 1.0 / l;
  if (a > m) {
    const float e = exp(m - a);
    return e / (l * e + 1.0);
  }
  return 1.0 / (l + exp(a - m));
}
// The bits of the row's lse.
uint row_lse_bits(float m, float l, bool poisoned) {
  if (poisoned) return NAN_BITS;
  return l == 0.0 ? NEG_INF_BITS : floatBitsToUint(m + log(l));
}
// The bits of out = acc * factor for a row (a NaN row writes NaN; factor 0, a fully masked row or
// a +inf sink's, writes 0 even where an infinite value made acc inf).
uint out_bits(float acc, float factor, bool poisoned) {
  return poisoned ? NAN_BITS : factor == 0.0 ? 0u : floatBitsToUint(acc * factor);
}

// 16-bit value h (low 16 bits) as float.
float half_bits_to_float(uint h, uint dtype) {
  if (dtype == 1u) return unpackHalf2x16(h).x;
  return uintBitsToFloat(h << 16);
}
// Elements 2c and 2c+1 of a word of 16-bit values, as floats.
vec2 unpack_pair_of(uint w, uint dtype) {
  if (dtype == 1u) return unpackHalf2x16(w);
  return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));
}

// Element e of a q/k/v buffer, and 4 elements e .. e+3 (e % 4 == 0, the 4 inside the buffer's
// row and aligned: FLAG_ALIGNED4), as floats. dtype: 0 f32, 1 f16, 2 bf16.
#define DEFINE_LOADS(X)                                                               \
  float X##_elem(uint e, uint dtype) {                                                \
    if (dtype == 0u) return uintBitsToFloat(X##_w[e]);                                \
    const uint w = X##_w[e >> 1];                                                     \
    return half_bits_to_float((e & 1u) != 0u ? (w >> 16) : (w & 0xffffu), dtype);    \
  }                                                                                   \
  vec4 X##_load4_aligned(uint e, uint dtype) {                                        \
    if (dtype == 0u) return uintBitsToFloat(X##_vec[e >> 2]);                         \
    const uvec2 w = X##_w2[e >> 2];                                                   \
    return vec4(unpack_pair_of(w.x, dtype), unpack_pair_of(w.y, dtype));              \
  }                                                                                   \
  /* Elements row_base + d .. + 3 of a row of n elements; those at or past n read 0. */ \
  vec4 X##_load4(uint row_base, int d, int n, uint dtype) {                           \
    if (has(FLAG_ALIGNED4) && d + 4 <= n) return X##_load4_aligned(row_base + uint(d), dtype); \
    vec4 r = vec4(0.0);                                                               \
    for (int c = 0; c < 4; ++c)                                                       \
      if (d + c < n) r[c] = X##_elem(row_base + uint(d + c), dtype);                  \
    return r;                                                                         \
  }
DEFINE_LOADS(q)
DEFINE_LOADS(k)
DEFINE_LOADS(v)

// Elements d .. d+3 of a row of n elements at element `base` of q / k / v (`which` 0 / 1 / 2);
// elements at or past n read 0. aligned (FLAG_ALIGNED4: every row starts at a multiple of 4
// elements, n too): one 4-element load. The tiled kernels pass their specialization constants.
vec4 qkv_load4(uint which, uint base, int d, int n, bool aligned, uint dtype) {
  if (aligned) {
    if (d >= n) return vec4(0.0);
    const uint e = base + uint(d);
    return which == 0u ? q_load4_aligned(e, dtype) : which == 1u ? k_load4_aligned(e, dtype) : v_load4_aligned(e, dtype);
  }
  vec4 r = vec4(0.0);
  for (int c = 0; c < 4; ++c)
    if (d + c < n) {
      const uint e = base + uint(d + c);
      r[c] = which == 0u ? q_elem(e, dtype) : which == 1u ? k_elem(e, dtype) : v_elem(e, dtype);
    }
  return r;
}

// Element offsets of the q row (b, i, h), and of the k / v rows of key j of kv head hk.
uint q_at(int b, int i, int h) { return pc.q_off + uint(b) * pc.q_sb + uint(i) * pc.q_st + uint(h * pc.D); }
uint k_at(int b, int j, int hk) { return pc.k_off + uint(b) * pc.k_sb + uint(j) * pc.k_st + uint(hk * pc.D); }
uint v_at(int b, int j, int hk) { return pc.v_off + uint(b) * pc.v_sb + uint(j) * pc.v_st + uint(hk * pc.Dv); }

// Visibility of keys j0 .. j0 + nj - 1 (nj <= 32) of tile `entry` for the row at local row r
// of its q block: bit t for key j0 + t. Static mask only (segments: segment_bits).
// [lo, hi): the row's parametric interval (FLAG_PARAM_MASK).
uint static_bits(uint entry, int r, int j0, int nj, int lo, int hi, int rows_per_block) {
  const uint valid = low_bits(nj);
  if ((entries[entry] & 1u) != 0u) return valid;  // full tile
  if (has(FLAG_PARAM_MASK)) return valid & low_bits(hi - j0) & ~low_bits(lo - j0);
  // One bitset word holds the tile's columns (kv tiles of the tiled kernels are <= 32 keys).
  const int part = part_index[entry];
  return valid & bits[uint((part * rows_per_block + r) * pc.words_per_row)];
}

// Keys j0 .. j0 + nj - 1 whose segment id equals seg_i (bit t for key j0 + t).
uint segment_bits(int b, int j0, int nj, int seg_i) {
  uint m = 0u;
  for (int t = 0; t < nj; ++t)
    if (seg_kv[b * pc.Tk + j0 + t] == seg_i) m |= 1u << uint(t);
  return m;
}

// The logit of (q row, key j) from its scaled dot product: soft cap, then bias.
float finish_logit(float s, int b, int h, int i, int j) {
  // tanh is clamped: tanh(15) rounds to 1 in fp32, and some tanh implementations compute
  // (e^x - e^-x) / (e^x + e^-x), which is inf / inf = NaN for large |x|. NaN stays NaN (clamp
  // of NaN is undefined).
  if (has(FLAG_SOFT_CAP)) {
    const float x = s / pc.soft_cap;
    s = is_nan_bits(x) ? x : pc.soft_cap * tanh(clamp(x, -15.0, 15.0));
  }
  if (has(FLAG_BIAS)) s += bias_f32[uint(b) * pc.bias_stride_b + uint(h) * pc.bias_stride_h + uint(i * pc.Tk + j)];
  return s;
}
