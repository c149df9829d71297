// Vector primitives of the paged stream kernel (per-tier header, private to paged_stream.cpp):
// K / V rows of every page dtype widened to fp32 in registers, and the two products of a block of
// keys, scores = Q K^T and acc += P V, for the q rows of one kv head.
//
// Page dtypes: f32, f16, bf16 (the values), int8 (the codes, exact in fp32) and fp8_e4m3, whose
// codes are read as code x 2^-8: on the F16C / AVX-512 tiers the byte sign-extended to 16 bits,
// shifted left by 7 and masked is the f16 bit pattern of code x 2^-8 (normals and subnormals
// alike), one vcvtph2ps away from fp32; kCodeUnit (256) restores the factor in the scales. That
// read turns the NaN code S.1111.111 into 1.875 x 2^-8 x ..., so blocks holding one take the exact
// path (Exact = true: a table with NaN), found by fp8_has_nan before the block runs.
//
// Batch invariance: every (row, key) score and every (row, column) accumulator is formed by the
// same operations in the same order whatever the tile it is computed in (its accumulators are
// its own, the reduction tree per score is fixed), so a row's bits do not depend on which other
// rows or keys share its tiles: the shared-prefix items and the unshared ones agree bit for bit.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "attnops/dtype.h"
#include "attnops/kv_quant.h"
#include "backends/cpu/simd16.h"
#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::ATTNOPS_TIER_NS::paged_simd {

using i64 = std::int64_t;
using simd::V16;

// Scores per dtype are formed from values x kCodeUnit^-1: the scales carry kCodeUnit.
template <DType KT>
inline constexpr float kCodeUnit = KT == DType::fp8_e4m3 ? 256.f : 1.f;

template <DType KT>
inline constexpr i64 kBytes = KT == DType::f32                          ? 4
                              : (KT == DType::f16 || KT == DType::bf16) ? 2
                                                                        : 1;

// code x 2^-8 of every e4m3 code (NaN for S.1111.111), built once per tier.
inline const float* fp8_table() {
  static const auto* table = [] {
    static float t[256];
    for (int b = 0; b < 256; ++b) t[b] = fp8_e4m3_to_float(static_cast<std::uint8_t>(b)) * (1.f / 256.f);
    return t;
  }();
  return table;
}

// w (1..16) bytes at p as a 16-byte vector, the rest 0 (never read past p + w).
inline void bytes16(const void* p, int w, std::uint8_t (&out)[16]) {
  std::memset(out, 0, sizeof out);
  std::memcpy(out, p, static_cast<std::size_t>(w));
}

#if ATTNOPS_SIMD_LEVEL >= 2
inline V16 i8x16(const void* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(static_cast<const __m128i*>(p))))};
}
inline V16 fp8x16(const void* p) {
  const __m256i w = _mm256_cvtepi8_epi16(_mm_loadu_si128(static_cast<const __m128i*>(p)));
  return {_mm512_cvtph_ps(
      _mm256_and_si256(_mm256_slli_epi16(w, 7), _mm256_set1_epi16(static_cast<short>(0xbf80))))};
}
#elif ATTNOPS_SIMD_LEVEL == 1
inline __m256 i8x8(const char* b) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))));
}
inline V16 i8x16(const void* p) {
  const auto* b = static_cast<const char*>(p);
  return {i8x8(b), i8x8(b + 8)};
}
inline __m256 fp8x8(__m128i b8) {
  const __m128i w = _mm_cvtepi8_epi16(b8);
  return _mm256_cvtph_ps(_mm_and_si128(_mm_slli_epi16(w, 7), _mm_set1_epi16(static_cast<short>(0xbf80))));
}
inline V16 fp8x16(const void* p) {
  const auto* b = static_cast<const char*>(p);
  return {fp8x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b))),
          fp8x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b + 8)))};
}
#else
inline V16 i8x16(const void* p) {
  typedef std::int8_t i8x16_t __attribute__((vector_size(16)));
  i8x16_t c;
  std::memcpy(&c, p, sizeof c);
  V16 r;
  r.v = __builtin_convertvector(c, simd::generic::f32x16);
  return r;
}
inline V16 fp8x16(const void* p) {
  const float* t = fp8_table();
  const auto* b = static_cast<const std::uint8_t*>(p);
  V16 r;
  for (int l = 0; l < 16; ++l) r.v[l] = t[b[l]];
  return r;
}
#endif

// 16 elements (w = 16) or the first w of them (the rest 0) of a row of dtype KT from element
// `at`, as fp32 (fp8: code x 2^-8; Exact: through the table, NaN codes NaN).
template <DType KT, bool Exact = false>
inline V16 load(const void* row, i64 at, int w) {
  if constexpr (KT == DType::f32 || KT == DType::f16 || KT == DType::bf16) {
    return vanilla::load_elems<KT>(row, at, w);
  } else {
    const auto* p = static_cast<const std::uint8_t*>(row) + at;
    if constexpr (KT == DType::fp8_e4m3 && Exact) {
      alignas(64) float f[16] = {};
      const float* t = fp8_table();
      for (int l = 0; l < w; ++l) f[l] = t[p[l]];
      return simd::load(f);
    } else {
      if (w == 16) return KT == DType::i8 ? i8x16(p) : fp8x16(p);
      std::uint8_t tmp[16];
      bytes16(p, w, tmp);
      return KT == DType::i8 ? i8x16(tmp) : fp8x16(tmp);
    }
  }
}

// Whether any of the n bytes at p is an e4m3 NaN (S.1111.111).
inline bool fp8_has_nan(const void* p, i64 n) {
  const auto* b = static_cast<const std::uint8_t*>(p);
  i64 i = 0;
#if ATTNOPS_SIMD_LEVEL >= 1
  __m256i acc = _mm256_setzero_si256();
  const __m256i hi = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi8(-1);
  for (; i + 32 <= n; i += 32) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + i));
    acc = _mm256_or_si256(acc, _mm256_cmpeq_epi8(_mm256_or_si256(v, hi), ones));
  }
  if (!_mm256_testz_si256(acc, acc)) return true;
#endif
  for (; i < n; ++i)
    if ((b[i] & 0x7fu) == 0x7fu) return true;
  return false;
}

// The sums of up to four vectors, each formed by one fixed tree (whatever the others are):
// out[x] = sum of a[x]'s lanes.
#if ATTNOPS_SIMD_LEVEL >= 1
inline __m256 fold8(V16 a) {
#if ATTNOPS_SIMD_LEVEL >= 2
  return _mm256_add_ps(_mm512_castps512_ps256(a.v),
                       _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a.v), 1)));
#else
  return _mm256_add_ps(a.lo, a.hi);
#endif
}
inline void reduce4(const V16* a, int n, float* out) {
  const __m256 z = _mm256_setzero_ps();
  const __m256 t0 = fold8(a[0]), t1 = n > 1 ? fold8(a[1]) : z, t2 = n > 2 ? fold8(a[2]) : z,
               t3 = n > 3 ? fold8(a[3]) : z;
  const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(t0, t1), _mm256_hadd_ps(t2, t3));
  _mm_storeu_ps(out, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
#else
inline void reduce4(const V16* a, int n, float* out) {
  for (int x = 0; x < n; ++x) out[x] = simd::reduce_add(a[x]);
}
#endif

// Prefetches byte ranges of K and V rows (n rows each: krows[j] + koff, kbytes; then vrows[j] +
// voff, vbytes) into L2 a few cache lines at a time, in order, at each step of a score loop:
// spread over the work the requests never pile up (a burst of hundreds of prefetches left the
// next block's loads waiting on memory all the same), and rows in address order are what the
// hardware's stream prefetchers follow.
struct Prefetcher {
  const char* const* krows = nullptr;
  const char* const* vrows = nullptr;
  i64 koff = 0, voff = 0, kbytes = 0, vbytes = 0;
  i64 n = 0;             // rows of each pool
  i64 per_step = 0;      // lines per step
  i64 row = 0, off = 0;  // the cursor: row < n in K, then n + row in V
  i64 lines() const { return n * ((kbytes + 63) / 64 + (vbytes + 63) / 64); }
  void pace(i64 steps) { per_step = (lines() + steps - 1) / std::max<i64>(steps, 1); }
  void step() {
    for (i64 x = 0; x < per_step && row < 2 * n; ++x) {
      const bool k = row < n;
      __builtin_prefetch((k ? krows[row] + koff : vrows[row - n] + voff) + off, 0, 2);
      off += 64;
      if (off >= (k ? kbytes : vbytes)) off = 0, ++row;
    }
  }
  void finish() {
    per_step = i64{1} << 40;
    step();
  }
};

// Register blocking: accumulators (V16) per dot tile (rows x keys, <= 4 scores) and per pv tile
// (rows x column slices): a V16 is 1 zmm (32 registers), 2 ymm (16) or 4 xmm (16).
#if ATTNOPS_SIMD_LEVEL >= 2
inline constexpr int kDotChains = 2, kPvAccs = 16;
#elif ATTNOPS_SIMD_LEVEL == 1
inline constexpr int kDotChains = 1, kPvAccs = 4;
#else
inline constexpr int kDotChains = 1, kPvAccs = 2;
#endif

// Scores of a tile of RR rows x KK keys (RR * KK <= 4): s[r * lds + j] = Q_r . k_j over D.
// kD: the head dim when known at compile time (0: D), so that the loop over D unrolls whole and
// the accumulators never leave the registers for a tail that cannot occur. Not inlined: inlined
// into the block loops, GCC keeps the V16 accumulators on the stack (measured: 2x slower).
template <DType KT, bool Exact, int RR, int KK, i64 kD>
__attribute__((noinline)) void dot_tile(const float* Q, i64 ldq, const char* const* krows, i64 koff, i64 D_,
                                        float* s, i64 lds) {
  const i64 D = kD ? kD : D_;
  V16 a[RR * KK][kDotChains];
  for (int x = 0; x < RR * KK; ++x)
    for (int c = 0; c < kDotChains; ++c) a[x][c] = simd::zero();
  // Whole chunks of 16 on the kDotChains chains in turn (indices the compiler sees: the
  // accumulators stay in registers), then the tail on chain 0.
  i64 d = 0;
  for (; d + 16 * kDotChains <= D; d += 16 * kDotChains)
    for (int c = 0; c < kDotChains; ++c) {
      V16 kv[KK];
      for (int j = 0; j < KK; ++j) kv[j] = load<KT, Exact>(krows[j] + koff, d + 16 * c, 16);
      for (int r = 0; r < RR; ++r) {
        const V16 q = simd::load(Q + r * ldq + d + 16 * c);
        for (int j = 0; j < KK; ++j) a[r * KK + j][c] = simd::fma(q, kv[j], a[r * KK + j][c]);
      }
    }
  for (; d < D; d += 16) {
    const int w = vanilla::lanes_left(D - d);
    V16 kv[KK];
    for (int j = 0; j < KK; ++j) kv[j] = load<KT, Exact>(krows[j] + koff, d, w);
    for (int r = 0; r < RR; ++r) {
      const V16 q = simd::load_n(Q + r * ldq + d, w);
      for (int j = 0; j < KK; ++j) a[r * KK + j][0] = simd::fma(q, kv[j], a[r * KK + j][0]);
    }
  }
  V16 t[4];
  for (int x = 0; x < RR * KK; ++x) {
    t[x] = a[x][0];
    for (int c = 1; c < kDotChains; ++c) t[x] = simd::add(t[x], a[x][c]);
  }
  float out[4];
  reduce4(t, RR * KK, out);
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < KK; ++j) s[r * lds + j] = out[r * KK + j];
}

#if ATTNOPS_SIMD_LEVEL == 1
// AVX2: 8 elements of a row of dtype KT from element `at` as fp32 (w < 8: the first w, the rest 0).
template <DType KT, bool Exact>
inline __m256 load8(const void* row, i64 at, int w) {
  if (w == 8 && !Exact) {
    const auto* p = static_cast<const char*>(row) + at * kBytes<KT>;
    if constexpr (KT == DType::f32) return _mm256_loadu_ps(reinterpret_cast<const float*>(p));
    if constexpr (KT == DType::f16 || KT == DType::bf16)
      return simd::avx2::widen8(reinterpret_cast<const std::uint16_t*>(p), KT == DType::bf16);
    if constexpr (KT == DType::i8) return i8x8(p);
    if constexpr (KT == DType::fp8_e4m3) return fp8x8(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  return load<KT, Exact>(row, at, w).lo;
}

// dot_tile on AVX2, where 16 registers hold 8 accumulators of 8 lanes (one per score), the tile's
// keys and one q vector: up to 8 scores per tile (RR * KK <= 8), so 4 rows take 2 keys and each q
// load feeds two multiply-adds. With 4 x 1 tiles of 16-lane pairs every multiply-add had its own q
// load and the load ports set the pace. Zen 3, 1 thread, L1-resident, D 128, 4 rows, medians of 5
// alternating runs: bf16 23.4 against 25.8 ns per key and kv head, int8 21.5 against 24.9, f32
// 21.6 against 41.0. Each score is one chain over D in steps of 8, then the fixed tree
// ((l0 + l1) + (l2 + l3)) + ((l4 + l5) + (l6 + l7)) of its lanes, whatever the tile.
template <DType KT, bool Exact, int RR, int KK, i64 kD>
__attribute__((noinline)) void dot_tile8(const float* Q, i64 ldq, const char* const* krows, i64 koff, i64 D_,
                                         float* s, i64 lds) {
  static_assert(RR * KK <= 8);
  const i64 D = kD ? kD : D_;
  const char* k[KK];
  for (int j = 0; j < KK; ++j) k[j] = krows[j] + koff;
  __m256 a[8];
  for (int x = 0; x < 8; ++x) a[x] = _mm256_setzero_ps();
  const auto step = [&](i64 d, int w) __attribute__((always_inline)) {
    __m256 kv[KK];
    for (int j = 0; j < KK; ++j) kv[j] = load8<KT, Exact>(k[j], d, w);
    for (int r = 0; r < RR; ++r) {
      __m256 q = w == 8 ? _mm256_loadu_ps(Q + r * ldq + d) : simd::load_n(Q + r * ldq + d, w).lo;
      // One load per row and step: GCC would otherwise fold the load into every multiply-add.
      if constexpr (KK > 1) __asm__("" : "+x"(q));
      for (int j = 0; j < KK; ++j) a[r * KK + j] = _mm256_fmadd_ps(q, kv[j], a[r * KK + j]);
    }
  };
  i64 d = 0;
  for (; d + 8 <= D; d += 8) step(d, 8);
  if (d < D) step(d, static_cast<int>(D - d));
  const __m256 h0 = _mm256_hadd_ps(_mm256_hadd_ps(a[0], a[1]), _mm256_hadd_ps(a[2], a[3]));
  const __m256 h1 = RR * KK > 4 ? _mm256_hadd_ps(_mm256_hadd_ps(a[4], a[5]), _mm256_hadd_ps(a[6], a[7]))
                                : _mm256_setzero_ps();
  alignas(32) float out[8];
  _mm256_store_ps(out,
                  _mm256_add_ps(_mm256_permute2f128_ps(h0, h1, 0x20), _mm256_permute2f128_ps(h0, h1, 0x31)));
  for (int r = 0; r < RR; ++r)
    for (int j = 0; j < KK; ++j) s[r * lds + j] = out[r * KK + j];
}
#endif

// Whether dot_block takes dot_tile8's tiles (below): asked for, and a GQA group's two rows or more.
inline bool takes_tiles8(bool tiles8, i64 R) {
  return ATTNOPS_SIMD_LEVEL == 1 && tiles8 && R >= 2;
}

// The steps dot_block takes per kv head (its tiles): what a Prefetcher's rate is sized for.
inline i64 dot_steps(i64 R, i64 n, bool tiles8) {
  if (takes_tiles8(tiles8, R)) {
    if (R == 2) return n / 4 + n % 4;
    return (R + 3) / 4 * (n / 2 + n % 2);
  }
  if (R == 1) return n / 4 + n % 4;
  if (R == 2) return n / 2 + n % 2;
  return (R + 3) / 4 * n;
}

// s[h * shs + r * lds + j] = Q_hr . k_hj for every kv head h < H, row r < R and key j < n: key
// j's row of head h at krows[j] + h * khs (bytes), D elements of dtype KT; head h's fp32 query
// rows at Q + h * qhs, ldq apart. Rows in tiles of four from row 0 (one key at a time), or, for
// one or two rows, tiles over four or two keys. Key-major: a key's (or a multi-key tile's) tiles
// of every head before the next keys, so that a token's row of all heads (one contiguous run of
// its page) is read in address order, which the hardware prefetchers follow (head by head the
// reads jump by a token's bytes). Each score is its tile's whatever the order, bit for bit.
// vrows: the same keys' value rows (head h at + h * vhs, vbytes), each prefetched into L1 as its
// head's scores are formed, for the P.V that follows.
// tiles8 (AVX2; ignored elsewhere): dot_tile8's tiles instead, whose sums differ from dot_tile's,
// so the choice is the call's, the same for all its rows (batch invariance): the caller takes
// them for GQA groups (R >= 2 in every chunk). One row per kv head keeps dot_tile's 1 x 4 tiles:
// memory-bound, the decode of 32768 keys ran 1.1x faster with them than with dot_tile8's (0.725
// against 0.665 of the read, 6 alternating runs of each on Zen 3), at the same speed in L1.
template <DType KT, bool Exact, i64 kD>
void dot_block_d(const float* Q, i64 qhs, i64 ldq, i64 R, i64 H, const char* const* krows, i64 khs,
                 const char* const* vrows, i64 vhs, i64 vbytes, i64 n, i64 D, float* s, i64 shs, i64 lds,
                 Prefetcher& pf, bool tiles8) {
  const auto vpf = [&](i64 j, i64 h) { vanilla::prefetch_bytes(vrows[j] + h * vhs, vbytes); };
#if ATTNOPS_SIMD_LEVEL == 1
  // tiles8: two rows x 4 keys or up to four rows x 2 keys; the keys left over one at a time (a
  // GQA group has two rows or more).
  if (takes_tiles8(tiles8, R)) {
    const auto tiles = [&](auto kk, i64 j) {
      constexpr int KK = decltype(kk)::value;
      for (i64 h = 0; h < H; ++h) {
        for (i64 r0 = 0; r0 < R; r0 += 4, pf.step()) {
          const float* q = Q + h * qhs + r0 * ldq;
          const char* const* k = krows + j;
          float* o = s + h * shs + r0 * lds + j;
          const i64 ko = h * khs;
          // The full tiles unrolled for kD; the edges (last key, last rows) in a loop over D, which
          // forms the same sums (unrolled too, they cost this tier 3.6 s more to compile).
          const auto tile = [&](auto rr) {
            constexpr int RR = decltype(rr)::value;
            constexpr bool full = RR * KK == 8;
            dot_tile8<KT, Exact, RR, KK, full ? kD : 0>(q, ldq, k, ko, D, o, lds);
          };
          switch (std::min<i64>(R - r0, 4)) {
            case 1:
              if constexpr (KK <= 2) tile(std::integral_constant<int, 1>{});
              break;
            case 2:
              tile(std::integral_constant<int, 2>{});
              break;
            case 3:
              if constexpr (KK <= 2) tile(std::integral_constant<int, 3>{});
              break;
            default:
              if constexpr (KK <= 2) tile(std::integral_constant<int, 4>{});
              break;
          }
        }
        for (i64 x = 0; x < KK; ++x) vpf(j + x, h);
      }
    };
    using K1 = std::integral_constant<int, 1>;
    i64 j = 0;
    if (R == 2)
      for (; j + 4 <= n; j += 4) tiles(std::integral_constant<int, 4>{}, j);
    else
      for (; j + 2 <= n; j += 2) tiles(std::integral_constant<int, 2>{}, j);
    for (; j < n; ++j) tiles(K1{}, j);
    return;
  }
#else
  (void)tiles8;
#endif
  if (R <= 2) {
    i64 j = 0;
    if (R == 1) {
      for (; j + 4 <= n; j += 4)
        for (i64 h = 0; h < H; ++h, pf.step()) {
          dot_tile<KT, Exact, 1, 4, kD>(Q + h * qhs, ldq, krows + j, h * khs, D, s + h * shs + j, lds);
          for (i64 x = 0; x < 4; ++x) vpf(j + x, h);
        }
    } else {
      for (; j + 2 <= n; j += 2)
        for (i64 h = 0; h < H; ++h, pf.step()) {
          dot_tile<KT, Exact, 2, 2, kD>(Q + h * qhs, ldq, krows + j, h * khs, D, s + h * shs + j, lds);
          vpf(j, h), vpf(j + 1, h);
        }
    }
    for (; j < n; ++j)
      for (i64 h = 0; h < H; ++h, pf.step()) {
        if (R == 1)
          dot_tile<KT, Exact, 1, 1, kD>(Q + h * qhs, ldq, krows + j, h * khs, D, s + h * shs + j, lds);
        else
          dot_tile<KT, Exact, 2, 1, kD>(Q + h * qhs, ldq, krows + j, h * khs, D, s + h * shs + j, lds);
        vpf(j, h);
      }
    return;
  }
  for (i64 j = 0; j < n; ++j)
    for (i64 h = 0; h < H; ++h) {
      for (i64 r0 = 0; r0 < R; r0 += 4, pf.step()) {
        const float* q = Q + h * qhs + r0 * ldq;
        float* o = s + h * shs + r0 * lds + j;
        switch (R - r0 >= 4 ? 4 : R - r0) {
          case 4:
            dot_tile<KT, Exact, 4, 1, kD>(q, ldq, krows + j, h * khs, D, o, lds);
            break;
          case 3:
            dot_tile<KT, Exact, 3, 1, kD>(q, ldq, krows + j, h * khs, D, o, lds);
            break;
          case 2:
            dot_tile<KT, Exact, 2, 1, kD>(q, ldq, krows + j, h * khs, D, o, lds);
            break;
          default:
            dot_tile<KT, Exact, 1, 1, kD>(q, ldq, krows + j, h * khs, D, o, lds);
            break;
        }
      }
      vpf(j, h);
    }
}

// dot_block_d for D = 128 unrolled (the common head dim; each more adds ~3 s to every tier's build),
// any other D in a loop.
template <DType KT, bool Exact>
void dot_block(const float* Q, i64 qhs, i64 ldq, i64 R, i64 H, const char* const* krows, i64 khs,
               const char* const* vrows, i64 vhs, i64 vbytes, i64 n, i64 D, float* s, i64 shs, i64 lds,
               Prefetcher& pf, bool tiles8) {
  if (D == 128)
    return dot_block_d<KT, Exact, 128>(Q, qhs, ldq, R, H, krows, khs, vrows, vhs, vbytes, n, D, s, shs, lds,
                                       pf, tiles8);
  dot_block_d<KT, Exact, 0>(Q, qhs, ldq, R, H, krows, khs, vrows, vhs, vbytes, n, D, s, shs, lds, pf, tiles8);
}

// acc[r * ldacc + c] += sum_j P[r * ldp + j] * v_j[c] for RR rows and the CV column slices of 16
// from column c0 (held in registers while the n value rows stream through). kSkipZeros: a weight
// of 0 is skipped, not multiplied (the non-finite policy's guarded re-run). Full: all CV slices
// are whole (no masked access in the loop). Not inlined, as dot_tile: inlined into the block
// loops, GCC keeps the accumulators on the stack and every FMA waits on a store and a reload
// (measured on Zen 3: 2.5-3x slower).
template <DType KT, bool Exact, bool kSkipZeros, int RR, int CV, bool Full>
__attribute__((noinline)) void pv_tile_body(const float* P, i64 ldp, const char* const* vrows, i64 voff,
                                            i64 n, i64 c0, i64 Dv, float* acc, i64 ldacc) {
  int w[CV];
  for (int u = 0; u < CV; ++u) {
    const i64 left = Dv - c0 - 16 * u;
    w[u] = Full ? 16 : left <= 0 ? 0 : vanilla::lanes_left(left);
  }
  V16 a[RR][CV];
  for (int r = 0; r < RR; ++r)
    for (int u = 0; u < CV; ++u)
      a[r][u] = Full ? simd::load(acc + r * ldacc + c0 + 16 * u)
                     : simd::load_n(acc + r * ldacc + c0 + 16 * u, w[u]);
  for (i64 j = 0; j < n; ++j) {
    const char* v = vrows[j] + voff;
    V16 vv[CV];
    for (int u = 0; u < CV; ++u) {
      if constexpr (Full)
        vv[u] = load<KT, Exact>(v, c0 + 16 * u, 16);
      else
        vv[u] = w[u] ? load<KT, Exact>(v, c0 + 16 * u, w[u]) : simd::zero();
    }
    for (int r = 0; r < RR; ++r) {
      const float pr = P[r * ldp + j];
      if (kSkipZeros && pr == 0.f) continue;
      const V16 pj = simd::set1(pr);
      for (int u = 0; u < CV; ++u) a[r][u] = simd::fma(pj, vv[u], a[r][u]);
    }
  }
  for (int r = 0; r < RR; ++r)
    for (int u = 0; u < CV; ++u) {
      if constexpr (Full)
        simd::store(acc + r * ldacc + c0 + 16 * u, a[r][u]);
      else
        simd::store_n(acc + r * ldacc + c0 + 16 * u, a[r][u], w[u]);
    }
}

template <DType KT, bool Exact, bool kSkipZeros, int RR, int CV>
inline void pv_tile(const float* P, i64 ldp, const char* const* vrows, i64 voff, i64 n, i64 c0, i64 Dv,
                    float* acc, i64 ldacc) {
  if (c0 + 16 * CV <= Dv)
    pv_tile_body<KT, Exact, kSkipZeros, RR, CV, true>(P, ldp, vrows, voff, n, c0, Dv, acc, ldacc);
  else
    pv_tile_body<KT, Exact, kSkipZeros, RR, CV, false>(P, ldp, vrows, voff, n, c0, Dv, acc, ldacc);
}

template <DType KT, bool Exact, bool kSkipZeros, int RR>
inline void pv_rows(const float* P, i64 ldp, const char* const* vrows, i64 voff, i64 n, i64 Dv, float* acc,
                    i64 ldacc) {
  constexpr int CV = kPvAccs / RR > 0 ? kPvAccs / RR : 1;
  for (i64 c0 = 0; c0 < Dv; c0 += 16 * CV)
    pv_tile<KT, Exact, kSkipZeros, RR, CV>(P, ldp, vrows, voff, n, c0, Dv, acc, ldacc);
}

// acc[r * ldacc + c] += sum_j P[r * ldp + j] * v_j[c] for r < R, j < n, c < Dv: the value rows at
// vrows[j] + voff (bytes), dtype KT. Rows in tiles of four from row 0.
template <DType KT, bool Exact, bool kSkipZeros>
void pv_block(const float* P, i64 ldp, i64 R, const char* const* vrows, i64 voff, i64 n, i64 Dv, float* acc,
              i64 ldacc) {
  for (i64 r0 = 0; r0 < R; r0 += 4) {
    const float* p = P + r0 * ldp;
    float* a = acc + r0 * ldacc;
    switch (R - r0 >= 4 ? 4 : R - r0) {
      case 4:
        pv_rows<KT, Exact, kSkipZeros, 4>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      case 3:
        pv_rows<KT, Exact, kSkipZeros, 3>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      case 2:
        pv_rows<KT, Exact, kSkipZeros, 2>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
      default:
        pv_rows<KT, Exact, kSkipZeros, 1>(p, ldp, vrows, voff, n, Dv, a, ldacc);
        break;
    }
  }
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::paged_simd
