// The vector primitives under the CPU kernels (simd16.h's V16 bodies and vanilla_simd.h), checked
// on every tier this machine runs where an error would be diluted in the end-to-end comparison:
// exp over its whole argument range (exact zeros below -87, no subnormal results), tanh, lane
// masks and gathers, and the widening dot / P.V kernels over head dims with vector tails.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "tests/support/testing.h"
#include "tests/tiers/simd_probe.h"

namespace attnops::cpu {
namespace {

// The probes of the tiers in this build (ATTNOPS_CPU_BUILT_TIERS, bit i: the tier of level i).
const SimdProbe& probe(Isa isa) {
  switch (isa) {
#if ATTNOPS_CPU_BUILT_TIERS & 2
    case Isa::avx2:
      return tier_avx2::simd_probe();
#endif
#if ATTNOPS_CPU_BUILT_TIERS & 4
    case Isa::avx512:
      return tier_avx512::simd_probe();
#endif
#if ATTNOPS_CPU_BUILT_TIERS & 8
    case Isa::avx512bf16:
      return tier_avx512bf16::simd_probe();
#endif
#if ATTNOPS_CPU_BUILT_TIERS & 16
    case Isa::amx:
      return tier_amx::simd_probe();
#endif
    default:
      break;
  }
  return tier_baseline::simd_probe();
}

TEST(Simd16, ExpIsAccurateZeroBelowMinus87AndNeverSubnormal) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> x;
  for (float v = -100.f; v <= 88.f; v += 0.0173f) x.push_back(v);
  for (float v : {-inf, -87.f, -86.99999f, -87.00001f, 0.f, 88.3f}) x.push_back(v);
  for (const Isa tier : testing::cpu_tiers_to_test()) {
    SCOPED_TRACE(testing::tier_label(tier));
    std::vector<float> y(x.size());
    probe(tier).exp(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    double worst_rel = 0;
    for (std::size_t i = 0; i < x.size(); ++i) {
      EXPECT_NE(std::fpclassify(y[i]), FP_SUBNORMAL) << "exp(" << x[i] << ")";
      if (x[i] < -87.f) {
        EXPECT_EQ(y[i], 0.f) << "exp(" << x[i] << ")";
      } else {
        const double ref = std::exp(static_cast<double>(x[i]));
        worst_rel = std::max(worst_rel, std::abs(y[i] - ref) / ref);
      }
    }
    EXPECT_LE(worst_rel, 5e-7);  // a few ulp of fp32
  }
}

TEST(Simd16, TanhHasSmallAbsoluteError) {
  std::vector<float> x;
  for (float v = -20.f; v <= 20.f; v += 0.0371f) x.push_back(v);
  for (const Isa tier : testing::cpu_tiers_to_test()) {
    std::vector<float> y(x.size());
    probe(tier).tanh(x.data(), y.data(), static_cast<std::int64_t>(x.size()));
    for (std::size_t i = 0; i < x.size(); ++i)
      ASSERT_NEAR(y[i], std::tanh(static_cast<double>(x[i])), 3e-7)
          << "tanh(" << x[i] << ") " << testing::tier_label(tier);
  }
}

TEST(Simd16, MasksSelectAndGatherFollowTheLaneBits) {
  float a[16], b[16], base[16 * 7];
  for (int l = 0; l < 16; ++l) {
    a[l] = static_cast<float>(l % 5);
    b[l] = static_cast<float>(l % 3);
  }
  for (int i = 0; i < 16 * 7; ++i) base[i] = static_cast<float>(i) * 0.5f;
  for (const Isa tier : testing::cpu_tiers_to_test()) {
    SCOPED_TRACE(testing::tier_label(tier));
    float sel[16], gathered[16];
    std::uint32_t eq = 0, lt = 0;
    probe(tier).masks(a, b, sel, &eq, &lt);
    probe(tier).gather(base, 7, 0xa5c3u, gathered);
    for (int l = 0; l < 16; ++l) {
      EXPECT_EQ((eq >> l) & 1u, a[l] == b[l] ? 1u : 0u) << "lane " << l;
      EXPECT_EQ((lt >> l) & 1u, a[l] < b[l] ? 1u : 0u) << "lane " << l;
      EXPECT_EQ(sel[l], std::min(a[l], b[l])) << "lane " << l;
      EXPECT_EQ(gathered[l], (0xa5c3u >> l) & 1u ? base[l * 7] : 0.f) << "lane " << l;
    }
  }
}

TEST(Simd16, ExpShiftSumIsZeroWhereMaskedAndSumsTheRest) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> in;
  for (float x = -90.f; x <= 0.f; x += 0.0137f) in.push_back(x);
  in.push_back(-inf);
  in.push_back(0.f);
  const float m = 0.25f;
  for (const Isa tier : testing::cpu_tiers_to_test()) {
    SCOPED_TRACE(testing::tier_label(tier));
    std::vector<float> s = in;
    for (float& x : s) x += m;  // exp_shift_sum subtracts m back
    const float sum = probe(tier).exp_shift_sum(s.data(), static_cast<std::int64_t>(s.size()), m);
    double ref_sum = 0;
    for (std::size_t j = 0; j < s.size(); ++j) {
      const double ref = in[j] >= -87.f ? std::exp(static_cast<double>(in[j])) : 0.0;
      ref_sum += ref;
      if (in[j] < -87.f) {
        EXPECT_EQ(s[j], 0.f) << "argument " << in[j];
      }
    }
    EXPECT_NEAR(sum, ref_sum, 1e-5 * ref_sum);
  }
}

// dot_key and pv_block over head dims with vector tails, every row count of the pv tiles (1..4
// and a remainder), f32 / f16 / bf16 rows widened in registers; convert_row likewise.
TEST(Simd16, DotPvAndConvertWidenEveryDtypeOverTails) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (const Isa tier : testing::cpu_tiers_to_test()) {
    const SimdProbe& pr = probe(tier);
    for (std::int64_t D : {1, 15, 16, 17, 40, 80, 112, 256}) {
      for (std::int64_t R : {1, 2, 3, 4, 5, 8}) {
        const std::int64_t n = 7;  // value rows in the block
        std::vector<float> q(static_cast<std::size_t>(R * D)), kf(static_cast<std::size_t>(n * D));
        std::vector<float> P(static_cast<std::size_t>(R * n));
        for (float& x : q) x = u(rng);
        for (float& x : kf) x = u(rng);
        for (float& x : P) x = u(rng) > 0.5f ? 0.f : u(rng);  // some masked (exactly 0) entries
        std::vector<std::uint16_t> kh(kf.size()), kb(kf.size());
        for (std::size_t d = 0; d < kf.size(); ++d) {
          kh[d] = float_to_half_bits(kf[d]);
          kb[d] = float_to_bf16_bits(kf[d]);
        }
        for (const DType dt : {DType::f32, DType::f16, DType::bf16}) {
          const void* k = dt == DType::f32   ? static_cast<const void*>(kf.data())
                          : dt == DType::f16 ? static_cast<const void*>(kh.data())
                                             : kb.data();
          auto kval = [&](std::int64_t i) {
            return static_cast<double>(load_as_float(k, dt, static_cast<std::size_t>(i)));
          };
          const std::string where = testing::tier_label(tier) + " " + std::string(dtype_name(dt)) +
                                    " D=" + std::to_string(D) + " R=" + std::to_string(R);
          std::vector<float> s(static_cast<std::size_t>(R));
          pr.dot_key(dt, q.data(), D, R, k, D, s.data(), 1);
          std::vector<float> acc(static_cast<std::size_t>(R * D), 1.f);
          pr.pv_block(dt, P.data(), n, R, k, D, n, D, acc.data(), D);
          std::vector<float> row(static_cast<std::size_t>(n * D));
          pr.convert_row(k, dt, n * D, row.data(), 2.f);
          for (std::int64_t i = 0; i < n * D; ++i)
            ASSERT_EQ(row[static_cast<std::size_t>(i)], 2.0 * kval(i)) << where;
          for (std::int64_t r = 0; r < R; ++r) {
            double dot = 0;
            for (std::int64_t d = 0; d < D; ++d)
              dot += static_cast<double>(q[static_cast<std::size_t>(r * D + d)]) * kval(d);
            EXPECT_NEAR(s[static_cast<std::size_t>(r)], dot, 1e-5 * static_cast<double>(D))
                << where << " r=" << r;
            for (std::int64_t d = 0; d < D; ++d) {
              double ref = 1.0;
              for (std::int64_t j = 0; j < n; ++j)
                ref += static_cast<double>(P[static_cast<std::size_t>(r * n + j)]) * kval(j * D + d);
              EXPECT_NEAR(acc[static_cast<std::size_t>(r * D + d)], ref, 1e-5)
                  << where << " r=" << r << " d=" << d;
            }
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace attnops::cpu
