// Declarations of flash.comp (the flash_rowwise variant) on top of attn_io.glsl (bindings, push
// constants with the q/k/v offsets and strides, loads, mask helpers, the logit).
//
// One invocation owns one query row (b, h, i); a workgroup owns one q block of BQ rows of one
// (b, h): gl_WorkGroupID = (q block, q head, batch). No shared memory and no barriers. Statistics
// and accumulators are fp32 whatever the storage dtype. The block map has bq = BQ, bk = BK.
#extension GL_GOOGLE_include_directive : require
#include "attn_io.glsl"

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

float load_k(uint e) { return k_elem(e, DTYPE); }
float load_v(uint e) { return v_elem(e, DTYPE); }
float load_q(uint e) { return q_elem(e, DTYPE); }

// The row's query (in fp32) and output accumulator, private to the invocation. Module-scope so
// that the helpers below use them in place (GLSL passes arrays by value).
float qv[DMAX];
float acc[DMAX];

// The elements held by one 16-byte vector: 4 (f32) or 8 (f16, bf16).
const int VEC_ELEMS = DTYPE == 0u ? 4 : 8;

// Elements 2c and 2c+1 of a vector of 16-bit values, as floats.
vec2 unpack_pair(uint w) { return unpack_pair_of(w, DTYPE); }

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

// Bit t set: key j0 + t (t < nj) of tile `e` is visible to local row r (static mask and
// segments): attn_io.glsl's helpers with BQ rows per bitset.
uint tile_visibility(uint e, int r, int j0, int nj, int lo, int hi, int b, int seg_i) {
  uint vis = static_bits(e, r, j0, nj, lo, hi, int(gl_WorkGroupSize.x));
  if (has(FLAG_SEGMENTS) && vis != 0u) vis &= segment_bits(b, j0, nj, seg_i);
  return vis;
}

// The logit of (q row, key j) given the raw dot product: scale, soft cap, bias.
float logit(float dot, int b, int h, int i, int j) { return finish_logit(dot * pc.scale, b, h, i, j); }

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
// w x, or 0 where w is 0 (an integer mask on x's bits: weight 0 adds nothing, not 0 x NaN).
vec4 weighted(float w, vec4 x) { return w * weighted_value(w, x); }
vec2 weighted(float w, vec2 x) { return w * weighted_value(w, vec4(x, 0.0, 0.0)).xy; }

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
