// The vector primitives under the vanilla kernels (backends/cpu/vanilla_simd.h), checked on
// their own where an error would be diluted in the end-to-end comparison: the softmax exp
// (accuracy over its whole argument range, exact zeros for masked entries) and the widening
// dot / P.V kernels over head dims with vector tails.
//
// GCC 12 reports -Wmaybe-uninitialized inside its own AVX-512 intrinsics once they are inlined
// (a false positive in system headers; see backends/cpu/vanilla_decode.cpp).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "backends/cpu/vanilla_simd.h"

namespace attnops::cpu::vanilla {
namespace {

TEST(VanillaPrimitives, ExpShiftSumIsAccurateAndZeroWhereMasked) {
  const float inf = std::numeric_limits<float>::infinity();
  std::vector<float> s;
  for (float x = -90.f; x <= 0.f; x += 0.0137f) s.push_back(x);
  s.push_back(-inf);
  s.push_back(0.f);
  const std::vector<float> in = s;
  const float m = 0.25f;
  for (float& x : s) x += m;  // exp_shift_sum subtracts m back
  s.back() = m;
  s[s.size() - 2] = -inf;
  const float sum = exp_shift_sum(s.data(), static_cast<i64>(s.size()), m);
  double ref_sum = 0, worst_rel = 0;
  for (std::size_t j = 0; j < s.size(); ++j) {
    const double ref = in[j] > -87.f ? std::exp(static_cast<double>(in[j])) : 0.0;
    ref_sum += ref;
    if (in[j] <= -87.f) {
      EXPECT_EQ(s[j], 0.f) << "argument " << in[j];
    } else {
      worst_rel = std::max(worst_rel, std::abs(s[j] - ref) / ref);
    }
  }
  EXPECT_LE(worst_rel, 5e-7);  // a few ulp of fp32
  EXPECT_NEAR(sum, ref_sum, 1e-5 * ref_sum);
}

// dot_key and pv_block over head dims with vector tails, every row count of the pv tiles (1..4
// and a remainder), f32 / f16 / bf16 rows widened in registers.
TEST(VanillaPrimitives, DotAndPvWidenEveryDtypeOverTails) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  for (i64 D : {1, 15, 16, 17, 40, 80, 112, 256}) {
    for (i64 R : {1, 2, 3, 4, 5, 8}) {
      const i64 n = 7;  // value rows in the block
      std::vector<float> q(static_cast<std::size_t>(R * D)), kf(static_cast<std::size_t>(n * D));
      std::vector<float> P(static_cast<std::size_t>(R * n));
      for (float& x : q) x = u(rng);
      for (float& x : kf) x = u(rng);
      for (float& x : P) x = u(rng) > 0.5f ? 0.f : u(rng);  // some masked (exactly 0) entries
      std::vector<Eigen::half> kh(kf.size());
      std::vector<Eigen::bfloat16> kb(kf.size());
      for (std::size_t d = 0; d < kf.size(); ++d) {
        kh[d] = Eigen::half(kf[d]);
        kb[d] = Eigen::bfloat16(kf[d]);
      }
      auto check = [&](const auto* k) {
        std::vector<float> s(static_cast<std::size_t>(R));
        dot_key(q.data(), D, R, k, D, s.data(), 1);
        std::vector<float> acc(static_cast<std::size_t>(R * D), 1.f);
        pv_block(P.data(), n, R, k, D, n, D, acc.data(), D);
        for (i64 r = 0; r < R; ++r) {
          double dot = 0;
          for (i64 d = 0; d < D; ++d) dot += static_cast<double>(q[r * D + d]) * static_cast<float>(k[d]);
          EXPECT_NEAR(s[r], dot, 1e-5 * static_cast<double>(D)) << "D=" << D << " R=" << R << " r=" << r;
          for (i64 d = 0; d < D; ++d) {
            double ref = 1.0;
            for (i64 j = 0; j < n; ++j)
              ref += static_cast<double>(P[r * n + j]) * static_cast<float>(k[j * D + d]);
            EXPECT_NEAR(acc[r * D + d], ref, 1e-5) << "D=" << D << " R=" << R << " r=" << r << " d=" << d;
          }
        }
      };
      check(kf.data());
      check(kh.data());
      check(kb.data());
    }
  }
}

}  // namespace
}  // namespace attnops::cpu::vanilla
