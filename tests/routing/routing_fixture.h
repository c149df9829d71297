// The fixture of the routing tests: a registry of mock operators (real gates, mocked forwards
// and backwards) on a mock host whose GPU a test can switch on. No kernel runs.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <optional>

#include "operators/blocksparse.h"
#include "operators/flash_attn2.h"
#include "operators/vanilla.h"
#include "tests/routing/mocks.h"

namespace attnops::testing {

// Expects exactly one call of `op`'s forward for backend `b` and none of its other forwards.
template <class Op>
inline void expect_only(Op& op, std::optional<Backend> b) {
  EXPECT_CALL(op, forward_native(::testing::_)).Times(b == Backend::native ? 1 : 0);
  EXPECT_CALL(op, forward_cpu(::testing::_)).Times(b == Backend::cpu ? 1 : 0);
  EXPECT_CALL(op, forward_gpu(::testing::_)).Times(b == Backend::gpu ? 1 : 0);
  EXPECT_CALL(op, forward_tpu(::testing::_)).Times(b == Backend::tpu ? 1 : 0);
}

class Routing : public ::testing::Test {
 protected:
  void SetUp() override {
    unsetenv("ATTNOPS_FORCE_NATIVE");
    unsetenv("ATTNOPS_LOG");
    attnops::reload_environment();  // the library reads its environment once (attnops/environment.h)
    ON_CALL(*host, availability(::testing::_, ::testing::_))
        .WillByDefault([this](Backend b, const GpuSettings&) {
          switch (b) {
            case Backend::gpu:
              return Availability{gpu_present, gpu_present ? "mock gpu" : "no Vulkan device (mock)"};
            case Backend::tpu:
              return Availability{false, "no TPU runtime (mock)"};
            default:
              return Availability{true, "mock"};
          }
        });
    reg.add({"vanilla", {}, VanillaAttn::default_metadata(), [this](const OperationMetadata& md) {
               auto p = std::make_shared<::testing::NiceMock<MockOp<VanillaAttn>>>(md);
               van = p.get();
               return p;
             }});
    reg.add(
        {"blocksparse", {"splash"}, BlockSparseAttn::default_metadata(), [this](const OperationMetadata& md) {
           auto p = std::make_shared<::testing::NiceMock<MockOp<BlockSparseAttn>>>(md);
           bs = p.get();
           return p;
         }});
    reg.add({"flash_attn2", {"flash"}, FlashAttn2::default_metadata(), [this](const OperationMetadata& md) {
               auto p = std::make_shared<::testing::NiceMock<MockOp<FlashAttn2>>>(md);
               fl = p.get();
               return p;
             }});
  }
  void TearDown() override {
    unsetenv("ATTNOPS_FORCE_NATIVE");
    unsetenv("ATTNOPS_LOG");
    attnops::reload_environment();  // the library reads its environment once (attnops/environment.h)
  }

  // q [1, Tq, 4, 16], k/v [1, Tk, 2, 16]
  void shapes(std::int64_t Tq, std::int64_t Tk) {
    q = Tensor(DType::f32, {1, Tq, 4, 16});
    k = Tensor(DType::f32, {1, Tk, 2, 16});
    v = Tensor(DType::f32, {1, Tk, 2, 16});
  }

  bool gpu_present = false;
  std::shared_ptr<::testing::NiceMock<MockHost>> host = std::make_shared<::testing::NiceMock<MockHost>>();
  Registry reg{host};
  MockOp<VanillaAttn>* van = nullptr;
  MockOp<BlockSparseAttn>* bs = nullptr;
  MockOp<FlashAttn2>* fl = nullptr;
  Tensor q, k, v;
};

}  // namespace attnops::testing
