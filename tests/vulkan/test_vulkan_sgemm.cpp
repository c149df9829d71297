// The bench's SGEMM shader against a plain fp64 product (it is a kernel too, so it is tested).
#include <cmath>
#include <vector>

#include "backends/vulkan/vulkan_sgemm.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

using VulkanSgemm = VulkanTest;

TEST_F(VulkanSgemm, MatchesFp64Product) {
  for (auto [M, N, K] :
       {std::tuple<std::int64_t, std::int64_t, std::int64_t>{4, 4, 4}, {20, 28, 36}, {68, 132, 40}}) {
    const Tensor a = random_tensor(DType::f32, {M, K}, 1), b = random_tensor(DType::f32, {K, N}, 2);
    std::vector<float> c(static_cast<std::size_t>(M * N), -1.f);
    vulkan::sgemm(a.data_as<float>(), b.data_as<float>(), c.data(), M, N, K, software_ok());
    double worst = 0;
    for (std::int64_t i = 0; i < M; ++i)
      for (std::int64_t j = 0; j < N; ++j) {
        double ref = 0;
        for (std::int64_t k = 0; k < K; ++k)
          ref += static_cast<double>(a.data_as<float>()[i * K + k]) *
                 static_cast<double>(b.data_as<float>()[k * N + j]);
        worst = std::max(worst, std::abs(ref - static_cast<double>(c[static_cast<std::size_t>(i * N + j)])));
      }
    EXPECT_LT(worst, 1e-4) << M << "x" << N << "x" << K;
  }
}

TEST_F(VulkanSgemm, RejectsSizesThatAreNotMultiplesOfFour) {
  std::vector<float> a(30), b(30), c(30);
  try {
    vulkan::sgemm(a.data(), b.data(), c.data(), 5, 6, 6, software_ok());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument) << e.what();
  }
}

}  // namespace
}  // namespace attnops::testing
