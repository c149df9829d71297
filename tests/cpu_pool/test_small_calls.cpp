// Through the public API on the cpu backend: a decode or prefill too small to pay for a second
// thread runs on one and the decision's kernel_detail says so (backends/cpu/call_threads.h); a
// large one keeps the threads asked for; and each thread count gives bitwise the same result
// call after call (the pool hands tasks to whichever thread runs, the result must not care).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "attnops/attnops.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

struct Inputs {
  Tensor q, k, v;
};

Inputs inputs(std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv, std::int64_t D) {
  return {random_tensor(DType::f32, {1, Tq, Hq, D}, 1), random_tensor(DType::f32, {1, Tk, Hkv, D}, 2),
          random_tensor(DType::f32, {1, Tk, Hkv, D}, 3)};
}

AttentionOutput run(const char* op, const Inputs& in, int threads) {
  OperationMetadata md;
  md.backends = {Backend::cpu};
  md.disabled_backends = {Backend::gpu};
  md.num_threads = threads;
  AttentionOptions o;
  o.return_lse = true;
  return registry().get(op, md)(in.q, in.k, in.v, o);
}

TEST(SmallCalls, TinyDecodeRunsOnOneThreadAndTheDecisionSaysWhy) {
  const AttentionOutput out = run("vanilla", inputs(1, 128, 8, 8, 64), 2);  // 0.5 MiB of K/V
  ASSERT_EQ(out.decision.backend, Backend::cpu);
  EXPECT_THAT(out.decision.run.kernel_detail, HasSubstr("threads 1 of 2: small call (0.50 MiB of K/V"));
  EXPECT_THAT(out.decision.to_json(), HasSubstr("small call"));
}

TEST(SmallCalls, TinyPrefillRunsOnOneThread) {
  const AttentionOutput out = run("flash_attn2", inputs(128, 128, 2, 2, 16), 2);  // ~2.1 MFLOP dense
  EXPECT_THAT(out.decision.run.kernel_detail, HasSubstr("threads 1 of 2: small call"));
}

TEST(SmallCalls, LargeCallsKeepTheirThreadsAndOneThreadSaysNothing) {
  const Inputs decode = inputs(1, 2048, 8, 8, 64);  // 8 MiB of K/V: 2 threads
  EXPECT_THAT(run("vanilla", decode, 2).decision.run.kernel_detail, Not(HasSubstr("small call")));
  EXPECT_THAT(run("vanilla", decode, 1).decision.run.kernel_detail, Not(HasSubstr("small call")));
  const Inputs prefill = inputs(256, 256, 4, 2, 64);
  EXPECT_THAT(run("flash_attn2", prefill, 2).decision.run.kernel_detail, Not(HasSubstr("small call")));
}

void expect_bitwise_repeatable(const char* op, const Inputs& in, int threads) {
  const AttentionOutput a = run(op, in, threads);
  ASSERT_THAT(a.decision.run.kernel_detail, Not(HasSubstr("small call")));
  for (int rep = 0; rep < 4; ++rep) {
    const AttentionOutput b = run(op, in, threads);
    EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), a.out.nbytes()), 0)
        << op << " threads " << threads << " rep " << rep;
    EXPECT_EQ(std::memcmp(a.lse->data(), b.lse->data(), a.lse->nbytes()), 0) << op << " threads " << threads;
  }
}

TEST(SmallCalls, EachThreadCountIsBitwiseRepeatable) {
  const Inputs decode = inputs(1, 9000, 8, 2, 64);    // 8.8 MiB: split kv, merged by the last split's thread
  const Inputs prefill = inputs(256, 256, 4, 2, 64);  // tiled
  const Inputs ragged = inputs(200, 200, 4, 2, 64);   // vanilla general (Tq % 128 != 0)
  for (int threads : {2, 3}) {
    expect_bitwise_repeatable("vanilla", decode, threads);
    expect_bitwise_repeatable("flash_attn2", prefill, threads);
    expect_bitwise_repeatable("blocksparse", ragged, threads);
  }
}

// The backward runs its row statistics, its non-finite row flags and its dq / dk-dv tasks on the
// same pool: each thread count gives bitwise the same gradients call after call, and
// 2 and 3 threads run them with workers racing for tasks (this test runs under TSan in CI).
TEST(SmallCalls, BackwardOnThePoolIsBitwiseRepeatable) {
  const Inputs in = inputs(256, 320, 4, 2, 40);  // GQA, Tq != Tk, head dim not a power of two
  Tensor dout = random_tensor(DType::f32, {1, 256, 4, 40}, 4);
  for (int threads : {2, 3}) {
    OperationMetadata md;
    md.backends = {Backend::cpu};
    md.disabled_backends = {Backend::gpu};
    md.num_threads = threads;
    const Attention attn = registry().get("flash_attn2", md);
    AttentionOptions o;
    o.return_lse = true;
    const AttentionOutput fwd = attn(in.q, in.k, in.v, o);
    const AttentionGradients a = attn.backward(in.q, in.k, in.v, fwd, dout, o);
    ASSERT_EQ(a.decision.backend, Backend::cpu);
    for (int rep = 0; rep < 3; ++rep) {
      const AttentionGradients b = attn.backward(in.q, in.k, in.v, fwd, dout, o);
      EXPECT_EQ(std::memcmp(a.dq.data(), b.dq.data(), a.dq.nbytes()), 0) << "dq, threads " << threads;
      EXPECT_EQ(std::memcmp(a.dk.data(), b.dk.data(), a.dk.nbytes()), 0) << "dk, threads " << threads;
      EXPECT_EQ(std::memcmp(a.dv.data(), b.dv.data(), a.dv.nbytes()), 0) << "dv, threads " << threads;
    }
  }
}

}  // namespace
}  // namespace attnops::testing
