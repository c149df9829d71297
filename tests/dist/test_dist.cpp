// Distributed attention with ranks as threads (the in-process communicator): the whole
// exactness matrix (dist_check.h) for ring and ulysses on 1 to 4 ranks, with rendezvous and
// with eager messages, the plan's skipping and balance, and the typed errors every rank raises.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "attnops/dist/local_communicator.h"
#include "attnops/dist/sequence_parallel.h"
#include "attnops/ext/problem.h"
#include "backends/native/reference.h"
#include "tests/dist/dist_check.h"
#include "tests/support/testing.h"

namespace attnops::dist {
namespace {

struct MatrixParam {
  const char* op;
  int ranks;
};

class DistMatrix : public ::testing::TestWithParam<MatrixParam> {};

TEST_P(DistMatrix, ExactAgainstOneProcess) {
  const auto [op, P] = GetParam();
  std::vector<std::string> failed(static_cast<std::size_t>(P));
  run_local_ranks(P, [&](Communicator& comm) {
    failed[static_cast<std::size_t>(comm.rank())] = testing::check_matrix(comm, op);
  });
  for (const std::string& f : failed) EXPECT_EQ(f, "");
}

INSTANTIATE_TEST_SUITE_P(Ranks, DistMatrix,
                         ::testing::Values(MatrixParam{"ring", 1}, MatrixParam{"ring", 2},
                                           MatrixParam{"ring", 3}, MatrixParam{"ring", 4},
                                           MatrixParam{"ulysses", 1}, MatrixParam{"ulysses", 2},
                                           MatrixParam{"ulysses", 3}, MatrixParam{"ulysses", 4}),
                         [](const auto& info) {
                           return std::string(info.param.op) + "_" + std::to_string(info.param.ranks);
                         });

// Every message eager (copied at the send): the other extreme of the default (every message a
// rendezvous), so that neither ordering hides a deadlock.
TEST(DistEager, RingAndUlyssesWithEagerMessages) {
  std::vector<std::string> failed(3);
  run_local_ranks(
      3,
      [&](Communicator& comm) {
        auto& f = failed[static_cast<std::size_t>(comm.rank())];
        for (const auto& c : testing::matrix(3))
          if (c.name == "causal_zigzag_gqa2" || c.name == "sliding_window_causal" ||
              c.name == "segments_masked_row_sinks")
            for (const char* op : {"ring", "ulysses"}) {
              const auto r = testing::check_case(comm, op, c);
              if (!r.ok) f += r.message + "\n";
            }
      },
      std::size_t{1} << 30);
  for (const std::string& f : failed) EXPECT_EQ(f, "");
}

Config cpu_one_thread() {
  Config c;
  c.backends = std::vector<Backend>{Backend::cpu};
  c.num_threads = 1;
  return c;
}

// bf16: partial outputs are rounded to bf16 before each merge, so the 2x criterion does not apply;
// the result stays within bf16's tolerances of the oracle (tests/support/testing.h: out 1.6e-2),
// forward and backward, for both operators (with sinks, a window and GQA).
TEST(DistBf16, RingAndUlyssesStayNearTheOracle) {
  attnops::testing::CaseSpec spec;
  spec.Tq = spec.Tk = 53, spec.Hq = 6, spec.Hkv = 3, spec.D = 16, spec.dtype = DType::bf16;
  spec.sinks = true, spec.window = Window{20, 0};
  const attnops::testing::Case full = attnops::testing::make_case(spec, 8);
  AttentionOptions o = full.options;
  o.return_lse = true;
  const AttentionProblem p = make_problem(full.q, full.k, full.v, o, OperationMetadata{});
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  for (const char* op : {"ring", "ulysses"}) {
    std::vector<double> worst(3, 0.0);
    run_local_ranks(3, [&](Communicator& comm) {
      const auto attn = get(op, cpu_one_thread());
      const ShardLayout l = attn.layout_for(o, 53, 3);
      const Tensor q = shard(full.q, l, comm.rank()), k = shard(full.k, l, comm.rank()),
                   v = shard(full.v, l, comm.rank());
      const DistOutput r = attn(comm, q, k, v, o);
      const Tensor dout =
          attnops::testing::random_tensor(DType::bf16, {1, l.shard_length(comm.rank()), 6, 16}, 3);
      const DistGradients g = attn.backward(comm, q, k, v, r, dout, o);
      if (r.output.out.dtype() != DType::bf16 || g.gradients.dq.dtype() != DType::bf16 || !g.gradients.dsinks)
        throw Error(ErrorCode::internal, "bf16 outputs expected");
      double w = 0;
      std::int64_t i = 0;
      for (const Chunk& c : l.chunks(comm.rank()))
        for (std::int64_t t = c.begin; t < c.end; ++t, ++i)
          for (std::int64_t e = 0; e < 6 * 16; ++e)
            w = std::max(w,
                         std::abs(static_cast<double>(r.output.out.at(static_cast<std::size_t>(i * 96 + e))) -
                                  ref.out[static_cast<std::size_t>(t * 96 + e)]));
      worst[static_cast<std::size_t>(comm.rank())] = w;
    });
    for (double w : worst) EXPECT_LT(w, 1.6e-2) << op;
  }
}

// ---- the plan: what is sent and computed --------------------------------------------------

struct RankRun {
  DistStats fwd, bwd;
};

// Runs ring forward + backward on P in-process ranks for a random problem; the stats per rank.
std::vector<RankRun> run_ring(int P, std::int64_t T, const AttentionOptions& base,
                              std::optional<Layout> layout) {
  attnops::testing::CaseSpec spec;
  spec.Tq = spec.Tk = T, spec.Hq = 2, spec.Hkv = 1, spec.D = 8;
  const attnops::testing::Case full = attnops::testing::make_case(spec, 5);
  std::vector<RankRun> runs(static_cast<std::size_t>(P));
  run_local_ranks(P, [&](Communicator& comm) {
    DistSettings s;
    s.layout = layout;
    const DistributedAttention ring = get("ring", cpu_one_thread(), s);
    const ShardLayout l = ring.layout_for(base, T, P);
    const Tensor q = shard(full.q, l, comm.rank()), k = shard(full.k, l, comm.rank()),
                 v = shard(full.v, l, comm.rank());
    const Tensor dout =
        attnops::testing::random_tensor(DType::f32, {1, l.shard_length(comm.rank()), 2, 8}, 9);
    const DistOutput o = ring(comm, q, k, v, base);
    const DistGradients g = ring.backward(comm, q, k, v, o, dout, base);
    runs[static_cast<std::size_t>(comm.rank())] = {o.stats, g.stats};
  });
  return runs;
}

TEST(DistPlan, SlidingWindowSendsOnlyWhatTheWindowReaches) {
  // T = 400 over 4 ranks (100 rows each, contiguous): a window of 10 keys needs one hop, and
  // only the last 10 keys of each shard (plus the diagonal's) travel.
  AttentionOptions o;
  o.causal = true;
  o.sliding_window = Window{10, 0};
  const auto runs = run_ring(4, 400, o, std::nullopt);
  for (std::size_t r = 0; r < runs.size(); ++r) {
    const DistStats& s = runs[r].fwd;
    EXPECT_EQ(s.layout, Layout::contiguous);
    ASSERT_EQ(s.steps.size(), 2u) << "one hop for a window shorter than a shard";
    // 10 columns of K and V (Hkv 1, D 8, f32): 10 * 16 * 4 = 640 bytes, not a whole shard.
    EXPECT_EQ(s.steps[0].bytes_sent, r + 1 < runs.size() ? 640u : 0u) << "rank " << r;
    EXPECT_EQ(s.steps[1].bytes_sent, 0u);
  }
  // The backward's accumulator covers the same 10 columns, sent home once.
  EXPECT_EQ(runs[1].bwd.bytes_sent, 640u + 10u * 16u * 4u);
}

TEST(DistPlan, ZigzagBalancesCausalWorkContiguousDoesNot) {
  AttentionOptions o;  // causal
  const auto zig = run_ring(4, 256, o, Layout::zigzag);
  const auto con = run_ring(4, 256, o, Layout::contiguous);
  const auto pairs = [](const DistStats& s) {
    double n = 0;
    for (const StepStats& t : s.steps) n += t.visible_pairs;
    return n;
  };
  double zmax = 0, zsum = 0, cmax = 0, csum = 0;
  for (int r = 0; r < 4; ++r) {
    zmax = std::max(zmax, pairs(zig[static_cast<std::size_t>(r)].fwd));
    zsum += pairs(zig[static_cast<std::size_t>(r)].fwd);
    cmax = std::max(cmax, pairs(con[static_cast<std::size_t>(r)].fwd));
    csum += pairs(con[static_cast<std::size_t>(r)].fwd);
    // Zigzag: after the first step, every step of every rank computes the same number of pairs.
    for (std::size_t t = 1; t < zig[static_cast<std::size_t>(r)].fwd.steps.size(); ++t)
      EXPECT_EQ(zig[static_cast<std::size_t>(r)].fwd.steps[t].visible_pairs, 32.0 * 32.0 * 2) << "rank " << r;
  }
  EXPECT_DOUBLE_EQ(zsum, 256.0 * 257.0 / 2);  // every visible pair once
  EXPECT_DOUBLE_EQ(csum, 256.0 * 257.0 / 2);
  EXPECT_LT(zmax / (zsum / 4), 1.02);
  EXPECT_GT(cmax / (csum / 4), 1.7);  // (2P - 1) / P = 1.75
}

// ---- errors: on every rank, never a hang ----------------------------------------------------

// Runs fn on P ranks; every rank must throw an attnops::Error with `code` whose message
// contains `text`.
template <class Fn>
void expect_every_rank_throws(int P, ErrorCode code, const std::string& text, Fn&& fn) {
  std::vector<std::string> seen(static_cast<std::size_t>(P));
  run_local_ranks(P, [&](Communicator& comm) {
    std::string& s = seen[static_cast<std::size_t>(comm.rank())];
    try {
      fn(comm);
      s = "no error";
    } catch (const Error& e) {
      if (e.code() != code)
        s = std::string("code ") + std::string(error_code_name(e.code())) + ": " + e.what();
      else if (std::string(e.what()).find(text) == std::string::npos)
        s = std::string("message: ") + e.what();
    }
  });
  for (int r = 0; r < P; ++r) EXPECT_EQ(seen[static_cast<std::size_t>(r)], "") << "rank " << r;
}

attnops::testing::Case small_case(std::int64_t Hq, std::int64_t Hkv) {
  attnops::testing::CaseSpec spec;
  spec.Tq = spec.Tk = 24, spec.Hq = Hq, spec.Hkv = Hkv, spec.D = 8;
  return attnops::testing::make_case(spec, 3);
}

TEST(DistErrors, UlyssesHeadsThatDoNotDivide) {
  const auto c = small_case(4, 2);
  expect_every_rank_throws(
      3, ErrorCode::invalid_argument, "do not divide over 3 ranks", [&](Communicator& comm) {
        const auto u = get("ulysses", cpu_one_thread());
        const ShardLayout l = u.layout_for({}, 24, 3);
        u(comm, shard(c.q, l, comm.rank()), shard(c.k, l, comm.rank()), shard(c.v, l, comm.rank()));
      });
  const auto c2 = small_case(6, 3);  // Hq % 2 == 0 but Hkv = 3 neither divides nor is divided by 2
  expect_every_rank_throws(2, ErrorCode::invalid_argument, "K/V heads", [&](Communicator& comm) {
    const auto u = get("ulysses", cpu_one_thread());
    const ShardLayout l = u.layout_for({}, 24, 2);
    u(comm, shard(c2.q, l, comm.rank()), shard(c2.k, l, comm.rank()), shard(c2.v, l, comm.rank()));
  });
}

TEST(DistErrors, BiasIsRefusedOnEveryRank) {
  const auto c = small_case(2, 1);
  const Tensor bias = attnops::testing::random_tensor(DType::f32, {1, 1, 12, 12}, 4);
  for (const char* op : {"ring", "ulysses"})
    expect_every_rank_throws(2, ErrorCode::not_implemented, "bias", [&](Communicator& comm) {
      const auto a = get(op, cpu_one_thread());
      const ShardLayout l = a.layout_for({}, 24, 2);
      AttentionOptions o;
      o.bias = bias.view();
      a(comm, shard(c.q, l, comm.rank()), shard(c.k, l, comm.rank()), shard(c.v, l, comm.rank()), o);
    });
}

TEST(DistErrors, OneRankWithABadShapeStopsEveryRank) {
  const auto c = small_case(2, 1);
  expect_every_rank_throws(3, ErrorCode::shape_mismatch, "", [&](Communicator& comm) {
    const auto ring = get("ring", cpu_one_thread());
    const ShardLayout l = ring.layout_for({}, 24, 3);
    const Tensor q = shard(c.q, l, comm.rank()), k = shard(c.k, l, comm.rank()),
                 v = shard(c.v, l, comm.rank());
    // Rank 1 passes v with the wrong head dim.
    const Tensor bad = attnops::testing::random_tensor(DType::f32, {1, v.dim(1), 1, 5}, 1);
    ring(comm, q, k, comm.rank() == 1 ? bad.view() : v.view());
  });
}

TEST(DistErrors, ShardsThatAreNotTheLayoutsAndOptionsThatDiffer) {
  const auto c = small_case(2, 1);
  expect_every_rank_throws(2, ErrorCode::shape_mismatch, "layout", [&](Communicator& comm) {
    const auto ring = get("ring", cpu_one_thread());
    // Contiguous halves where the causal ring expects zigzag shards: lengths 12/12 fit, so use
    // an uneven split instead (10 / 14 rows).
    const std::int64_t a = comm.rank() == 0 ? 0 : 10, b = comm.rank() == 0 ? 10 : 24;
    ring(comm, c.q.view().slice(1, a, b), c.k.view().slice(1, a, b), c.v.view().slice(1, a, b));
  });
  expect_every_rank_throws(2, ErrorCode::invalid_argument, "other options", [&](Communicator& comm) {
    const auto ring = get("ring", cpu_one_thread());
    const ShardLayout l = ring.layout_for({}, 24, 2);
    AttentionOptions o;
    if (comm.rank() == 1) o.sliding_window = Window{3, 0};
    DistSettings s;
    ring(comm, shard(c.q, l, comm.rank()), shard(c.k, l, comm.rank()), shard(c.v, l, comm.rank()), o);
  });
}

TEST(DistErrors, RingBackwardRefusesTheForcedNativeBackward) {
  const auto c = small_case(2, 1);
  setenv("ATTNOPS_FORCE_NATIVE", "1", 1);
  attnops::reload_environment();
  expect_every_rank_throws(2, ErrorCode::unsupported_feature, "FORCE_NATIVE", [&](Communicator& comm) {
    const auto ring = get("ring", cpu_one_thread());
    const ShardLayout l = ring.layout_for({}, 24, 2);
    const Tensor q = shard(c.q, l, comm.rank()), k = shard(c.k, l, comm.rank()),
                 v = shard(c.v, l, comm.rank());
    const DistOutput o = ring(comm, q, k, v);  // the forward runs (on native)
    const Tensor dout = attnops::testing::random_tensor(DType::f32, {1, 12, 2, 8}, 2);
    ring.backward(comm, q, k, v, o, dout);
  });
  unsetenv("ATTNOPS_FORCE_NATIVE");
  attnops::reload_environment();
}

// The same refusal when the config leaves only native (every other backend disabled), instead of
// a backend_unavailable whose reasons all say "disabled by config".
TEST(DistErrors, RingBackwardRefusesANativeOnlyConfig) {
  const auto c = small_case(2, 1);
  Config cfg;
  cfg.backends = std::vector<Backend>{Backend::native};
  cfg.disabled_backends = std::vector<Backend>{Backend::cpu, Backend::gpu, Backend::tpu};
  expect_every_rank_throws(2, ErrorCode::unsupported_feature, "disabled_backends", [&](Communicator& comm) {
    const auto ring = get("ring", cfg);
    const ShardLayout l = ring.layout_for({}, 24, 2);
    const Tensor q = shard(c.q, l, comm.rank()), k = shard(c.k, l, comm.rank()),
                 v = shard(c.v, l, comm.rank());
    const DistOutput o = ring(comm, q, k, v);  // the forward runs (on native)
    const Tensor dout = attnops::testing::random_tensor(DType::f32, {1, 12, 2, 8}, 2);
    ring.backward(comm, q, k, v, o, dout);
  });
}

// ---- registry entries ------------------------------------------------------------------

TEST(DistRegistry, EntriesRunAsOneRankAndNameTheirKernel) {
  const auto c = small_case(2, 1);
  (void)get("ring");  // registers the entries in the process registry
  const auto names = registry().list();
  EXPECT_NE(std::find(names.begin(), names.end(), "ring"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "ulysses"), names.end());
  // As a plain Attention: a world of one rank, i.e. the local operator.
  const AttentionOutput a = registry().get("ring", cpu_one_thread())(c.q, c.k, c.v, {.return_lse = true});
  const AttentionOutput b =
      registry().get("flash_attn2", cpu_one_thread())(c.q, c.k, c.v, {.return_lse = true});
  EXPECT_EQ(a.decision.op, "ring");
  EXPECT_EQ(std::memcmp(a.out.data(), b.out.data(), b.out.nbytes()), 0);
  EXPECT_THROW((void)get("flash_attn2"), Error);
  // The distributed decision names the layout, the local kernel and the steps.
  run_local_ranks(2, [&](Communicator& comm) {
    const auto ring = get("ring", cpu_one_thread());
    const ShardLayout l = ring.layout_for({}, 24, 2);
    const DistOutput o =
        ring(comm, shard(c.q, l, comm.rank()), shard(c.k, l, comm.rank()), shard(c.v, l, comm.rank()));
    const std::string j = o.output.decision.to_json();
    if (o.output.decision.run.kernel.rfind("ring(zigzag)+flash_attn2:", 0) != 0 ||
        j.find("step 1") == std::string::npos || o.stats.steps.size() != 2)
      throw Error(ErrorCode::internal, "decision: " + j);
  });
}

}  // namespace
}  // namespace attnops::dist
