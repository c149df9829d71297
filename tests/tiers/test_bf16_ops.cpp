// The bf16 pair operations under the avx512bf16 and amx tiers (backends/cpu/simd16_bf16.h): the
// emulated body (the tests' avx2 builds of those tiers) against the instruction definitions of
// the Intel SDM on hand-made cases (VDPBF16PS: odd pair first, DAZ on inputs, FTZ on results;
// VCVTNE2PS2BF16: round to nearest even, denormals to signed 0, NaN kept quiet), and, where this
// CPU has AVX-512 BF16, the real instructions against the emulation bit for bit on random and
// special inputs (so the emulated tiers compute what the hardware does).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>

#include "backends/cpu/isa.h"
#include "tests/tiers/bf16_probe.h"

namespace attnops::cpu {
namespace {

std::uint16_t bf(float f) {  // exact for the values used below (bf16-representable)
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return static_cast<std::uint16_t>(u >> 16);
}
std::uint32_t bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float from_bits(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

const Bf16Probe& emulated() {
  return tier_avx512bf16_emulated::bf16_probe();
}

// Lane 0 of dot_pairs with the pairs (a0, a1), (b0, b1) in every lane.
float dot1(const Bf16Probe& pr, float acc, std::uint16_t a0, std::uint16_t a1, std::uint16_t b0,
           std::uint16_t b1) {
  float accs[16], out[16];
  std::uint16_t a[32], b[32];
  for (int l = 0; l < 16; ++l) {
    accs[l] = acc;
    a[2 * l] = a0, a[2 * l + 1] = a1, b[2 * l] = b0, b[2 * l + 1] = b1;
  }
  pr.dot_pairs(accs, a, b, out);
  for (int l = 1; l < 16; ++l) EXPECT_EQ(bits(out[l]), bits(out[0]));
  return out[0];
}

TEST(Bf16Ops, EmulatedDotPairsFollowsTheDefinition) {
  const Bf16Probe& e = emulated();
  ASSERT_TRUE(e.emulated);
  EXPECT_EQ(dot1(e, 0.5f, bf(1.f), bf(2.f), bf(3.f), bf(4.f)), 11.5f);
  // Odd pair first: 1 + 2^24 rounds to 2^24, then + 1 rounds again (even first would give 2^24 + 2).
  EXPECT_EQ(dot1(e, 1.f, bf(1.f), bf(4096.f), bf(1.f), bf(4096.f)), 16777216.f);
  // DAZ: a denormal bf16 input counts as 0.
  EXPECT_EQ(dot1(e, 1.f, 0x0001, 0, bf(1e30f), 0), 1.f);
  // FTZ: a denormal result is 0 (its sign kept).
  const float r = dot1(e, 0.f, bf(std::ldexp(1.f, -100)), 0, bf(-std::ldexp(1.f, -30)), 0);
  EXPECT_EQ(bits(r), 0x80000000u);
  // A denormal accumulator counts as 0.
  EXPECT_EQ(dot1(e, from_bits(0x00000005u), 0, 0, 0, 0), 0.f);
  // NaN and inf propagate.
  EXPECT_TRUE(std::isnan(dot1(e, 0.f, bf(std::numeric_limits<float>::infinity()), 0, 0, 0)));  // inf * 0
}

TEST(Bf16Ops, EmulatedStorePairsRoundsToNearestEven) {
  const Bf16Probe& e = emulated();
  float p0[16], p1[16];
  std::uint16_t out[32];
  const float inf = std::numeric_limits<float>::infinity();
  const float cases0[16] = {1.f,
                            1.00390625f,
                            1.01171875f,
                            -1.00390625f,
                            from_bits(0x00000001u),
                            -0.f,
                            inf,
                            -inf,
                            from_bits(0x7f800001u),
                            from_bits(0xffc00000u),
                            3.4e38f,
                            1e-38f,
                            2.f,
                            0.5f,
                            from_bits(0x3f80ffffu),
                            from_bits(0x3f818000u)};
  const std::uint16_t want0[16] = {0x3f80, 0x3f80, 0x3f82, 0xbf80, 0x0000, 0x8000, 0x7f80, 0xff80,
                                   0x7fc0, 0xffc0, 0x7f80, 0x0000, 0x4000, 0x3f00, 0x3f81, 0x3f82};
  // (3.4e38 rounds up to inf; 1e-38 is denormal: 0.)
  for (int l = 0; l < 16; ++l) p0[l] = cases0[l], p1[l] = static_cast<float>(l);
  e.store_pairs(p0, p1, out);
  for (int l = 0; l < 16; ++l) {
    EXPECT_EQ(out[2 * l], want0[l]) << "lane " << l;
    EXPECT_EQ(out[2 * l + 1], bf(static_cast<float>(l))) << "lane " << l;
  }
}

TEST(Bf16Ops, EmulatedInterleaveAndExp2) {
  const Bf16Probe& e = emulated();
  std::uint16_t r0[32], r1[32], out[64];
  for (int i = 0; i < 32; ++i)
    r0[i] = static_cast<std::uint16_t>(i + 1), r1[i] = static_cast<std::uint16_t>(100 + i);
  for (int w : {1, 5, 16, 17, 32})
    for (bool second : {false, true}) {
      std::fill(out, out + 64, std::uint16_t{0xdead});
      e.interleave_rows(r0, second ? r1 : nullptr, w, out);
      for (int i = 0; i < 64; ++i) {
        const int c = i / 2;
        const std::uint16_t want = c >= w ? 0xdead : i % 2 == 0 ? r0[c] : second ? r1[c] : 0;
        EXPECT_EQ(out[i], want) << "w " << w << " i " << i;
      }
    }
  float t[16], o[16];
  for (float base : {-130.f, -40.f, -1.f}) {
    for (int l = 0; l < 16; ++l) t[l] = base + static_cast<float>(l) * 0.0617f * (base == -1.f ? 1.f : 8.f);
    t[15] = 0.f;
    e.exp2_p(t, o);
    for (int l = 0; l < 16; ++l) {
      if (t[l] < -125.f) {
        EXPECT_EQ(bits(o[l]), 0u) << t[l];
      } else {
        EXPECT_NEAR(o[l] / std::exp2(static_cast<double>(t[l])), 1.0, 3e-6) << t[l];
        EXPECT_EQ(std::fpclassify(o[l]), FP_NORMAL) << t[l];
      }
    }
    EXPECT_EQ(o[15], 1.f);
  }
  t[0] = -std::numeric_limits<float>::infinity(), t[1] = std::numeric_limits<float>::quiet_NaN();
  e.exp2_p(t, o);
  EXPECT_EQ(bits(o[0]), 0u);
  EXPECT_TRUE(std::isnan(o[1]));
}

#if ATTNOPS_TEST_REAL_BF16_PROBE
// A random bf16 with every exponent, denormals, zeros, infinities and NaNs among them.
std::uint16_t random_bf16(std::mt19937& rng) {
  const std::uint32_t r = rng();
  switch (r % 16) {
    case 0:
      return static_cast<std::uint16_t>(r >> 16 & 0x807f);  // 0 or denormal
    case 1:
      return static_cast<std::uint16_t>(0x7f80 | (r >> 16 & 0x8000) | (r % 7 == 0 ? 0x41 : 0));  // inf / NaN
    default:
      return static_cast<std::uint16_t>(r >> 16);
  }
}

#endif

TEST(Bf16Ops, RealInstructionsMatchTheEmulation) {
#if ATTNOPS_TEST_REAL_BF16_PROBE
  if (detect_isa().best < Isa::avx512bf16)
    GTEST_SKIP() << "this CPU lacks AVX-512 BF16 (" << detect_isa().refused << ")";
  const Bf16Probe& real = tier_avx512bf16::bf16_probe();
  const Bf16Probe& e = emulated();
  ASSERT_FALSE(real.emulated);
  std::mt19937 rng(20261127);
  auto same = [](float x, float y) { return bits(x) == bits(y) || (std::isnan(x) && std::isnan(y)); };
  for (int it = 0; it < 20000; ++it) {
    float acc[16], p0[16], p1[16], t[16], want[16], got[16];
    std::uint16_t a[32], b[32], ow[32], og[32];
    for (int i = 0; i < 32; ++i) {
      a[i] = random_bf16(rng), b[i] = random_bf16(rng);
      // Mostly moderate magnitudes, so sums (not only specials) are compared.
      if (it % 2) a[i] &= 0xbfff, b[i] &= 0xbfff;
    }
    for (int l = 0; l < 16; ++l) {
      acc[l] = from_bits(rng());
      p0[l] = from_bits(rng()), p1[l] = from_bits(rng());
      t[l] = -static_cast<float>(rng() % 140000) / 1000.f;
    }
    e.dot_pairs(acc, a, b, want);
    real.dot_pairs(acc, a, b, got);
    for (int l = 0; l < 16; ++l)
      ASSERT_TRUE(same(want[l], got[l])) << "dot_pairs lane " << l << ": " << want[l] << " vs " << got[l];
    e.store_pairs(p0, p1, ow);
    real.store_pairs(p0, p1, og);
    for (int i = 0; i < 32; ++i) {
      const bool nan = (ow[i] & 0x7f80) == 0x7f80 && (ow[i] & 0x7f);
      ASSERT_TRUE(ow[i] == og[i] || (nan && (og[i] & 0x7f80) == 0x7f80 && (og[i] & 0x7f)))
          << "store_pairs " << i;
    }
    e.exp2_p(t, want);
    real.exp2_p(t, got);
    for (int l = 0; l < 16; ++l) ASSERT_TRUE(same(want[l], got[l])) << "exp2_p " << t[l];
  }
  std::uint16_t r0[32], r1[32], ow[64], og[64];
  for (int i = 0; i < 32; ++i) r0[i] = random_bf16(rng), r1[i] = random_bf16(rng);
  for (int w = 1; w <= 32; ++w) {
    std::fill(ow, ow + 64, std::uint16_t{1});
    std::fill(og, og + 64, std::uint16_t{1});
    e.interleave_rows(r0, w % 3 ? r1 : nullptr, w, ow);
    real.interleave_rows(r0, w % 3 ? r1 : nullptr, w, og);
    for (int i = 0; i < 64; ++i) ASSERT_EQ(ow[i], og[i]) << "interleave w " << w;
  }
#else
  GTEST_SKIP() << "this build has no avx512bf16 tier to compare with";
#endif
}

}  // namespace
}  // namespace attnops::cpu
