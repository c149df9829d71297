// What the paged passes (paged_attn.comp, paged_merge.comp) share: bindings, push constants,
// element loads and the logit. Self-contained on purpose (it includes none of attn_io.glsl /
// mask_rules.glsl): the paged work list has its own layouts and needs no mask evaluation.
//
// Buffer layouts (built by vk_paged.cpp):
//   q       [N, Hq, D] in DTYPE at q_off + n*q_sn + h*q_sh + d (a packed upload or a device view)
//   k_pages [P, page_size, Hkv, D], v_pages [P, page_size, Hkv, Dv] in KVTYPE at
//           off + page*sp + row*sr + head*sh + d (the pools read in place when device-resident)
//           All three are read as raw uint words (16-bit values two to a word, element e in the
//           low half when e is even; 8-bit codes four to a word, element e in byte e % 4): no
//           16- or 8-bit storage feature needed.
//   k_scales, v_scales [P, page_size, Hkv] f32 (8-bit pools, per token) at
//           off + page*sp + row*sr + head*sh; per tensor: pc.k_scale / pc.v_scale
//   page_ids  i32: the pages of every sequence, ceil(kv_len / page_size) each, one after another
//   tasks     ivec4 per task: (q row n, index of the sequence's first page in page_ids, kv_begin,
//             kv_end). Every key of [kv_begin, kv_end) is visible to row n (the host clipped the
//             range to the row's causal / window / chunk interval), so no mask is evaluated here.
//   partials  [task, Hq, Dv + 2] f32: the unnormalised accumulator, then m and l
//   row_tasks ivec2 per q row: (first partial slot, count); the row's slots are consecutive, key
//             order (a tile row: its one task's; a stream row: one per split of its sequence)
//   row_lohi  ivec2 per q row: the keys [lo, hi) it sees (paged_decode masks the others)
//   units     2 ivec4 per paged_decode unit: (q_begin, q_len, first page index, split) and
//             (kv_begin, kv_end, first row, 0): the rows [first row, + R) of one split of a stream
//             sequence (row g * q_len + i: q head hk * group + g, query i)
//   sinks [Hq] f32;  out [N, Hq, Dv] f32;  lse [N, Hq] f32
//
// Non-finite values follow the library's policy (README): NaN / +inf logits make the row NaN, a
// -inf logit is a mask, keys of weight 0 add nothing (their v is never multiplied), a row with no
// visible key gives 0 and lse -inf, a +inf sink takes all the mass.
#extension GL_GOOGLE_include_directive : require

layout(std430, set = 0, binding = 0) readonly buffer QBuf { uint q_w[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBuf { uint k_w[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBuf { uint v_w[]; };
layout(std430, set = 0, binding = 3) readonly buffer PageBuf { int page_ids[]; };
layout(std430, set = 0, binding = 4) readonly buffer TaskBuf { ivec4 tasks[]; };
layout(std430, set = 0, binding = 5) buffer PartialBuf { float partials[]; };
layout(std430, set = 0, binding = 6) readonly buffer RowTaskBuf { ivec2 row_tasks[]; };
layout(std430, set = 0, binding = 7) readonly buffer SinkBuf { float sinks_f32[]; };
layout(std430, set = 0, binding = 8) writeonly buffer OutBuf { float out_f32[]; };
layout(std430, set = 0, binding = 9) writeonly buffer LseBuf { float lse_f32[]; };
layout(std430, set = 0, binding = 10) readonly buffer KScaleBuf { float k_scales[]; };
layout(std430, set = 0, binding = 11) readonly buffer VScaleBuf { float v_scales[]; };
layout(std430, set = 0, binding = 12) readonly buffer RowRangeBuf { ivec2 row_lohi[]; };
layout(std430, set = 0, binding = 13) readonly buffer UnitBuf { ivec4 units[]; };
// 16-byte views of the pools (paged_decode's vector loads; the same buffers as k_w / v_w).
layout(std430, set = 0, binding = 1) readonly buffer KVec { uvec4 k_vec[]; };
layout(std430, set = 0, binding = 2) readonly buffer VVec { uvec4 v_vec[]; };
layout(std430, set = 0, binding = 1) readonly buffer KVec2 { uvec2 k_vec2[]; };
layout(std430, set = 0, binding = 2) readonly buffer VVec2 { uvec2 v_vec2[]; };

// Must match struct PagedPush in vk_paged.cpp (std430 scalars, 4 bytes each).
layout(push_constant) uniform PagedPush {
  int Hq, group, D, Dv, page_size;
  float scale, soft_cap;
  uint flags;
  uint q_off, q_sn, q_sh;
  uint k_off, k_sp, k_sr, k_sh;
  uint v_off, v_sp, v_sr, v_sh;
  uint num_items;  // tasks (paged_attn), units (paged_decode) or q rows (paged_merge)
  uint fold;       // workgroups along y: item = gl_WorkGroupID.y + gl_WorkGroupID.z * fold
  float k_scale, v_scale;
  uint ks_off, ks_sp, ks_sr, ks_sh;
  uint vs_off, vs_sp, vs_sr, vs_sh;
}
pc;

layout(constant_id = 0) const uint DTYPE = 0u;   // q: 0 f32, 1 f16, 2 bf16
layout(constant_id = 1) const uint KVTYPE = 0u;  // the pools: 0 f32, 1 f16, 2 bf16, 3 int8, 4 fp8_e4m3
layout(constant_id = 2) const uint SCALES = 0u;  // 0 none (float pools), 1 per token, 2 per tensor

const uint PFLAG_SOFT_CAP = 1u;
const uint PFLAG_SINKS = 2u;
const uint PFLAG_LSE = 4u;
bool has_flag(uint f) { return (pc.flags & f) != 0u; }

const float NEG_BIG = -3.0e38;  // "no logit yet"; finite so that no inf - inf can arise
#define NEG_INF uintBitsToFloat(0xff800000u)

// An e4m3fn code's value (exact; NaN for S.1111.111): the code shifted into an f16 pattern is the
// value x 2^-8 (normals and subnormals alike).
float fp8_value(uint b) {
  if ((b & 0x7fu) == 0x7fu) return uintBitsToFloat(0x7fc00000u);
  return unpackHalf2x16(((b & 0x7fu) << 7) | ((b & 0x80u) << 8)).x * 256.0;
}
float code_value(uint b) {  // byte b of an 8-bit pool (KVTYPE 3 or 4)
  return KVTYPE == 3u ? float(int(b << 24) >> 24) : fp8_value(b);
}

// Element e of a buffer of dtype t (0 f32, 1 f16, 2 bf16) read as uint words.
float elem_of(uint w, uint e, uint t) {
  if (t == 0u) return uintBitsToFloat(w);
  const uint h = (e & 1u) != 0u ? (w >> 16) : (w & 0xffffu);
  if (t == 1u) return unpackHalf2x16(h).x;
  return uintBitsToFloat(h << 16);
}
float q_elem(uint e) { return elem_of(q_w[DTYPE == 0u ? e : e >> 1], e, DTYPE); }
// Element e of a pool: its value (float pools) or its code's value (8-bit pools, scale 1).
float pool_elem(uint w_at_e, uint e) {
  if (KVTYPE >= 3u) return code_value((w_at_e >> (8u * (e & 3u))) & 0xffu);
  return elem_of(w_at_e, e, KVTYPE);
}
uint pool_word(uint e) { return KVTYPE == 0u ? e : KVTYPE <= 2u ? e >> 1 : e >> 2; }
float k_elem(uint e) { return pool_elem(k_w[pool_word(e)], e); }
float v_elem(uint e) { return pool_elem(v_w[pool_word(e)], e); }
// The scale of (page, row, kv head) of each pool (1 for float pools).
float k_scale_of(int page, int row, int hk) {
  if (SCALES == 0u) return 1.0;
  if (SCALES == 2u) return pc.k_scale;
  return k_scales[pc.ks_off + uint(page) * pc.ks_sp + uint(row) * pc.ks_sr + uint(hk) * pc.ks_sh];
}
float v_scale_of(int page, int row, int hk) {
  if (SCALES == 0u) return 1.0;
  if (SCALES == 2u) return pc.v_scale;
  return v_scales[pc.vs_off + uint(page) * pc.vs_sp + uint(row) * pc.vs_sr + uint(hk) * pc.vs_sh];
}

// The logit from the raw dot product: scale, then the soft cap (tanh clamped: tanh(15) rounds to
// 1 in fp32, and some implementations give inf / inf = NaN for large |x|; NaN stays NaN).
float paged_logit(float dot) {
  float s = dot * pc.scale;
  if (has_flag(PFLAG_SOFT_CAP)) {
    const float x = s / pc.soft_cap;
    s = isnan(x) ? x : pc.soft_cap * tanh(clamp(x, -15.0, 15.0));
  }
  return s;
}
