#version 450
// Flash / blocksparse attention on cooperative matrices (the "flash_coopmat_nv" / "_khr"
// variants): Q K^T and P V as 16x16x16 f16 x f16 -> f32 subgroup matrix products. Compiled
// twice, with -DCOOPMAT_NV=1 (GL_NV_cooperative_matrix) and, where glslc has it,
// -DCOOPMAT_KHR=1 (GL_KHR_cooperative_matrix). f16 inputs only (the selection takes no other).
//
// A workgroup owns 16 * NSG rows (q_rows query positions x head_rows q heads of one kv head, as
// flash_tiled.comp); subgroup g owns rows 16g .. 16g + 15. Q (f16, unscaled) is staged once and
// kept in registers as DPAD/16 A matrices. Per non-empty kv tile of the block map (BC keys):
//   1. K and V of the tile are staged in shared memory as f16 (head dims zero-padded to DPAD /
//      DVPAD, keys past Tk zero), 16 bytes per load where the rows are whole aligned vectors
//      (FLAG_VEC); a flag records whether V holds NaN/Inf;
//   2. each subgroup computes S = Q K^T (16 x BC, f32) and stores it to shared memory;
//   3. its lanes (SG/16 per row) apply scale, soft cap, bias and the mask (partial tiles only),
//      update the running max m and sum l, and write P = e^(S - m) as f16 (l sums the f16
//      values, so that numerator and denominator round alike) and the rescale factor alpha;
//   4. P V is computed 16 output columns at a time into a 16x16 f32 block in shared memory, and
//      each lane folds its elements of the block into its f32 accumulator: O = O * alpha + PV
//      (the multiply skipped when no row of the lane's grew its max).
//      When the V tile holds NaN/Inf, this tile's P V is summed by the lanes instead, taking
//      only keys with P != 0, so that a masked key's non-finite value never reaches a row that
//      does not see it.
// Statistics and accumulators are fp32. The block map is (16 * NSG / head_rows) x BC.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#if defined(COOPMAT_KHR)
#extension GL_KHR_cooperative_matrix : require
#define MAT_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define MAT_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define MAT_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>
#define LOAD_ROWS(m, buf, at, stride) coopMatLoad(m, buf, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define LOAD_COLS(m, buf, at, stride) coopMatLoad(m, buf, at, stride, gl_CooperativeMatrixLayoutColumnMajor)
#define STORE_ROWS(m, buf, at, stride) coopMatStore(m, buf, at, stride, gl_CooperativeMatrixLayoutRowMajor)
#define MUL_ADD(a, b, c) coopMatMulAdd(a, b, c)
#elif defined(COOPMAT_NV)
#extension GL_NV_cooperative_matrix : require
#define MAT_A fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_B fcoopmatNV<16, gl_ScopeSubgroup, 16, 16>
#define MAT_C fcoopmatNV<32, gl_ScopeSubgroup, 16, 16>
#define LOAD_ROWS(m, buf, at, stride) coopMatLoadNV(m, buf, at, stride, false)
#define LOAD_COLS(m, buf, at, stride) coopMatLoadNV(m, buf, at, stride, true)
#define STORE_ROWS(m, buf, at, stride) coopMatStoreNV(m, buf, at, stride, false)
#define MUL_ADD(a, b, c) coopMatMulAddNV(a, b, c)
#else
#error "define COOPMAT_KHR or COOPMAT_NV"
#endif
#include "attn_io.glsl"

layout(local_size_x_id = 0) in;                // NSG * SG invocations
layout(constant_id = 1) const uint DTYPE = 1u;  // the storage dtype (f16)
layout(constant_id = 2) const uint NSG = 4u;    // subgroups per workgroup, 16 rows each
layout(constant_id = 3) const uint BC = 32u;    // keys per kv tile (16 or 32)
layout(constant_id = 4) const uint DPAD = 64u;  // D rounded up to 16
layout(constant_id = 5) const uint DVPAD = 64u; // Dv rounded up to 16
layout(constant_id = 6) const uint SG = 32u;    // subgroup size (16 .. 128, required)

const uint LPR = SG / 16u;       // lanes per row in the softmax
const uint CPL = BC / LPR;       // columns per lane in the softmax
const uint EPL = 256u / SG;      // elements of a 16x16 block per lane
// Row strides, padded by 16 bytes against bank conflicts; every row starts 16-byte aligned.
const uint KSTR = DPAD + 8u, VSTR = DVPAD + 8u;  // halves
const uint SSTR = BC + 4u, OSTR = 16u + 4u;       // floats
const uint PSTR = BC + 8u;                        // halves
// The K and V tiles; before the first tile the same memory holds Q (16 * NSG rows).
const uint KV_HALVES = BC * (KSTR + VSTR);
const uint Q_HALVES = NSG * 16u * KSTR;
shared float16_t kvsh[KV_HALVES > Q_HALVES ? KV_HALVES : Q_HALVES];
shared float ssh[NSG * 16u * SSTR];
shared float16_t psh[NSG * 16u * PSTR];
shared float osh[NSG * 16u * OSTR];
shared float row_alpha[NSG * 16u], row_l[NSG * 16u], row_m[NSG * 16u];
// Per tile parity: the V tile holds NaN / Inf. Four words, not two, so that every shared array is
// a whole number of 16-byte units: on an H200 (driver 580) the matrix loads from kvsh read 8 bytes
// early, as if the arrays' placement left kvsh 8 bytes off a 16-byte boundary.
shared uint nonfinite_v[4];

// Eight f16 values (a 16-byte load, element 2k in the low half of word k) into kvsh at `at`,
// bit for bit.
void store_halves(uint at, uvec4 w) {
  [[unroll]] for (uint k = 0; k < 4u; ++k) {
    const f16vec2 pair = unpackFloat2x16(w[k]);
    kvsh[at + 2u * k] = pair.x;
    kvsh[at + 2u * k + 1u] = pair.y;
  }
}
// Whether any of eight f16 values is NaN or +-inf (all exponent bits set), by its bits.
bool halves_nonfinite(uvec4 w) {
  bool any = false;
  [[unroll]] for (uint k = 0; k < 4u; ++k)
    any = any || (w[k] & 0x7c00u) == 0x7c00u || (w[k] & 0x7c000000u) == 0x7c000000u;
  return any;
}

void main() {
  const uint tid = gl_LocalInvocationIndex;
  const uint WG = gl_WorkGroupSize.x;
  const uint sg = gl_SubgroupID, lane = gl_SubgroupInvocationID;
  const int qb = int(gl_WorkGroupID.x), b = int(gl_WorkGroupID.z);
  const int h0 = int(gl_WorkGroupID.y) * pc.head_rows;
  const int hk = h0 / (pc.Hq / pc.Hkv);
  const int rows = pc.q_rows * pc.head_rows;

  // Stage Q (unscaled f16; the scale applies to S in f32) and keep it as A matrices.
  for (uint x = tid; x < NSG * 16u * DPAD; x += WG) {
    const int rr = int(x / DPAD), d = int(x % DPAD);
    const int i = qb * pc.q_rows + rr % pc.q_rows, h = h0 + rr / pc.q_rows;
    float qv = 0.0;
    if (rr < rows && i < pc.Tq && d < pc.D) qv = q_elem(q_at(b, i, h) + uint(d), DTYPE);
    kvsh[uint(rr) * KSTR + uint(d)] = float16_t(qv);
  }
  if (tid < 2u) nonfinite_v[tid] = 0u;
  barrier();
  MAT_A qa[DPAD / 16u];
  [[unroll]] for (uint kk = 0; kk < DPAD / 16u; ++kk) LOAD_ROWS(qa[kk], kvsh, sg * 16u * KSTR + kk * 16u, KSTR);

  // The softmax lanes' row (lane / LPR of the subgroup's 16) and its statistics.
  const uint r_soft = lane / LPR, part = lane % LPR;
  const int rr_soft = int(sg * 16u + r_soft);
  const int iq_soft = rr_soft % pc.q_rows;
  const int i_soft = qb * pc.q_rows + iq_soft, h_soft = h0 + rr_soft / pc.q_rows;
  const bool live_soft = rr_soft < rows && i_soft < pc.Tq;
  int lo = 0, hi = pc.Tk;
  if (has(FLAG_PARAM_MASK)) param_interval(i_soft, lo, hi);
  const int seg_i = (has(FLAG_SEGMENTS) && live_soft) ? seg_q[b * pc.Tq + i_soft] : 0;
  float m = NEG_BIG, l = 0.0;
  bool poisoned = false;  // this lane saw a NaN or +inf logit of its row (the row is NaN)

  // The accumulator: element u of block n is (row (lane + SG*u) / 16, column n*16 + (lane + SG*u) % 16).
  float o[DVPAD / 16u][EPL];
  [[unroll]] for (uint n = 0; n < DVPAD / 16u; ++n)
    [[unroll]] for (uint u = 0; u < EPL; ++u) o[n][u] = 0.0;

  const int hh = pc.map_heads > 1 ? h0 : 0;
  const int e0 = int(row_start[hh * pc.nq + qb]), e1 = int(row_start[hh * pc.nq + qb + 1]);
  const uint kstride = pc.k_st, vstride = pc.v_st;  // between consecutive keys
  for (int e = e0; e < e1; ++e) {
    const uint entry = entries[e];
    const int j0 = int(entry >> 1) * int(BC);
    const int nj = min(int(BC), pc.Tk - j0);
    const uint parity = uint(e) & 1u;
    barrier();  // every subgroup is done with the previous tile (and with Q)
    const uint kbase = k_at(b, j0, hk), vbase = v_at(b, j0, hk);
    bool bad = false;
    if (has(FLAG_VEC)) {
      // Rows of whole 16-byte vectors on 16-byte boundaries (D and Dv multiples of 8): 8 halves
      // per load, copied as they are (DPAD - D is a multiple of 8: the padding chunks are 0).
      for (uint x = tid; x < BC * (DPAD / 8u); x += WG) {
        const uint c = x / (DPAD / 8u), d = 8u * (x % (DPAD / 8u));
        const uvec4 w = (int(c) < nj && int(d) < pc.D) ? k_vec[(kbase + c * kstride + d) >> 3] : uvec4(0u);
        store_halves(c * KSTR + d, w);
      }
      for (uint x = tid; x < BC * (DVPAD / 8u); x += WG) {
        const uint c = x / (DVPAD / 8u), d = 8u * (x % (DVPAD / 8u));
        const uvec4 w = (int(c) < nj && int(d) < pc.Dv) ? v_vec[(vbase + c * vstride + d) >> 3] : uvec4(0u);
        bad = bad || halves_nonfinite(w);
        store_halves(BC * KSTR + c * VSTR + d, w);
      }
    } else {
      for (uint x = tid; x < BC * DPAD; x += WG) {
        const uint c = x / DPAD, d = x % DPAD;
        float kv = 0.0;
        if (int(c) < nj && int(d) < pc.D) kv = k_elem(kbase + c * kstride + d, DTYPE);
        kvsh[c * KSTR + d] = float16_t(kv);
      }
      for (uint x = tid; x < BC * DVPAD; x += WG) {
        const uint c = x / DVPAD, d = x % DVPAD;
        float vv = 0.0;
        if (int(c) < nj && int(d) < pc.Dv) vv = v_elem(vbase + c * vstride + d, DTYPE);
        bad = bad || (floatBitsToUint(vv) & 0x7f800000u) == 0x7f800000u;  // NaN or +-inf, by its bits
        kvsh[BC * KSTR + c * VSTR + d] = float16_t(vv);
      }
    }
    if (bad) atomicOr(nonfinite_v[parity], 1u);
    if (tid == 0u) nonfinite_v[parity ^ 1u] = 0u;  // for the next tile; nobody reads it now
    barrier();

    // 2. S = Q K^T for this subgroup's 16 rows.
    [[unroll]] for (uint n = 0; n < BC / 16u; ++n) {
      MAT_C s = MAT_C(0.0);
      [[unroll]] for (uint kk = 0; kk < DPAD / 16u; ++kk) {
        MAT_B kb;  // (16 dims x 16 keys): key n*16 + c is column c, contiguous over the dims
        LOAD_COLS(kb, kvsh, n * 16u * KSTR + kk * 16u, KSTR);
        s = MUL_ADD(qa[kk], kb, s);
      }
      STORE_ROWS(s, ssh, sg * 16u * SSTR + n * 16u, SSTR);
    }
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // 3. Softmax: lane `part` of row r_soft takes columns part + LPR * t.
    uint vis = 0u;
    if (live_soft) {
      vis = static_bits(uint(e), iq_soft, j0, nj, lo, hi, pc.q_rows);
      if (has(FLAG_SEGMENTS) && vis != 0u) vis &= segment_bits(b, j0, nj, seg_i);
    }
    // Logits are classified by their bits (attn_io.glsl's logit_class): only finite ones take
    // part (the rest stay at the finite NEG_BIG, weight 0); a NaN / +inf one poisons the row.
    float x[CPL];
    float tile_max = NEG_BIG;
    uint live = 0u;
    [[unroll]] for (uint t = 0; t < CPL; ++t) {
      const uint c = part + LPR * t;
      x[t] = NEG_BIG;
      if (((vis >> c) & 1u) != 0u) {
        const float y = finish_logit(ssh[(sg * 16u + r_soft) * SSTR + c] * pc.scale, b, h_soft, i_soft, j0 + int(c));
        const uint cls = logit_class(y);
        poisoned = poisoned || cls == LOGIT_POISON;
        if (cls == LOGIT_LIVE) {
          x[t] = y;
          live |= 1u << t;
        }
      }
      tile_max = max(tile_max, x[t]);
    }
    [[unroll]] for (uint off = 1u; off < LPR; off *= 2u) tile_max = max(tile_max, subgroupShuffleXor(tile_max, off));
    const float m_new = max(m, tile_max);
    const float alpha = exp(m - m_new);
    m = m_new;
    float psum = 0.0;
    [[unroll]] for (uint t = 0; t < CPL; ++t) {
      const float16_t p = float16_t(((live >> t) & 1u) != 0u ? exp(x[t] - m_new) : 0.0);
      psum += float(p);
      psh[(sg * 16u + r_soft) * PSTR + part + LPR * t] = p;
    }
    [[unroll]] for (uint off = 1u; off < LPR; off *= 2u) psum += subgroupShuffleXor(psum, off);
    l = l * alpha + psum;
    if (part == 0u) row_alpha[sg * 16u + r_soft] = alpha;
    subgroupMemoryBarrierShared();
    subgroupBarrier();

    // 4. O = O * alpha + P V, 16 output columns at a time. alpha is 1 unless the row's running
    // max grew (rare after the first tiles): the rescale is skipped then.
    const bool guarded = nonfinite_v[parity] != 0u;
    float alpha_u[EPL];
    bool rescale = false;
    [[unroll]] for (uint u = 0; u < EPL; ++u) {
      alpha_u[u] = row_alpha[sg * 16u + (lane + SG * u) / 16u];
      rescale = rescale || alpha_u[u] != 1.0;
    }
    MAT_A pa[BC / 16u];
    [[unroll]] for (uint kk = 0; kk < BC / 16u; ++kk) LOAD_ROWS(pa[kk], psh, sg * 16u * PSTR + kk * 16u, PSTR);
    [[unroll]] for (uint n = 0; n < DVPAD / 16u; ++n) {
      if (!guarded) {
        MAT_C pv = MAT_C(0.0);
        [[unroll]] for (uint kk = 0; kk < BC / 16u; ++kk) {
          MAT_B vb;  // (16 keys x 16 columns), rows contiguous
          LOAD_ROWS(vb, kvsh, BC * KSTR + kk * 16u * VSTR + n * 16u, VSTR);
          pv = MUL_ADD(pa[kk], vb, pv);
        }
        STORE_ROWS(pv, osh, sg * 16u * OSTR, OSTR);
        subgroupMemoryBarrierShared();
        subgroupBarrier();
      }
      [[unroll]] for (uint u = 0; u < EPL; ++u) {
        const uint el = lane + SG * u, r = el / 16u, col = el % 16u;
        float add = 0.0;
        if (guarded) {
          for (uint c = 0; c < BC; ++c) {
            const float p = float(psh[(sg * 16u + r) * PSTR + c]);
            add += p * weighted_value(p, float(kvsh[BC * KSTR + c * VSTR + n * 16u + col]));  // weight 0: nothing
          }
        } else {
          add = osh[(sg * 16u + r) * OSTR + col];
        }
        o[n][u] = (rescale ? o[n][u] * alpha_u[u] : o[n][u]) + add;
      }
      subgroupMemoryBarrierShared();
      subgroupBarrier();  // osh is rewritten by the next block
    }
  }

  // Normalise and write: the statistics go through shared memory to the lanes that hold the
  // elements of each row.
  // A row is poisoned when any of its LPR softmax lanes saw a NaN / +inf logit; row_l carries
  // that as NaN bits to the lanes that write the row.
  uint poison_bits = poisoned ? 1u : 0u;
  [[unroll]] for (uint off = 1u; off < LPR; off *= 2u) poison_bits |= subgroupShuffleXor(poison_bits, off);
  poisoned = poison_bits != 0u;
  if (part == 0u) {
    row_l[sg * 16u + r_soft] = poisoned ? uintBitsToFloat(NAN_BITS) : l;
    row_m[sg * 16u + r_soft] = m;
    if (live_soft && has(FLAG_LSE)) lse_u32[uint((b * pc.Hq + h_soft) * pc.Tq + i_soft)] = row_lse_bits(m, l, poisoned);
  }
  subgroupMemoryBarrierShared();
  subgroupBarrier();
  [[unroll]] for (uint u = 0; u < EPL; ++u) {
    const uint el = lane + SG * u, r = el / 16u, col = el % 16u;
    const int rr = int(sg * 16u + r);
    const int i = qb * pc.q_rows + rr % pc.q_rows, h = h0 + rr / pc.q_rows;
    if (rr >= rows || i >= pc.Tq) continue;
    const float lr = row_l[sg * 16u + r], mr = row_m[sg * 16u + r];
    // attn_io.glsl's row end: a fully masked row gives 0, a poisoned row NaN; a sink adds mass
    // without value.
    const bool nan_row = is_nan_bits(lr);
    const float factor = nan_row ? 0.0 : row_factor(mr, lr, h);
    const bool out_nan = nan_row || (lr != 0.0 && sink_poisons(h));
    const uint obase = uint(((b * pc.Tq + i) * pc.Hq + h) * pc.Dv);
    [[unroll]] for (uint n = 0; n < DVPAD / 16u; ++n) {
      const int d = int(n * 16u + col);
      if (d < pc.Dv) out_u32[obase + uint(d)] = out_bits(o[n][u], factor, out_nan);
    }
  }
}
