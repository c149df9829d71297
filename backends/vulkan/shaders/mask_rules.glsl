// The mask and flag rules every attention shader shares, forward (attn_io.glsl) and backward
// (backward_common.glsl), so that both see the same keys. Included after the shader's push
// constants: it reads pc.flags, pc.Tq, pc.Tk, pc.win_left, pc.win_right and pc.chunk, which both
// push-constant blocks declare (vk_launch.h's PushConstants, vk_backward.cpp's BackwardPush).
// The flag bits match enum Flag in vk_flags.h.

const uint FLAG_CAUSAL = 1u;      // with FLAG_PARAM_MASK: j <= p
const uint FLAG_PARAM_MASK = 2u;  // partial tiles evaluate causal/window/chunk from pc
const uint FLAG_SEGMENTS = 4u;
const uint FLAG_BIAS = 8u;
const uint FLAG_SINKS = 16u;
const uint FLAG_LSE = 32u;        // forward: write lse
const uint FLAG_SOFT_CAP = 64u;
const uint FLAG_VEC = 128u;       // rows are whole 16-byte vectors (each shader says what it relies on)
const uint FLAG_ALIGNED4 = 256u;  // forward: every q/k/v row starts at a multiple of 4 elements, D and Dv too

bool has(uint f) { return (pc.flags & f) != 0u; }

// +-inf and a quiet NaN (not constant expressions in GLSL, hence macros).
#define POS_INF uintBitsToFloat(0x7f800000u)
#define NEG_INF uintBitsToFloat(0xff800000u)
#define QUIET_NAN uintBitsToFloat(0x7fc00000u)

// Non-finite values are recognised by their exponent bits, never by isnan / isinf or a float
// comparison with an infinity: a compiler that may assume no NaN or Inf exists (an entry point
// without SignedZeroInfNanPreserve, README "Float controls") may fold those away, but not integer
// tests of the bits.
bool is_nan_bits(float x) { return (floatBitsToUint(x) & 0x7fffffffu) > 0x7f800000u; }
bool is_pos_inf_bits(float x) { return floatBitsToUint(x) == 0x7f800000u; }
bool is_neg_inf_bits(float x) { return floatBitsToUint(x) == 0xff800000u; }
bool non_finite_bits(float x) { return (floatBitsToUint(x) & 0x7f800000u) == 0x7f800000u; }

// The row's visible key interval [lo, hi) under the parametric mask (bottom-right aligned: query
// row i sits at key position p = i + Tk - Tq).
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
