// What the paged passes (paged_attn.comp, paged_merge.comp) share: bindings, push constants,
// element loads and the logit. Self-contained on purpose (it includes none of attn_io.glsl /
// mask_rules.glsl): the paged work list has its own layouts and needs no mask evaluation.
//
// Buffer layouts (built by vk_paged.cpp):
//   q       [N, Hq, D] in DTYPE at q_off + n*q_sn + h*q_sh + d (a packed upload or a device view)
//   k_pages [P, page_size, Hkv, D], v_pages [P, page_size, Hkv, Dv] in DTYPE at
//           off + page*sp + row*sr + head*sh + d (the pools read in place when device-resident)
//           All three are read as raw uint words (16-bit values two to a word, element e in the
//           low half when e is even): no 16-bit storage feature needed.
//   page_ids  i32: the pages of every sequence, ceil(kv_len / page_size) each, one after another
//   tasks     ivec4 per task: (q row n, index of the sequence's first page in page_ids, kv_begin,
//             kv_end). Every key of [kv_begin, kv_end) is visible to row n (the host clipped the
//             range to the row's causal / window / chunk interval), so no mask is evaluated here.
//   partials  [task, Hq, Dv + 2] f32: the unnormalised accumulator, then m and l
//   row_tasks ivec2 per q row: (first task, count); the row's tasks are consecutive, key order
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

// Must match struct PagedPush in vk_paged.cpp (std430 scalars, 4 bytes each).
layout(push_constant) uniform PagedPush {
  int Hq, group, D, Dv, page_size;
  float scale, soft_cap;
  uint flags;
  uint q_off, q_sn, q_sh;
  uint k_off, k_sp, k_sr, k_sh;
  uint v_off, v_sp, v_sr, v_sh;
  uint num_items;  // tasks (paged_attn) or q rows (paged_merge)
  uint fold;       // workgroups along y: item = gl_WorkGroupID.y + gl_WorkGroupID.z * fold (x: q head)
}
pc;

layout(constant_id = 0) const uint DTYPE = 0u;  // 0 f32, 1 f16, 2 bf16

const uint PFLAG_SOFT_CAP = 1u;
const uint PFLAG_SINKS = 2u;
const uint PFLAG_LSE = 4u;
bool has_flag(uint f) { return (pc.flags & f) != 0u; }

const float NEG_BIG = -3.0e38;  // "no logit yet"; finite so that no inf - inf can arise
#define NEG_INF uintBitsToFloat(0xff800000u)

// Element e of a buffer of DTYPE values read as uint words.
float elem_of(uint w, uint e) {
  if (DTYPE == 0u) return uintBitsToFloat(w);
  const uint h = (e & 1u) != 0u ? (w >> 16) : (w & 0xffffu);
  if (DTYPE == 1u) return unpackHalf2x16(h).x;
  return uintBitsToFloat(h << 16);
}
float q_elem(uint e) { return elem_of(q_w[DTYPE == 0u ? e : e >> 1], e); }
float k_elem(uint e) { return elem_of(k_w[DTYPE == 0u ? e : e >> 1], e); }
float v_elem(uint e) { return elem_of(v_w[DTYPE == 0u ? e : e >> 1], e); }

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
