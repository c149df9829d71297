// ragged_paged on the gpu (Vulkan; lavapipe on CI and on the development machine, which has no
// GPU): random ragged batches against the dense oracle within the dense tolerances, with the
// cache on the host (uploaded) and device-resident (read in place), q on the host and on the
// device; bitwise invariances on one device (alone vs inside a mixed batch, page permutation,
// page size, padding); the non-finite policy; dispatch (auto, a host cache under auto, device
// caches) and the bad-input errors. Shapes are small: lavapipe is slow and CI time is tight.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vulkan_debug.h"
#include "tests/paged/paged_cases.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using i64 = std::int64_t;
using ::testing::HasSubstr;

// The error `f` throws: its code and that the message names `what`.
void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error (expected " << error_code_name(code) << " naming " << what << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

bool have_gpu() {
  GpuSettings g;
  g.allow_software = true;
  return registry().host().availability(Backend::gpu, g).available;
}

#define REQUIRE_GPU() \
  if (!have_gpu()) GTEST_SKIP() << "no Vulkan device (lavapipe) here"

// No validation error and no synchronization hazard so far in this process (the tests run under
// the validation layer with synchronization validation: vulkan_env.cpp).
void expect_clean_validation() {
  if (!vulkan::debug::validation_enabled()) return;  // no layer installed: nothing to count
  const vulkan::debug::ValidationCounts v = vulkan::debug::validation_counts();
  std::string all;
  for (const std::string& m : vulkan::debug::validation_messages()) all += "\n  " + m;
  EXPECT_EQ(v.errors, 0u) << "validation errors:" << all;
  EXPECT_EQ(v.sync_hazards, 0u) << "synchronization hazards:" << all;
}

// The case's pools (and an 8-bit cache's scales) copied to the device.
PagedKVCache device_cache(const PagedCase& c) {
  DeviceTensor k = DeviceTensor::from_host(c.cache.k_pages()), v = DeviceTensor::from_host(c.cache.v_pages());
  if (!c.cache.spec().quantized()) return PagedKVCache::from_device(k, v);
  return PagedKVCache::from_device(k, v, DeviceTensor::from_host(c.cache.k_scales()),
                                   DeviceTensor::from_host(c.cache.v_scales()));
}

// The operator on the gpu over `cache` (the case's or a device copy), q on the host or device.
AttentionOutput run_gpu(const PagedCase& c, const PagedKVCache& cache, bool q_on_device = false) {
  OperationMetadata md;
  md.backends = {Backend::gpu};
  const Attention attn = registry().get("ragged_paged", md);
  AttentionOutput o;
  if (!q_on_device) {
    o = attn.paged(c.q, cache, c.batch, c.options);
  } else {
    const DeviceTensor dq = DeviceTensor::from_host(c.q);
    o = attn.paged(dq, cache, c.batch, c.options);
    EXPECT_EQ(o.out.rank(), 0);  // no host output
    EXPECT_EQ(o.device_out.shape(), (std::vector<i64>{c.N, c.spec.Hq, c.spec.Dv}));
    o.out = o.device_out.to_host();
  }
  expect_clean_validation();
  return o;
}

::testing::AssertionResult padding_is_empty(const PagedCase& c, const AttentionOutput& o) {
  const i64 first = c.q_begin(c.spec.q_lens.size()), Hq = c.spec.Hq, Dv = c.spec.Dv;
  for (i64 n = first; n < c.N; ++n)
    for (i64 h = 0; h < Hq; ++h) {
      for (i64 e = 0; e < Dv; ++e)
        if (o.out.at(static_cast<std::size_t>((n * Hq + h) * Dv + e)) != 0.f)
          return ::testing::AssertionFailure() << "padding row " << n << " has a non-zero output";
      if (o.lse->data_as<float>()[n * Hq + h] != -std::numeric_limits<float>::infinity())
        return ::testing::AssertionFailure() << "padding row " << n << " has a finite lse";
    }
  return ::testing::AssertionSuccess();
}

// As paged_numerics_test's generator, with shorter sequences (lavapipe runs the kernel on the
// CPU): S 1..8, decode / empty / chunked prefill / prefill / speculative sequences, pages of 1,
// 3, 16, 128, Hq / Hkv 1, 2, 4, 8, D != Dv, windows, chunks, soft cap, sinks, KV splits, padding.
PagedCaseSpec random_spec(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto pick = [&](auto... xs) {
    const std::vector<std::common_type_t<decltype(xs)...>> v{xs...};
    return v[rng() % v.size()];
  };
  const auto uniform = [&](i64 lo, i64 hi) {
    return lo + static_cast<i64>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  PagedCaseSpec s;
  s.seed = seed;
  s.page_size = pick(i64{1}, i64{3}, i64{16}, i64{128}, i64{3});
  const int heads = static_cast<int>(rng() % 6);
  const i64 hq[] = {1, 2, 4, 8, 8, 4}, hkv[] = {1, 1, 2, 2, 8, 1};
  s.Hq = hq[heads], s.Hkv = hkv[heads];
  s.D = pick(i64{8}, i64{24}, i64{40}, i64{72});
  s.Dv = rng() % 3 == 0 ? pick(i64{8}, i64{20}, i64{96}) : s.D;
  s.dtype = pick(DType::f32, DType::f16, DType::bf16);
  s.index_dtype = rng() % 2 ? DType::i32 : DType::i64;
  const i64 S = uniform(1, 8);
  for (i64 x = 0; x < S; ++x) {
    i64 kv = 0, q = 0;
    switch (rng() % 5) {
      case 0:
        kv = uniform(1, 200), q = 1;
        break;  // decode
      case 1:
        kv = uniform(0, 30), q = 0;
        break;  // idle / empty
      case 2:
        kv = uniform(2, 120), q = uniform(2, std::min<i64>(kv, 12));
        break;  // chunked prefill
      case 3:
        kv = uniform(1, 60), q = kv;
        break;  // prefill
      default:
        kv = uniform(4, 120), q = uniform(2, 4);
        break;  // speculative
    }
    s.kv_lens.push_back(kv), s.q_lens.push_back(q);
  }
  s.causal = rng() % 6 != 0;
  if (rng() % 3 == 0) s.window = Window{uniform(0, 20), s.causal ? 0 : uniform(0, 5)};
  if (rng() % 5 == 0) s.chunk = pick(i64{7}, i64{16}, i64{50});
  if (rng() % 4 == 0) s.soft_cap = pick(5.0, 30.0);
  s.sinks = rng() % 4 == 0;
  if (rng() % 2 == 0) s.split = pick(i64{16}, i64{37}, i64{64});
  s.pad_rows = rng() % 3 == 0 ? uniform(1, 3) : 0;
  s.pad_seqs = rng() % 3 == 0 ? uniform(1, 2) : 0;
  return s;
}

class GpuRandomBatch : public ::testing::TestWithParam<int> {};

// ATTNOPS_VK_PAGED_ROWWISE=1 for the scope of one test: stream sequences as row tasks
// (paged_attn), the path of devices without the decode kernel's subgroup operations.
struct ForceRowwise {
  explicit ForceRowwise(bool on) : on(on) {
    if (on) setenv("ATTNOPS_VK_PAGED_ROWWISE", "1", 1);
  }
  ~ForceRowwise() {
    if (on) unsetenv("ATTNOPS_VK_PAGED_ROWWISE");
  }
  bool on;
};

// Whether the batch has stream sequences (the decode kernel's units).
bool has_stream(const PagedCase& c) {
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, c.spec.Hq, c.options);
  for (const PagedWorkItem& it : plan.work())
    if (it.kind != PagedWorkKind::tile) return true;
  return false;
}

// The kernel a call reports: paged_decode where stream sequences ran on it (lavapipe has its
// subgroup shuffles), paged_rowwise otherwise.
void expect_kernel(const PagedCase& c, const AttentionOutput& o, bool rowwise) {
  if (rowwise || !has_stream(c))
    EXPECT_EQ(o.decision.run.kernel, "paged_rowwise") << o.decision.run.kernel_detail;
  else
    EXPECT_EQ(o.decision.run.kernel, "paged_decode") << o.decision.run.kernel_detail;
}

// Host cache (uploaded) and device cache (in place) against the dense oracle; both bitwise equal.
// Odd cases force the row-wise path.
TEST_P(GpuRandomBatch, WithinTheDenseTolerancesWithHostAndDeviceCaches) {
  REQUIRE_GPU();
  const PagedCaseSpec spec = random_spec(static_cast<std::uint64_t>(GetParam()) + 500);
  SCOPED_TRACE(spec.describe());
  const ForceRowwise rowwise(GetParam() % 2 == 1);
  const PagedCase c = make_paged_case(spec);
  const AttentionOutput host = run_gpu(c, c.cache);
  ASSERT_EQ(host.decision.backend, Backend::gpu) << host.decision.to_json();
  EXPECT_TRUE(host.decision.run.batch_invariant);
  expect_kernel(c, host, rowwise.on);
  EXPECT_TRUE(padding_is_empty(c, host));
  const Tolerance tol = tolerance_for(spec.dtype);
  for (std::size_t s = 0; s < spec.q_lens.size(); ++s)
    EXPECT_TRUE(rows_match(c, s, host, dense_oracle(c, s), tol.out, tol.lse));
  const AttentionOutput dev = run_gpu(c, device_cache(c), /*q_on_device=*/GetParam() % 4 >= 2);
  EXPECT_EQ(dev.decision.run.output, GetParam() % 4 >= 2 ? "device" : "host");
  EXPECT_TRUE(same_bits(dev.out, host.out));
  EXPECT_TRUE(same_bits(*dev.lse, *host.lse));
}

INSTANTIATE_TEST_SUITE_P(PagedGpu, GpuRandomBatch, ::testing::Range(0, random_case_count(12)));

// 8-bit caches (both dtypes, both scale kinds, every q dtype) on the gpu, host and device pools,
// against the oracle over their values; a batch with a shared prefix gives the same bits with
// sharing on and off (the gpu reads each row's keys itself).
class GpuQuantBatch : public ::testing::TestWithParam<int> {};

TEST_P(GpuQuantBatch, WithinTheDenseTolerancesWithHostAndDeviceCaches) {
  REQUIRE_GPU();
  const int x = GetParam();
  PagedCaseSpec spec = random_spec(static_cast<std::uint64_t>(x) + 900);
  spec.kv_dtype = x % 2 ? DType::i8 : DType::fp8_e4m3;
  spec.scales = (x / 2) % 2 ? KVScales::per_tensor : KVScales::per_token;
  spec.dtype = x % 3 == 0 ? DType::f32 : x % 3 == 1 ? DType::bf16 : DType::f16;
  if (x % 4 == 3 && spec.q_lens.size() >= 2 && spec.q_lens[0] > 0 && spec.q_lens[1] > 0) {
    // Sequence 1 begins with sequence 0's first page(s).
    const std::int64_t shared = std::min(spec.kv_lens[0], spec.kv_lens[1]) / spec.page_size * spec.page_size;
    spec.share_from = {-1, 0}, spec.share_tokens = {0, shared};
  }
  SCOPED_TRACE(spec.describe());
  const ForceRowwise rowwise(x % 5 == 4);
  const PagedCase c = make_paged_case(spec);
  const AttentionOutput host = run_gpu(c, c.cache);
  ASSERT_EQ(host.decision.backend, Backend::gpu) << host.decision.to_json();
  expect_kernel(c, host, rowwise.on);
  Tolerance tol = tolerance_for(spec.dtype);
  for (std::size_t s = 0; s < spec.q_lens.size(); ++s)
    EXPECT_TRUE(rows_match(c, s, host, dense_oracle(c, s), tol.out, tol.lse));
  const AttentionOutput dev = run_gpu(c, device_cache(c), /*q_on_device=*/x % 2 == 0);
  EXPECT_TRUE(same_bits(dev.out, host.out));
  EXPECT_TRUE(same_bits(*dev.lse, *host.lse));
  PagedCase off = c;
  off.options.share_prefixes = false;
  const AttentionOutput unshared = run_gpu(off, off.cache);
  EXPECT_TRUE(same_bits(unshared.out, host.out));
}

INSTANTIATE_TEST_SUITE_P(PagedGpu, GpuQuantBatch, ::testing::Range(0, random_case_count(10)));

// A long decode split into many ranges, a prefill past a page of 128, MQA, D != Dv, sinks.
TEST(PagedGpu, LongDecodeSplitsAndPrefillPastAPage) {
  REQUIRE_GPU();
  PagedCaseSpec s;
  s.q_lens = {1, 1, 140, 3};
  s.kv_lens = {700, 17, 200, 40};
  s.Hq = 4, s.Hkv = 1, s.D = 72, s.Dv = 40, s.page_size = 128;
  s.split = 100;
  s.window = Window{500, 0};
  s.sinks = true;
  for (DType dt : {DType::f32, DType::bf16}) {
    s.dtype = dt;
    SCOPED_TRACE(s.describe());
    const PagedCase c = make_paged_case(s);
    const AttentionOutput o = run_gpu(c, device_cache(c));
    const Tolerance tol = tolerance_for(dt);
    for (std::size_t x = 0; x < s.q_lens.size(); ++x)
      EXPECT_TRUE(rows_match(c, x, o, dense_oracle(c, x), tol.out, tol.lse));
  }
}

std::string row_bytes(const PagedCase& c, std::size_t s, const AttentionOutput& o) {
  const i64 q0 = c.q_begin(s), ql = c.spec.q_lens[s], Hq = c.spec.Hq, Dv = c.spec.Dv;
  const std::size_t es = dtype_size(c.spec.dtype);
  std::string bytes(static_cast<const char*>(o.out.data()) + q0 * Hq * Dv * es,
                    static_cast<std::size_t>(ql * Hq * Dv) * es);
  bytes.append(reinterpret_cast<const char*>(o.lse->data_as<float>() + q0 * Hq),
               static_cast<std::size_t>(ql * Hq) * 4);
  return bytes;
}

// Batch invariance on one device: each sequence alone equals its rows inside the mixed batch, bit
// for bit, whatever the page size, the page permutation and the padding.
TEST(PagedGpu, BatchInvarianceOnOneDevice) {
  REQUIRE_GPU();
  PagedCaseSpec s;
  s.q_lens = {1, 12, 30, 3, 1};
  s.kv_lens = {300, 50, 30, 45, 9};
  s.seq_seeds = {11, 12, 13, 14, 15};
  s.Hq = 4, s.Hkv = 2, s.D = 40, s.Dv = 24;
  s.dtype = DType::bf16;
  s.split = 64;
  s.window = Window{200, 0};
  s.soft_cap = 20.0;
  s.sinks = true;
  s.page_size = 16;
  const PagedCase batch = make_paged_case(s);
  const AttentionOutput mixed = run_gpu(batch, device_cache(batch));
  for (std::size_t x = 0; x < s.q_lens.size(); ++x) {
    PagedCaseSpec one = s;
    one.q_lens = {s.q_lens[x]}, one.kv_lens = {s.kv_lens[x]}, one.seq_seeds = {s.seq_seeds[x]};
    one.page_size = x % 2 == 0 ? 3 : 128;  // another page size and layout
    one.pad_rows = 2, one.pad_seqs = 1;
    const PagedCase alone = make_paged_case(one);
    EXPECT_EQ(row_bytes(alone, 0, run_gpu(alone, alone.cache)), row_bytes(batch, x, mixed))
        << "sequence " << x;
  }
}

// NaN / inf in values: they reach only the rows that see them; other sequences are bitwise what
// they are without them. A +inf sink takes all the mass (output 0, lse unchanged).
TEST(PagedGpu, NonFinitePolicy) {
  REQUIRE_GPU();
  PagedCaseSpec s;
  s.q_lens = {1, 6, 1};
  s.kv_lens = {90, 30, 50};
  s.window = Window{10, 0};
  s.page_size = 16;
  s.split = 32;
  const PagedCase clean = make_paged_case(s);
  PagedCase c = make_paged_case(s);
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, s.Hq, c.options);
  const auto poison = [&](i64 seq, i64 j, float x) {
    const TensorView v = c.cache.v_page(plan.pages(seq)[j / s.page_size]);
    auto* row = static_cast<float*>(const_cast<void*>(v.data())) + (j % s.page_size) * v.stride(0);
    for (i64 e = 0; e < s.Hkv * s.Dv; ++e) row[e] = x;
    Tensor& dense = c.v_seq[static_cast<std::size_t>(seq)];
    for (i64 e = 0; e < s.Hkv * s.Dv; ++e) dense.set(static_cast<std::size_t>(j * s.Hkv * s.Dv + e), x);
  };
  poison(0, 3, NAN);                                      // outside every row's window
  poison(1, 26, std::numeric_limits<float>::infinity());  // seen by the last rows of sequence 1
  {  // and a NaN key of sequence 1 at position 28, seen by its last rows only (their rows: NaN)
    const i64 j = 28;
    const TensorView k = c.cache.k_page(plan.pages(1)[j / s.page_size]);
    auto* row = static_cast<float*>(const_cast<void*>(k.data())) + (j % s.page_size) * k.stride(0);
    for (i64 e = 0; e < s.Hkv * s.D; ++e) row[e] = NAN;
    for (i64 e = 0; e < s.Hkv * s.D; ++e) c.k_seq[1].set(static_cast<std::size_t>(j * s.Hkv * s.D + e), NAN);
  }
  const AttentionOutput o = run_gpu(c, device_cache(c)), ref = run_gpu(clean, clean.cache);
  const Tolerance tol = tolerance_for(s.dtype);
  for (std::size_t x = 0; x < 2; ++x) EXPECT_TRUE(rows_match(c, x, o, dense_oracle(c, x), tol.out, tol.lse));
  for (i64 e = 0; e < s.Hq * s.Dv; ++e) EXPECT_TRUE(std::isfinite(o.out.at(static_cast<std::size_t>(e))));
  EXPECT_EQ(row_bytes(c, 2, o), row_bytes(clean, 2, ref));

  // +inf sink on head 1.
  PagedCase sunk = make_paged_case(s);
  Tensor sinks(DType::f32, {s.Hq});
  for (i64 h = 0; h < s.Hq; ++h)
    sinks.data_as<float>()[h] = h == 1 ? std::numeric_limits<float>::infinity() : 0.5f;
  sunk.options.sinks = sinks.view();
  const AttentionOutput so = run_gpu(sunk, sunk.cache);
  for (i64 n = 0; n < sunk.N; ++n)
    for (i64 e = 0; e < s.Dv; ++e)
      EXPECT_EQ(so.out.at(static_cast<std::size_t>((n * s.Hq + 1) * s.Dv + e)), 0.f);
  for (i64 n = 0; n < sunk.N; ++n)
    EXPECT_EQ(so.lse->data_as<float>()[n * s.Hq + 1], ref.lse->data_as<float>()[n * s.Hq + 1]) << "row " << n;
}

// Dispatch: auto sends a device cache to the gpu and keeps a host cache on the cpu (cpu_faster:
// it would be uploaded whole every call); the decision says the run is batch invariant; a device
// cache the gpu cannot run is a typed error naming why, never a silent copy.
TEST(PagedGpu, DispatchAndErrors) {
  REQUIRE_GPU();
  PagedCaseSpec s;
  s.q_lens = {1, 4}, s.kv_lens = {33, 4}, s.dtype = DType::f16;
  const PagedCase c = make_paged_case(s);
  const Attention attn = registry().get("paged");
  const AttentionOutput d = attn.paged(c.q, device_cache(c), c.batch, c.options);
  EXPECT_EQ(d.decision.backend, Backend::gpu) << d.decision.to_json();
  EXPECT_THAT(d.decision.to_json(), HasSubstr("\"batch_invariant\": true"));
  EXPECT_THAT(d.decision.run.kernel_detail, HasSubstr("batch invariant on this device"));
  EXPECT_EQ(d.decision.run.inputs, "mixed");
  const AttentionOutput h = attn.paged(c.q, c.cache, c.batch, c.options);
  EXPECT_EQ(h.decision.backend, Backend::cpu) << h.decision.to_json();
  ASSERT_TRUE(h.decision.has(ReasonCode::cpu_faster)) << h.decision.to_json();
  EXPECT_THAT(h.decision.to_json(), HasSubstr("a host cache would be uploaded whole"));
  // Head dims past the kernel's 512: the host cache moves on to the cpu, the device cache errs.
  PagedCaseSpec big = s;
  big.q_lens = {1}, big.kv_lens = {3}, big.D = 520, big.Dv = 8, big.dtype = DType::f32;
  const PagedCase b = make_paged_case(big);
  OperationMetadata md;
  md.backends = {Backend::gpu};
  const AttentionOutput moved = registry().get("paged", md).paged(b.q, b.cache, b.batch, b.options);
  EXPECT_EQ(moved.decision.backend, Backend::cpu);
  EXPECT_TRUE(moved.decision.has(ReasonCode::unsupported_feature)) << moved.decision.to_json();
  expect_error([&] { registry().get("paged", md).paged(b.q, device_cache(b), b.batch, b.options); },
               ErrorCode::backend_unavailable, "head dims up to 512");
  // A device q with a device cache of another dtype: the problem's own check, before any backend.
  expect_error(
      [&] {
        attn.paged(DeviceTensor::from_host(Tensor::copy_of(c.q, DType::f32)), device_cache(c), c.batch,
                   c.options);
      },
      ErrorCode::unsupported_dtype, "q: dtype f32 differs from the cache's f16");
}

// The dense form of the operator (attn(q, k, v): B sequences of Tq queries over Tk keys, pages
// of Tk tokens viewed in place) on the gpu, host and device tensors; what has no ragged form is
// unsupported_feature there and runs elsewhere.
TEST(PagedGpu, DenseCallsRunThePagedKernel) {
  REQUIRE_GPU();
  OperationMetadata md;
  md.backends = {Backend::gpu};
  const Attention attn = registry().get("paged", md);
  for (const auto& [B, Tq, Tk, dt] : {std::tuple{2, 1, 77, DType::f32}, std::tuple{1, 33, 33, DType::f16},
                                      std::tuple{3, 5, 40, DType::bf16}}) {
    CaseSpec cs;
    cs.B = B, cs.Tq = Tq, cs.Tk = Tk, cs.Hq = 4, cs.Hkv = 2, cs.D = 24, cs.Dv = 16, cs.dtype = dt;
    cs.window = Window{9, 0};
    cs.sinks = Tq == 5;
    const Case c = make_case(cs, static_cast<std::uint64_t>(B * 100 + Tq));
    SCOPED_TRACE(c.describe());
    const AttentionOutput o = attn(c.q, c.k, c.v, c.options);
    ASSERT_EQ(o.decision.backend, Backend::gpu) << o.decision.to_json();
    // Decode-like sequences (G * Tq <= 32) run on the decode kernel, the others row by row.
    EXPECT_EQ(o.decision.run.kernel, 2 * Tq <= kPagedStreamMaxRows ? "paged_decode" : "paged_rowwise");
    AttentionBuffers b;
    b.out = o.out;
    b.lse = o.lse;
    EXPECT_TRUE(within_tolerance(problem_for(c), b));
    // Device q, k, v: the output stays on the device, the same bits.
    const DeviceTensor dq = DeviceTensor::from_host(c.q), dk = DeviceTensor::from_host(c.k),
                       dv = DeviceTensor::from_host(c.v);
    const AttentionOutput d = attn(dq, dk, dv, c.options);
    EXPECT_EQ(d.decision.run.inputs, "device");
    EXPECT_TRUE(same_bits(d.device_out.to_host(), o.out));
    EXPECT_TRUE(same_bits(*d.lse, *o.lse));
  }
  CaseSpec cs;
  cs.Tq = 8, cs.Tk = 8, cs.segments = true;
  const Case c = make_case(cs, 3);
  const AttentionOutput o = attn(c.q, c.k, c.v, c.options);
  EXPECT_NE(o.decision.backend, Backend::gpu);
  EXPECT_TRUE(o.decision.has(ReasonCode::unsupported_feature)) << o.decision.to_json();
}

}  // namespace
}  // namespace attnops::testing
