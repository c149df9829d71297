// The non-finite policy (README, Non-finite values) through ring and ulysses, as for every other
// operator: an infinity in v reaches the rows that see it as that infinity (the merge of partial
// results must not turn it into NaN), and a fully masked row contributes nothing to dsinks even
// when its dout holds a NaN. Found by the differential fuzzer (attnops verify).
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "attnops/dist/local_communicator.h"
#include "attnops/dist/sequence_parallel.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "backends/native/reference_backward.h"
#include "tests/support/testing.h"

namespace attnops::dist {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

Config cpu_one_thread() {
  Config c;
  c.backends = std::vector<Backend>{Backend::cpu};
  c.num_threads = 1;
  return c;
}

int cls(double x) {
  return std::isnan(x) ? 0 : std::isinf(x) ? (x > 0 ? 1 : 2) : 3;
}

struct Gathered {
  Tensor out, lse;
  std::optional<Tensor> dsinks;
};

// Runs `op` forward (and backward when dout is given) on P in-process ranks over the full
// problem's shards; the rows gathered back into full tensors.
Gathered run(const char* op, int P, const attnops::testing::Case& c, const AttentionOptions& o,
             const Tensor* dout) {
  Gathered g{Tensor(c.dtype, {c.B, c.Tq, c.Hq, c.Dv}), Tensor(DType::f32, {c.B, c.Hq, c.Tq}), std::nullopt};
  std::mutex mu;
  run_local_ranks(P, [&](Communicator& comm) {
    const DistributedAttention attn = get(op, cpu_one_thread());
    const ShardLayout ql = attn.layout_for(o, c.Tq, P), kl = attn.layout_for(o, c.Tk, P);
    const int r = comm.rank();
    const Tensor q = shard(c.q, ql, r), k = shard(c.k, kl, r), v = shard(c.v, kl, r);
    AttentionOptions ro = o;
    std::optional<Tensor> sq, skv;
    if (c.seg_q) {
      sq = shard(*c.seg_q, ql, r), skv = shard(*c.seg_kv, kl, r);
      ro.segment_ids_q = sq->view(), ro.segment_ids_kv = skv->view();
    }
    const DistOutput out = attn(comm, q, k, v, ro);
    std::optional<DistGradients> grads;
    if (dout) grads = attn.backward(comm, q, k, v, out, shard(*dout, ql, r), ro);
    const std::lock_guard<std::mutex> lock(mu);
    unshard_into(out.output.out, ql, r, g.out, 1);
    unshard_into(*out.output.lse, ql, r, g.lse, 2);
    if (grads && r == 0) g.dsinks = grads->gradients.dsinks;
  });
  return g;
}

TEST(DistNonFinite, AnInfinityInVReachesItsRowsAsThatInfinity) {
  attnops::testing::CaseSpec spec;
  spec.Tq = spec.Tk = 37, spec.Hq = 2, spec.Hkv = 1, spec.D = 8;
  attnops::testing::Case c = attnops::testing::make_case(spec, 3);
  // Key 5 holds +inf in its value's element 0, key 20 -inf in element 1: rows that see key 5 get
  // out[0] = +inf, rows that see key 20 get out[1] = -inf; in a causal ring the rows that see
  // them also see blocks of other ranks, whose finite partial results are merged in.
  c.v.set(static_cast<std::size_t>(5 * spec.D), kInf);
  c.v.set(static_cast<std::size_t>(20 * spec.D + 1), -kInf);
  AttentionOptions o = c.options;
  o.return_lse = true;
  const native::ReferenceResult ref =
      native::reference_attention_f64(make_problem(c.q, c.k, c.v, o, OperationMetadata{}), false);
  for (const char* op : {"ring", "ulysses"})
    for (int P : {2, 3}) {
      if (std::string(op) == "ulysses" && P == 3) continue;  // Hq = 2 does not divide over 3 ranks
      const Gathered g = run(op, P, c, o, nullptr);
      int wrong = 0;
      for (std::size_t i = 0; i < ref.out.size(); ++i) wrong += cls(g.out.at(i)) != cls(ref.out[i]);
      EXPECT_EQ(wrong, 0) << op << " on " << P << " ranks: elements whose class (NaN, +inf, -inf, finite) "
                          << "differs from the oracle's";
    }
}

TEST(DistNonFinite, AFullyMaskedRowWithANaNDoutAddsNothingToDsinks) {
  attnops::testing::CaseSpec spec;
  spec.Tq = spec.Tk = 40, spec.Hq = 2, spec.Hkv = 2, spec.D = 8, spec.segments = true, spec.sinks = true;
  attnops::testing::Case c = attnops::testing::make_case(spec, 4);
  c.seg_q->data_as<std::int32_t>()[17] = 1 << 30;  // row 17 matches no key: fully masked
  AttentionOptions o = c.options;
  o.return_lse = true;
  Tensor dout = attnops::testing::random_tensor(DType::f32, {1, 40, 2, 8}, 6);
  for (std::int64_t e = 0; e < 2 * 8; ++e) dout.set(static_cast<std::size_t>(17 * 16 + e), std::nanf(""));
  const AttentionProblem p = make_problem(c.q, c.k, c.v, o, OperationMetadata{});
  AttentionBuffers fwd = allocate_buffers(p);
  native::reference_attention(p, fwd);
  const native::ReferenceGradients want = native::reference_backward_f64(
      make_backward_problem(c.q, c.k, c.v, fwd.out, *fwd.lse, dout, o, OperationMetadata{}));
  ASSERT_TRUE(std::isfinite(want.dsinks[0]) && std::isfinite(want.dsinks[1]));
  for (int P : {2, 3}) {
    const Gathered g = run("ring", P, c, o, &dout);
    ASSERT_TRUE(g.dsinks.has_value());
    for (std::int64_t h = 0; h < 2; ++h)
      EXPECT_NEAR(g.dsinks->at(static_cast<std::size_t>(h)), want.dsinks[static_cast<std::size_t>(h)], 1e-4)
          << "ring on " << P << " ranks, head " << h;
  }
}

}  // namespace
}  // namespace attnops::dist
