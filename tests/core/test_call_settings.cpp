// Per-call settings (AttentionOptions / PagedAttentionOptions: softmax_scale, backends,
// num_threads, runtime_dtype): each overrides the operator's metadata for one call, reaches the
// kernels of every backend, shows in the decision, and a bad value is a typed error naming it.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vulkan_backend.h"
#include "tests/backward/grad_testing.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

constexpr double kScale = 0.37;  // not 1/sqrt(D) for any D used here

CaseSpec spec(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
              std::int64_t D) {
  CaseSpec s;
  s.B = B, s.Tq = Tq, s.Tk = Tk, s.Hq = Hq, s.Hkv = Hkv, s.D = D;
  return s;
}

// An operator pinned to `backend` by its metadata, its own kernel (no fallbacks), and no scale.
Attention attention_on(const std::string& op, Backend backend) {
  OperationMetadata md = registry().entry(op).defaults;
  md.backends = {backend};
  md.gpu.allow_software = true;
  md.fallbacks = {};
  return registry().get(op, md);
}

// The oracle's problem for a call with scale `scale` given by the metadata (not per call), so the
// comparison does not go through the per-call path it checks.
AttentionProblem oracle_problem(const Case& c, double scale) {
  OperationMetadata md;
  md.softmax_scale = scale;
  return make_problem(c.q, c.k, c.v, c.options, md);
}

void expect_scale_reaches_kernels(Backend backend) {
  std::uint64_t seed = 90;
  for (const CaseSpec& cs :
       {spec(2, 37, 70, 4, 2, 40), spec(1, 1, 133, 2, 1, 64), spec(1, 128, 128, 2, 2, 32)}) {
    const Case c = make_case(cs, ++seed);
    for (const char* op : {"vanilla", "blocksparse", "flash_attn2", "ragged_paged"}) {
      SCOPED_TRACE(std::string(op) + " on " + std::string(backend_name(backend)) + ": " + c.describe());
      const Attention attn = attention_on(op, backend);
      AttentionOptions o = c.options;
      o.softmax_scale = kScale;
      const AttentionOutput out = attn(c.q, c.k, c.v, o);
      ASSERT_EQ(out.decision.backend, backend) << out.decision.to_json();
      const AttentionBuffers got{out.out, out.lse, std::nullopt, {}, {}};
      EXPECT_TRUE(within_tolerance(oracle_problem(c, kScale), got));
      // The default scale gives another answer: the comparison above could see a lost setting.
      EXPECT_FALSE(within_tolerance(oracle_problem(c, 1.0 / std::sqrt(static_cast<double>(c.D))), got));
      ASSERT_TRUE(out.decision.settings.softmax_scale.has_value());
      EXPECT_EQ(*out.decision.settings.softmax_scale, kScale);
      EXPECT_NE(out.decision.to_json().find("\"settings\": {\"softmax_scale\": 0.37"), std::string::npos)
          << out.decision.to_json();
    }
  }
}

TEST(CallSettings, ScaleReachesNativeKernels) {
  expect_scale_reaches_kernels(Backend::native);
}
TEST(CallSettings, ScaleReachesCpuKernels) {
  expect_scale_reaches_kernels(Backend::cpu);
}
TEST(CallSettings, ScaleReachesGpuKernels) {
  if (!vulkan::compiled_in()) GTEST_SKIP() << "built without the Vulkan backend";
  const Availability a = vulkan::availability(attention_on("vanilla", Backend::gpu).metadata().gpu);
  if (!a.available) GTEST_SKIP() << "no Vulkan device: " << a.detail;
  expect_scale_reaches_kernels(Backend::gpu);
}

TEST(CallSettings, CallScaleOverridesTheMetadataScaleInTheBackward) {
  OperationMetadata md = registry().entry("flash_attn2").defaults;
  md.backends = {Backend::cpu};
  md.softmax_scale = 0.9;  // the call's value wins
  const Attention attn = registry().get("flash_attn2", md);
  const Case c = make_case(spec(1, 45, 60, 4, 2, 24), 7);
  AttentionOptions o = c.options;
  o.softmax_scale = kScale;
  o.return_lse = true;
  const AttentionOutput out = attn(c.q, c.k, c.v, o);
  const AttentionBuffers got{out.out, out.lse, std::nullopt, {}, {}};
  EXPECT_TRUE(within_tolerance(oracle_problem(c, kScale), got));
  const Tensor dout = random_tensor(DType::f32, out.out.shape(), 8);
  const AttentionGradients g = attn.backward(c.q, c.k, c.v, out, dout, o);
  EXPECT_EQ(g.decision.settings.softmax_scale, kScale);
  OperationMetadata omd;
  omd.softmax_scale = kScale;
  const BackwardProblem bp = make_backward_problem(c.q, c.k, c.v, out.out, *out.lse, dout, c.options, omd);
  EXPECT_TRUE(gradients_match(bp, native::reference_backward_f64(bp), g));
}

// One operator (the metadata prefers native, disables cpu and gpu); each call picks its own backend,
// dtype and thread count, and the next call without them gets the metadata's again.
TEST(CallSettings, BackendDtypeAndThreadsPerCall) {
  OperationMetadata md = registry().entry("flash_attn2").defaults;
  md.backends = {Backend::native};
  md.disabled_backends = {Backend::cpu, Backend::gpu};
  const Attention attn = registry().get("flash_attn2", md);
  const Case c = make_case(spec(1, 20, 30, 2, 1, 16), 3);

  AttentionOptions on_cpu = c.options;
  on_cpu.backends = std::vector<Backend>{Backend::cpu};  // named: tried although disabled
  const AttentionOutput a = attn(c.q, c.k, c.v, on_cpu);
  EXPECT_EQ(a.decision.backend, Backend::cpu) << a.decision.to_json();
  EXPECT_EQ(a.decision.settings.backends, std::vector<Backend>{Backend::cpu});
  EXPECT_NE(a.decision.to_json().find("\"backends\": [\"cpu\"]"), std::string::npos) << a.decision.to_json();

  const AttentionOutput b = attn(c.q, c.k, c.v, c.options);
  EXPECT_EQ(b.decision.backend, Backend::native) << b.decision.to_json();
  EXPECT_FALSE(b.decision.settings.any());
  EXPECT_EQ(b.decision.to_json().find("\"settings\""), std::string::npos);

  // Auto per call ({}): the metadata's preference is replaced, its disabled backends stay.
  AttentionOptions auto_order = c.options;
  auto_order.backends = std::vector<Backend>{};
  const AttentionOutput d = attn(c.q, c.k, c.v, auto_order);
  EXPECT_EQ(d.decision.backend, Backend::native) << d.decision.to_json();
  EXPECT_TRUE(d.decision.has(ReasonCode::disabled_by_config)) << d.decision.to_json();

  AttentionOptions f16 = c.options;
  f16.runtime_dtype = DType::f16;
  const AttentionOutput h = attn(c.q, c.k, c.v, f16);
  EXPECT_EQ(h.out.dtype(), DType::f16);
  EXPECT_EQ(h.decision.settings.runtime_dtype, DType::f16);
  EXPECT_EQ(attn(c.q, c.k, c.v, c.options).out.dtype(), DType::f32);

  // Threads: the count the call ran with, clamped to the hardware, in the decision; on the cpu
  // the small-call rule reports the count it was asked for.
  AttentionOptions threads = on_cpu;
  threads.num_threads = 100000;
  const AttentionOutput t = attn(c.q, c.k, c.v, threads);
  EXPECT_EQ(t.decision.settings.num_threads, max_worker_threads());
  threads.num_threads = 1;
  const AttentionOutput t1 = attn(c.q, c.k, c.v, threads);
  EXPECT_EQ(t1.decision.settings.num_threads, 1);
  EXPECT_EQ(t1.decision.run.kernel_detail.find("threads"), std::string::npos)
      << t1.decision.run.kernel_detail;
  // The README's form.
  const AttentionOptions readme{
      .softmax_scale = 0.1, .backends = {{Backend::cpu}}, .num_threads = 4, .runtime_dtype = DType::bf16};
  EXPECT_EQ(readme.backends, std::vector<Backend>{Backend::cpu});
  if (max_worker_threads() >= 2) {
    threads.num_threads = 2;
    const AttentionOutput t2 = attn(c.q, c.k, c.v, threads);
    EXPECT_NE(t2.decision.run.kernel_detail.find("of 2"), std::string::npos) << t2.decision.run.kernel_detail;
  }
}

TEST(CallSettings, PagedCallsTakeThemToo) {
  const std::int64_t page = 16, Hq = 4, Hkv = 2, D = 32;
  PagedKVSpec ks;
  ks.num_pages = 8, ks.page_size = page, ks.num_kv_heads = Hkv, ks.head_dim = D;
  PagedKVCache cache = PagedKVCache::host(ks);
  const Tensor kv = random_tensor(DType::f32, {8 * page, Hkv, D}, 4);
  Tensor slots(DType::i32, {8 * page});
  for (std::int64_t i = 0; i < 8 * page; ++i) slots.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(i);
  cache.write(kv, kv, slots);
  Tensor cu(DType::i32, {3}), lens(DType::i32, {2}), table(DType::i32, {2, 4});
  const std::int32_t cu_v[] = {0, 1, 6}, len_v[] = {40, 50}, table_v[] = {0, 1, 2, 3, 4, 5, 6, 7};
  std::copy(cu_v, cu_v + 3, cu.data_as<std::int32_t>());
  std::copy(len_v, len_v + 2, lens.data_as<std::int32_t>());
  std::copy(table_v, table_v + 8, table.data_as<std::int32_t>());
  const Tensor q = random_tensor(DType::f32, {6, Hq, D}, 5);
  RaggedBatch batch;
  batch.cu_seqlens_q = cu, batch.kv_lens = lens, batch.page_table = table;

  OperationMetadata scaled = registry().entry("ragged_paged").defaults;
  scaled.softmax_scale = kScale;
  for (Backend b : {Backend::native, Backend::cpu}) {
    SCOPED_TRACE(std::string(backend_name(b)));
    PagedAttentionOptions o;
    o.softmax_scale = kScale;
    o.backends = std::vector<Backend>{b};
    const AttentionOutput got = registry().get("ragged_paged").paged(q, cache, batch, o);
    EXPECT_EQ(got.decision.backend, b);
    EXPECT_EQ(got.decision.settings.softmax_scale, kScale);
    PagedAttentionOptions on;
    on.backends = o.backends;
    const AttentionOutput want = registry().get("ragged_paged", scaled).paged(q, cache, batch, on);
    const AttentionOutput unscaled = registry().get("ragged_paged").paged(q, cache, batch, on);
    const float* g = got.out.data_as<float>();
    const float* w = want.out.data_as<float>();
    const float* u = unscaled.out.data_as<float>();
    double diff = 0, moved = 0;
    for (std::int64_t i = 0; i < got.out.numel(); ++i)
      diff = std::max(diff, std::fabs(double(g[i]) - w[i])),
      moved = std::max(moved, std::fabs(double(g[i]) - u[i]));
    EXPECT_EQ(diff, 0.0);  // the same kernel with the same scale
    EXPECT_GT(moved, 1e-4);
  }
  PagedAttentionOptions f16;
  f16.runtime_dtype = DType::f16;  // the cache is f32, and a paged call never converts it
  try {
    registry().get("ragged_paged").paged(q, cache, batch, f16);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::unsupported_dtype);
    EXPECT_NE(std::string(e.what()).find("runtime_dtype"), std::string::npos) << e.what();
  }
}

TEST(CallSettings, BadValuesAreTypedErrorsNamingTheField) {
  const Attention attn = registry().get("flash_attn2");
  const Case c = make_case(spec(1, 8, 8, 2, 2, 8), 11);
  struct Bad {
    const char* field;
    ErrorCode code;
    AttentionOptions options;
  };
  std::vector<Bad> bad;
  bad.push_back({"softmax_scale", ErrorCode::invalid_argument, c.options});
  bad.back().options.softmax_scale = std::nan("");
  bad.push_back({"softmax_scale", ErrorCode::invalid_argument, c.options});
  bad.back().options.softmax_scale = 1e38;  // carries the logits past the f32 range
  bad.push_back({"num_threads", ErrorCode::invalid_argument, c.options});
  bad.back().options.num_threads = -1;
  bad.push_back({"runtime_dtype", ErrorCode::unsupported_dtype, c.options});
  bad.back().options.runtime_dtype = DType::i32;
  bad.push_back({"backends", ErrorCode::invalid_argument, c.options});
  bad.back().options.backends = std::vector<Backend>{static_cast<Backend>(9)};
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.field);
    for (int pass = 0; pass < 3; ++pass) {  // run, plan, backward
      try {
        if (pass == 0) (void)attn(c.q, c.k, c.v, b.options);
        if (pass == 1) (void)attn.explain(c.q, c.k, c.v, b.options);
        if (pass == 2) (void)attn.backward(c.q, c.k, c.v, c.q, Tensor(DType::f32, {1, 2, 8}), c.q, b.options);
        ADD_FAILURE() << "no error, pass " << pass;
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), b.code) << e.what();
        EXPECT_NE(std::string(e.what()).find(b.field), std::string::npos) << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace attnops::testing
