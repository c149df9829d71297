// AMX tile operations for the amx tier (per-tier header), real or emulated.
//
// Real (the amx tier, -mamx-tile -mamx-bf16): GCC's intrinsics. _tile_loadd, _tile_stored,
// _tile_zero and _tile_dpbf16ps are inline-asm macros that paste the tile number into the
// instruction text, so tile numbers must be integer literals (hence macros here too).
//
// Emulated (ATTNOPS_ISA_EMULATE, the tests' build of the tier's kernels with the avx2 flags,
// tests/tiers): the same operations on a per-thread array of eight 1 KiB tiles in scalar C++,
// following the instruction definitions (Intel SDM; felixcloutier.com/x86/tdpbf16ps), including
// DAZ/FTZ of TDPBF16PS. It proves the packing layouts, strides and loop structure on any AVX2 CPU.
//
// Tile state is per thread: every thread that runs tile instructions loads the configuration
// first (configure) and releases it at the end (release), which returns the tile registers to
// their initial state (the kernel then skips them in signal frames and context switches).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#if ATTNOPS_TIER_LEVEL < 4
#error "amx_tiles.h is for the amx tier"
#endif

namespace attnops::cpu::ATTNOPS_TIER_NS::amx {

// LDTILECFG's 64-byte operand, palette 1: 8 tiles of at most 16 rows x 64 bytes.
struct alignas(64) TileConfig {
  std::uint8_t palette_id = 0, start_row = 0;
  std::uint8_t reserved[14] = {};
  std::uint16_t colsb[16] = {};  // bytes per row of tile i
  std::uint8_t rows[16] = {};    // rows of tile i
};
static_assert(sizeof(TileConfig) == 64);

// Every tile 16 rows x 64 bytes: 16 x 16 fp32 (C), 16 x 32 bf16 (A), 16 pair-rows x 16 x 2 bf16 (B).
inline TileConfig full_tiles() {
  TileConfig c;
  c.palette_id = 1;
  for (int t = 0; t < 8; ++t) {
    c.rows[t] = 16;
    c.colsb[t] = 64;
  }
  return c;
}

#if defined(ATTNOPS_ISA_EMULATE)

namespace emu {
struct State {
  TileConfig cfg;
  alignas(64) unsigned char tile[8][16 * 64];
};
inline State& state() {
  static thread_local State s;  // zero-initialised, no constructor runs
  return s;
}
inline float bf16_daz(std::uint16_t b) {
  if ((b & 0x7f80u) == 0) b &= 0x8000u;  // denormal inputs are zero (DAZ)
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float ftz(float x) {
  return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.f, x) : x;
}
inline void loadconfig(const TileConfig* c) {
  state().cfg = *c;
  std::memset(state().tile, 0, sizeof state().tile);
}
inline void release() {
  state().cfg = TileConfig{};
  std::memset(state().tile, 0, sizeof state().tile);
}
inline void loadd(int t, const void* base, std::int64_t stride) {
  State& s = state();
  std::memset(s.tile[t], 0, sizeof s.tile[t]);
  for (int r = 0; r < s.cfg.rows[t]; ++r)
    std::memcpy(s.tile[t] + r * 64, static_cast<const unsigned char*>(base) + r * stride, s.cfg.colsb[t]);
}
inline void stored(int t, void* base, std::int64_t stride) {
  State& s = state();
  for (int r = 0; r < s.cfg.rows[t]; ++r)
    std::memcpy(static_cast<unsigned char*>(base) + r * stride, s.tile[t] + r * 64, s.cfg.colsb[t]);
}
inline void zero(int t) {
  std::memset(state().tile[t], 0, sizeof state().tile[t]);
}
// c[m][n] += sum_k a[m][2k] * b[k][2n] + a[m][2k+1] * b[k][2n+1] (fp32 accumulate, DAZ/FTZ).
inline void dpbf16ps(int tc, int ta, int tb) {
  State& s = state();
  const int M = s.cfg.rows[tc], N = s.cfg.colsb[tc] / 4, K = s.cfg.colsb[ta] / 4;
  for (int m = 0; m < M; ++m)
    for (int n = 0; n < N; ++n) {
      float c;
      std::memcpy(&c, s.tile[tc] + m * 64 + n * 4, 4);
      for (int k = 0; k < K; ++k) {
        std::uint16_t a[2], b[2];
        std::memcpy(a, s.tile[ta] + m * 64 + k * 4, 4);
        std::memcpy(b, s.tile[tb] + k * 64 + n * 4, 4);
        c = ftz(c + bf16_daz(a[0]) * bf16_daz(b[0]));
        c = ftz(c + bf16_daz(a[1]) * bf16_daz(b[1]));
      }
      std::memcpy(s.tile[tc] + m * 64 + n * 4, &c, 4);
    }
}
}  // namespace emu

#define ATTNOPS_AMX_LOADCONFIG(cfg) ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::loadconfig(cfg)
#define ATTNOPS_AMX_RELEASE() ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::release()
#define ATTNOPS_AMX_LOADD(t, base, stride) ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::loadd(t, base, stride)
#define ATTNOPS_AMX_STORED(t, base, stride) ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::stored(t, base, stride)
#define ATTNOPS_AMX_ZERO(t) ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::zero(t)
#define ATTNOPS_AMX_DPBF16PS(c, a, b) ::attnops::cpu::ATTNOPS_TIER_NS::amx::emu::dpbf16ps(c, a, b)

#else  // real AMX

// GCC spells the feature macros __AMX_TILE__ / __AMX_BF16__, clang __AMXTILE__ / __AMXBF16__.
#if !(defined(__AMX_TILE__) || defined(__AMXTILE__)) || !(defined(__AMX_BF16__) || defined(__AMXBF16__))
#error "the amx tier is compiled with -mamx-tile -mamx-bf16 (backends/cpu/tiers.cmake)"
#endif
#include <immintrin.h>

#define ATTNOPS_AMX_LOADCONFIG(cfg) _tile_loadconfig(cfg)
#define ATTNOPS_AMX_RELEASE() _tile_release()
#define ATTNOPS_AMX_LOADD(t, base, stride) _tile_loadd(t, base, stride)
#define ATTNOPS_AMX_STORED(t, base, stride) _tile_stored(t, base, stride)
#define ATTNOPS_AMX_ZERO(t) _tile_zero(t)
#define ATTNOPS_AMX_DPBF16PS(c, a, b) _tile_dpbf16ps(c, a, b)

#endif

// Loads the all-16x64 configuration on the calling thread (before its first tile instruction).
inline void configure_tiles() {
  const TileConfig c = full_tiles();
  ATTNOPS_AMX_LOADCONFIG(&c);
}
// Returns the calling thread's tile state to its initial state.
inline void release_tiles() {
  ATTNOPS_AMX_RELEASE();
}

}  // namespace attnops::cpu::ATTNOPS_TIER_NS::amx
