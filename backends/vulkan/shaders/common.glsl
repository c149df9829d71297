// Shared declarations of the attention shaders (vanilla.comp, flash.comp).
//
// One invocation owns one query row (b, h, i); a workgroup owns one q block of BQ rows of one
// (b, h): gl_WorkGroupID = (q block, q head, batch). No shared memory and no barriers: lavapipe
// runs those slowly, and a row never needs another row's data. Statistics and accumulators are
// fp32 whatever the storage dtype.
//
// Buffer layouts (all tightly packed, row-major; built by vulkan_backend.cpp):
//   q     [B, Tq, Hq, D]  k [B, Tk, Hkv, D]  v [B, Tk, Hkv, Dv]   in DTYPE (f32/f16/bf16), at
//         the offsets and batch/token strides of the push constants (packed for host inputs),
//         read as raw uint words (16-bit values two to a word, element e in the low half when
//         e is even) so no 16-bit storage feature is needed.
//   out   [B, Tq, Hq, Dv] f32 (the host rounds to the storage dtype, bit-exact RNE)
//   lse   [B, Hq, Tq] f32
//   bias  f32, element (b, h, i, j) at b*bias_stride_b + h*bias_stride_h + i*Tk + j
//   sinks [Hq] f32;  seg_q [B, Tq], seg_kv [B, Tk] i32
//   block map (BlockMap of backends/common/block_map_impl.h with bq = BQ, bk = BK):
//     row_start [heads*nq + 1]: blocks of (head copy hh, q block qb) are
//               entries[row_start[hh*nq+qb] .. row_start[hh*nq+qb+1])
//     entries   one uint per non-empty tile: kv block << 1 | 1 when full (no mask evaluated),
//               kv block << 1 when partial; partial tiles list their bitset in part_index
//     part_index one int per entry: index of the partial tile's bitset (-1 when full)
//     bits      per unique partial bitset, BQ rows of words_per_row uint words (the uint64
//               words of BlockMap read as little-endian uint pairs): local column c of local
//               row r is bit (c & 31) of word r*words_per_row + (c >> 5)
//   scratch [B, Hq, Tq, Tk] f32 (vanilla only): scores, then the probabilities (= weights)
// Unused bindings are bound to a small dummy buffer; flags say what is present.
#extension GL_GOOGLE_include_directive : require

layout(local_size_x_id = 0) in;                   // BQ rows per workgroup (= map's bq)
layout(constant_id = 1) const uint DTYPE = 0u;    // 0 f32, 1 f16, 2 bf16
layout(constant_id = 2) const int DMAX = 64;      // >= max(D, Dv): private array sizes
layout(constant_id = 3) const int BK = 32;        // kv block (= map's bk), <= 32
// The head dims when the pipeline is specialised for them (0: read pc.D / pc.Dv). Constant trip
// counts let the compiler unroll the per-dimension loops and keep qv / acc in registers.
layout(constant_id = 4) const int DEXACT = 0;
layout(constant_id = 5) const int DVEXACT = 0;
#define HEAD_D (DEXACT > 0 ? DEXACT : pc.D)
#define HEAD_DV (DVEXACT > 0 ? DVEXACT : pc.Dv)

// q/k/v as 16-byte vectors: with FLAG_VEC a row of k or v is fetched 16 bytes per load (every
// row starts 16-byte aligned then); single elements are picked out of a vector otherwise. The
// host pads these buffers to a multiple of 16 bytes.
layout(std430, set = 0, binding = 0) readonly buffer QBuf { uvec4 q_vec[]; };
layout(std430, set = 0, binding = 1) readonly buffer KBuf { uvec4 k_vec[]; };
layout(std430, set = 0, binding = 2) readonly buffer VBuf { uvec4 v_vec[]; };
layout(std430, set = 0, binding = 3) writeonly buffer OutBuf { float out_f32[]; };
layout(std430, set = 0, binding = 4) writeonly buffer LseBuf { float lse_f32[]; };
layout(std430, set = 0, binding = 5) readonly buffer BiasBuf { float bias_f32[]; };
layout(std430, set = 0, binding = 6) readonly buffer SinkBuf { float sinks_f32[]; };
layout(std430, set = 0, binding = 7) readonly buffer SegQBuf { int seg_q[]; };
layout(std430, set = 0, binding = 8) readonly buffer SegKvBuf { int seg_kv[]; };
layout(std430, set = 0, binding = 9) readonly buffer RowStartBuf { uint row_start[]; };
layout(std430, set = 0, binding = 10) readonly buffer EntryBuf { uint entries[]; };
layout(std430, set = 0, binding = 11) readonly buffer PartBuf { int part_index[]; };
layout(std430, set = 0, binding = 12) readonly buffer BitsBuf { uint bits[]; };
layout(std430, set = 0, binding = 13) buffer ScratchBuf { float scratch[]; };

// Must match struct PushConstants in vulkan_backend.cpp (std430 scalars, 4 bytes each).
layout(push_constant) uniform PushConstants {
  int B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale;
  float soft_cap;         // > 0 when FLAG_SOFT_CAP
  uint flags;
  int win_left, win_right;  // FLAG_PARAM_MASK: < 0 = no bound on that side
  int chunk;                // FLAG_PARAM_MASK: > 0 = chunked causal
  uint bias_stride_b, bias_stride_h;
  int map_heads;            // 1 or Hq
  int nq;                   // q blocks
  int words_per_row;        // uint words per bitset row
  // q / k / v addressing, in elements of their buffers: element (b, t, h, d) of q is at
  // q_off + b*q_sb + t*q_st + h*D + d (heads packed, d contiguous). Packed uploads have
  // offset 0 and strides (T*H*D, H*D); device-resident views (a KV cache slice) have their own.
  uint q_off, k_off, v_off;
  uint q_sb, q_st, k_sb, k_st, v_sb, v_st;
}
pc;

const uint FLAG_CAUSAL = 1u;      // with FLAG_PARAM_MASK: j <= p
const uint FLAG_PARAM_MASK = 2u;  // partial tiles evaluate causal/window/chunk from pc
const uint FLAG_SEGMENTS = 4u;
const uint FLAG_BIAS = 8u;
const uint FLAG_SINKS = 16u;
const uint FLAG_LSE = 32u;
const uint FLAG_SOFT_CAP = 64u;
const uint FLAG_VEC = 128u;  // every q/k/v row starts on a 16-byte boundary and is whole vectors

bool has(uint f) { return (pc.flags & f) != 0u; }

// Element e of a q/k/v buffer as float.
#define DEFINE_LOAD(NAME, VEC)                                     \
  float NAME(uint e) {                                             \
    if (DTYPE == 0u) return uintBitsToFloat(VEC[e >> 2][e & 3u]);  \
    uint w = VEC[e >> 3][(e >> 1) & 3u];                           \
    uint h = ((e & 1u) != 0u) ? (w >> 16) : (w & 0xffffu);         \
    if (DTYPE == 1u) return unpackHalf2x16(h).x;                   \
    return uintBitsToFloat(h << 16);                               \
  }
DEFINE_LOAD(load_q, q_vec)
DEFINE_LOAD(load_k, k_vec)
DEFINE_LOAD(load_v, v_vec)

// The row's query (in fp32) and output accumulator, private to the invocation. Module-scope so
// that the helpers below use them in place (GLSL passes arrays by value).
float qv[DMAX];
float acc[DMAX];

// The elements held by one 16-byte vector: 4 (f32) or 8 (f16, bf16).
const int VEC_ELEMS = DTYPE == 0u ? 4 : 8;

// Elements 2c and 2c+1 of a vector of 16-bit values, as floats.
vec2 unpack_pair(uint w) {
  if (DTYPE == 1u) return unpackHalf2x16(w);
  return vec2(uintBitsToFloat(w << 16), uintBitsToFloat(w & 0xffff0000u));
}

// qv . k[kbase .. kbase + D). kbase is a multiple of VEC_ELEMS with FLAG_VEC.
float dot_qk(uint kbase) {
  float sum = 0.0;
  if (has(FLAG_VEC)) {
    for (int d = 0; d < HEAD_D; d += VEC_ELEMS) {
      const uvec4 w = k_vec[(kbase + uint(d)) / uint(VEC_ELEMS)];
      if (DTYPE == 0u) {
        sum += qv[d] * uintBitsToFloat(w.x) + qv[d + 1] * uintBitsToFloat(w.y) + qv[d + 2] * uintBitsToFloat(w.z) +
               qv[d + 3] * uintBitsToFloat(w.w);
      } else {
        for (int c = 0; c < 4; ++c) {
          const vec2 x = unpack_pair(w[c]);
          sum += qv[d + 2 * c] * x.x + qv[d + 2 * c + 1] * x.y;
        }
      }
    }
  } else {
    for (int d = 0; d < HEAD_D; ++d) sum += qv[d] * load_k(kbase + uint(d));
  }
  return sum;
}

// acc[0 .. Dv) += w * v[vbase .. vbase + Dv). vbase is a multiple of VEC_ELEMS with FLAG_VEC.
void add_weighted_v(float w, uint vbase) {
  if (has(FLAG_VEC)) {
    for (int d = 0; d < HEAD_DV; d += VEC_ELEMS) {
      const uvec4 x = v_vec[(vbase + uint(d)) / uint(VEC_ELEMS)];
      if (DTYPE == 0u) {
        acc[d] += w * uintBitsToFloat(x.x);
        acc[d + 1] += w * uintBitsToFloat(x.y);
        acc[d + 2] += w * uintBitsToFloat(x.z);
        acc[d + 3] += w * uintBitsToFloat(x.w);
      } else {
        for (int c = 0; c < 4; ++c) {
          const vec2 y = unpack_pair(x[c]);
          acc[d + 2 * c] += w * y.x;
          acc[d + 2 * c + 1] += w * y.y;
        }
      }
    }
  } else {
    for (int d = 0; d < HEAD_DV; ++d) acc[d] += w * load_v(vbase + uint(d));
  }
}

const float NEG_BIG = -3.0e38;  // "no logit yet"; finite so that no inf - inf can arise

// The row's visible interval [lo, hi) under the parametric mask (bottom-right aligned).
void param_interval(int i, out int lo, out int hi) {
  int p = i + pc.Tk - pc.Tq;
  lo = 0;
  hi = pc.Tk;
  if (has(FLAG_CAUSAL)) hi = min(hi, p + 1);
  if (pc.win_left >= 0) lo = max(lo, p - pc.win_left);
  if (pc.win_right >= 0) hi = min(hi, p + pc.win_right + 1);
  if (pc.chunk > 0) {
    hi = min(hi, p + 1);
    if (p >= 0) lo = max(lo, (p / pc.chunk) * pc.chunk);
  }
}

// Bits [0, n) set, for 0 <= n <= 32.
uint low_bits(int n) { return n <= 0 ? 0u : n >= 32 ? 0xffffffffu : (1u << uint(n)) - 1u; }

// Bit t set: key j0 + t (t < nj) of tile `e` is visible to local row r (static mask and
// segments). Full tiles see every key; partial tiles evaluate the parametric interval [lo, hi)
// or read the row's bitset word (BK <= 32: one word per row).
uint tile_visibility(uint e, int r, int j0, int nj, int lo, int hi, int b, int seg_i) {
  uint vis;
  if ((entries[e] & 1u) != 0u) {
    vis = low_bits(nj);
  } else if (has(FLAG_PARAM_MASK)) {
    const int a = clamp(lo - j0, 0, nj), c = clamp(hi - j0, 0, nj);
    vis = low_bits(c) & ~low_bits(a);
  } else {
    const int part = part_index[e];
    vis = bits[uint((part * int(gl_WorkGroupSize.x) + r) * pc.words_per_row)] & low_bits(nj);
  }
  if (has(FLAG_SEGMENTS) && vis != 0u)
    for (int t = 0; t < nj; ++t)
      if (((vis >> uint(t)) & 1u) != 0u && seg_kv[b * pc.Tk + j0 + t] != seg_i) vis &= ~(1u << uint(t));
  return vis;
}

// The logit of (q row, key j) given the raw dot product: scale, soft cap, bias.
float logit(float dot, int b, int h, int i, int j) {
  float s = dot * pc.scale;
  // tanh is clamped: tanh(15) rounds to 1 in fp32, and some tanh implementations compute
  // (e^x - e^-x) / (e^x + e^-x), which is inf / inf = NaN for large |x|.
  // A NaN logit must stay NaN (the non-finite policy); clamp may turn it into a bound.
  if (has(FLAG_SOFT_CAP) && !isnan(s)) s = pc.soft_cap * tanh(clamp(s / pc.soft_cap, -15.0, 15.0));
  if (has(FLAG_BIAS)) s += bias_f32[uint(b) * pc.bias_stride_b + uint(h) * pc.bias_stride_h + uint(i * pc.Tk + j)];
  return s;
}

// With FLAG_VEC, keys are processed four at a time: each q element and each accumulator element
// is then read once per four keys instead of once per key (private arrays live in memory on
// most implementations). kb / vb: element offsets of the four k / v rows.
vec4 dot_qk4(uvec4 kb) {
  vec4 sum = vec4(0.0);
  const uvec4 base = kb / uint(VEC_ELEMS);
  for (int d = 0; d < HEAD_D; d += VEC_ELEMS) {
    const uint o = uint(d / VEC_ELEMS);
    const uvec4 w0 = k_vec[base.x + o], w1 = k_vec[base.y + o], w2 = k_vec[base.z + o], w3 = k_vec[base.w + o];
    if (DTYPE == 0u) {
      const vec4 q = vec4(qv[d], qv[d + 1], qv[d + 2], qv[d + 3]);
      sum += vec4(dot(q, uintBitsToFloat(w0)), dot(q, uintBitsToFloat(w1)), dot(q, uintBitsToFloat(w2)),
                  dot(q, uintBitsToFloat(w3)));
    } else {
      for (int c = 0; c < 4; ++c) {
        const vec2 q = vec2(qv[d + 2 * c], qv[d + 2 * c + 1]);
        sum += vec4(dot(q, unpack_pair(w0[c])), dot(q, unpack_pair(w1[c])), dot(q, unpack_pair(w2[c])),
                    dot(q, unpack_pair(w3[c])));
      }
    }
  }
  return sum;
}

// Keys of weight 0 (masked, or past the tile's end) add nothing, even when their v holds NaN or
// inf: their term is selected away, not multiplied (0 x inf = NaN).
vec4 weighted(float w, vec4 x) { return w != 0.0 ? w * x : vec4(0.0); }
vec2 weighted(float w, vec2 x) { return w != 0.0 ? w * x : vec2(0.0); }

void add_weighted_v4(vec4 p, uvec4 vb) {
  const uvec4 base = vb / uint(VEC_ELEMS);
  for (int d = 0; d < HEAD_DV; d += VEC_ELEMS) {
    const uint o = uint(d / VEC_ELEMS);
    const uvec4 x0 = v_vec[base.x + o], x1 = v_vec[base.y + o], x2 = v_vec[base.z + o], x3 = v_vec[base.w + o];
    if (DTYPE == 0u) {
      vec4 a = vec4(acc[d], acc[d + 1], acc[d + 2], acc[d + 3]);
      a += weighted(p.x, uintBitsToFloat(x0)) + weighted(p.y, uintBitsToFloat(x1)) +
           weighted(p.z, uintBitsToFloat(x2)) + weighted(p.w, uintBitsToFloat(x3));
      acc[d] = a.x;
      acc[d + 1] = a.y;
      acc[d + 2] = a.z;
      acc[d + 3] = a.w;
    } else {
      for (int c = 0; c < 4; ++c) {
        const vec2 a = vec2(acc[d + 2 * c], acc[d + 2 * c + 1]) + weighted(p.x, unpack_pair(x0[c])) +
                       weighted(p.y, unpack_pair(x1[c])) + weighted(p.z, unpack_pair(x2[c])) +
                       weighted(p.w, unpack_pair(x3[c]));
        acc[d + 2 * c] = a.x;
        acc[d + 2 * c + 1] = a.y;
      }
    }
  }
}
