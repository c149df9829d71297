// 8-bit KV caches (int8, fp8_e4m3; per-token and per-tensor scales): write() then gather() is the
// documented rounding bit for bit (kv_quant.h; the expected codes come from an independent search
// over every code), and the ragged_paged kernels over them agree with the oracle: native is the
// dense oracle over the dequantized values, bitwise; cpu (every ISA tier here) within the dense
// tolerances. Bad input: typed errors naming the argument, nothing written.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

#include "attnops/ext/paged_problem.h"
#include "backends/cpu/paged_cpu.h"
#include "tests/paged/paged_cases.h"
#include "tests/support/testing.h"

namespace attnops::testing {
namespace {

using ::testing::HasSubstr;
using i64 = std::int64_t;

void expect_error(const std::function<void()>& f, ErrorCode code, const std::string& what) {
  try {
    f();
    ADD_FAILURE() << "no error (expected " << error_code_name(code) << " naming " << what << ")";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

// ---- the documented rounding, computed independently ----------------------------------------

// The value of an e4m3fn code from its fields (NaN for S.1111.111).
double fp8_value(int c) {
  const int e = (c >> 3) & 15, m = c & 7;
  double v = e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  if (e == 15 && m == 7) v = NAN;
  return (c & 0x80) ? -v : v;
}

// y to the nearest e4m3 value, ties to the even mantissa, saturating at 448, sign kept.
std::uint8_t expected_fp8(float y) {
  const double a = std::fabs(static_cast<double>(y));
  int best = 0x7e;
  if (a < 448.0) {
    double err = INFINITY;
    for (int c = 0; c <= 0x7e; ++c) {
      const double d = std::fabs(fp8_value(c) - a);
      if (d < err || (d == err && (c & 1) == 0)) err = d, best = c;
    }
  }
  return static_cast<std::uint8_t>(best | (std::signbit(y) ? 0x80 : 0));
}

// y to the nearest integer, ties to even, clamped to [-127, 127].
std::int8_t expected_int8(float y) {
  const double f = std::floor(static_cast<double>(y)), frac = static_cast<double>(y) - f;
  double r = frac > 0.5 ? f + 1 : frac < 0.5 ? f : (std::fmod(f, 2.0) == 0 ? f : f + 1);
  r = std::clamp(r, -127.0, 127.0);
  return static_cast<std::int8_t>(r);
}

float expected_scale(DType t, const float* row, i64 n) {
  float amax = 0;
  for (i64 e = 0; e < n; ++e) amax = std::max(amax, std::fabs(row[e]));
  const float s = amax / (t == DType::i8 ? 127.f : 448.f);
  return s >= std::numeric_limits<float>::min() ? s : 1.f;
}

float code_value(DType t, std::uint8_t c) {
  return t == DType::i8 ? static_cast<float>(static_cast<std::int8_t>(c)) : static_cast<float>(fp8_value(c));
}

// Rows that reach every rounding case: normal draws at several magnitudes, exact ties of both
// kinds, values past the largest code, signed zeros and tiny values that round to zero.
Tensor probe_rows(i64 N, i64 H, i64 D, std::uint64_t seed, float tensor_scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.f, 1.f);
  Tensor t(DType::f32, {N, H, D});
  float* x = t.data_as<float>();
  const float s = tensor_scale;
  const float specials[] = {
      0.f,          -0.f,       2.5f * s,  3.5f * s,  -2.5f * s,         1.0625f * s, 1.1875f * s,
      -1.0625f * s, 300.f * s,  -1e4f * s, 464.f * s, 0.0009765625f * s, -1e-9f * s,  0.00146484375f * s,
      126.5f * s,   -127.5f * s};
  for (i64 n = 0; n < N; ++n)
    for (i64 h = 0; h < H; ++h)
      for (i64 e = 0; e < D; ++e) {
        float& v = x[(n * H + h) * D + e];
        switch (n % 4) {
          case 0:
            v = normal(rng) * 3.f;
            break;
          case 1:
            v = specials[static_cast<std::size_t>(e) % std::size(specials)];
            break;
          case 2:  // a row of (signed) zeros: per-token scale 1
            v = (e % 2) ? -0.f : 0.f;
            break;
          default:
            v = normal(rng) * 1e-3f;
            break;
        }
      }
  return t;
}

class RoundTrip : public ::testing::TestWithParam<std::tuple<DType, KVScales, DType>> {};

TEST_P(RoundTrip, WriteThenGatherIsTheDocumentedRounding) {
  const auto [t, kind, in] = GetParam();
  const i64 P = 3, ps = 4, H = 2, D = 24, Dv = 8, N = 8;
  const float tk = 0.02f, tv = 0.5f;  // per-tensor scales
  std::optional<KVTensorScales> ts;
  if (kind == KVScales::per_tensor) ts = KVTensorScales{tk, tv};
  PagedKVCache cache = PagedKVCache::host({P, ps, H, D, Dv, t, kind}, ts);
  // The rows in the input dtype, and the f32 values write() quantizes (a lossless widening).
  const Tensor kn = Tensor::copy_of(probe_rows(N, H, D, 1, kind == KVScales::per_tensor ? tk : 1.f), in);
  const Tensor vn = Tensor::copy_of(probe_rows(N, H, Dv, 2, kind == KVScales::per_tensor ? tv : 1.f), in);
  const Tensor kf = Tensor::copy_of(kn, DType::f32), vf = Tensor::copy_of(vn, DType::f32);
  Tensor slots(DType::i64, {N});
  const i64 slot_of[N] = {5, 0, 11, -1, 3, 7, 8, 1};
  for (i64 n = 0; n < N; ++n) slots.data_as<i64>()[n] = slot_of[n];
  cache.write(kn, vn, slots);

  for (auto [pool, scales, x, Dh, tensor] : {std::tuple{cache.k_pages(), cache.k_scales(), &kf, D, tk},
                                             std::tuple{cache.v_pages(), cache.v_scales(), &vf, Dv, tv}}) {
    for (i64 n = 0; n < N; ++n) {
      if (slot_of[n] < 0) continue;
      const i64 page = slot_of[n] / ps, r = slot_of[n] % ps;
      for (i64 h = 0; h < H; ++h) {
        const float* row = x->data_as<float>() + (n * H + h) * Dh;
        const float s = kind == KVScales::per_tensor ? tensor : expected_scale(t, row, Dh);
        if (kind == KVScales::per_token) {
          const float got = scales.data_as<float>()[page * scales.stride(0) + r * scales.stride(1) + h];
          EXPECT_EQ(got, s) << "scale of row " << n << " head " << h;
        }
        const auto* codes = static_cast<const std::uint8_t*>(pool.data()) + page * pool.stride(0) +
                            r * pool.stride(1) + h * pool.stride(2);
        for (i64 e = 0; e < Dh; ++e) {
          const float y = row[e] / s;
          const std::uint8_t want =
              t == DType::i8 ? static_cast<std::uint8_t>(expected_int8(y)) : expected_fp8(y);
          ASSERT_EQ(codes[e], want) << "row " << n << " head " << h << " element " << e << ": x = " << row[e]
                                    << ", scale " << s << ", x / scale = " << y;
        }
      }
    }
  }
  // gather(): code x scale in f32, bit for bit.
  Tensor page_row(DType::i32, {P});
  for (i64 p = 0; p < P; ++p) page_row.data_as<std::int32_t>()[p] = static_cast<std::int32_t>(p);
  const PagedKVCache::Dense g = cache.gather(page_row, P * ps);
  ASSERT_EQ(g.k.dtype(), DType::f32);
  for (auto [pool, scales, dense, Dh, tensor] : {std::tuple{cache.k_pages(), cache.k_scales(), &g.k, D, tk},
                                                 std::tuple{cache.v_pages(), cache.v_scales(), &g.v, Dv, tv}})
    for (i64 j = 0; j < P * ps; ++j)
      for (i64 h = 0; h < H; ++h) {
        const float s = kind == KVScales::per_tensor ? tensor : scales.data_as<float>()[j * H + h];
        for (i64 e = 0; e < Dh; ++e) {
          const std::uint8_t c = static_cast<const std::uint8_t*>(pool.data())[(j * H + h) * Dh + e];
          const float want = code_value(t, c) * s, got = dense->data_as<float>()[(j * H + h) * Dh + e];
          ASSERT_EQ(std::memcmp(&want, &got, 4), 0) << "key " << j << " head " << h << " element " << e;
        }
      }
}

INSTANTIATE_TEST_SUITE_P(Paged, RoundTrip,
                         ::testing::Combine(::testing::Values(DType::i8, DType::fp8_e4m3),
                                            ::testing::Values(KVScales::per_token, KVScales::per_tensor),
                                            ::testing::Values(DType::f32, DType::f16, DType::bf16)));

// The scalar conversions themselves over every code and a dense sweep of f32 values.
TEST(KvQuant, Fp8ConversionsAreTheOcpE4m3fnOnes) {
  for (int c = 0; c < 256; ++c) {
    const float got = fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
    const double want = fp8_value(c);
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(static_cast<double>(got), want) << c;
      EXPECT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
      EXPECT_EQ(fp8_e4m3_from_float(got), c) << c;  // every finite code round-trips
    }
  }
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200000; ++i) {
    std::uint32_t u = static_cast<std::uint32_t>(rng());
    if ((u & 0x7f800000u) == 0x7f800000u) continue;  // NaN / inf below
    float x;
    std::memcpy(&x, &u, 4);
    ASSERT_EQ(fp8_e4m3_from_float(x), expected_fp8(x)) << x;
    ASSERT_EQ(int8_from_float(x), expected_int8(x)) << x;
  }
  EXPECT_EQ(fp8_e4m3_from_float(INFINITY), 0x7e);
  EXPECT_EQ(fp8_e4m3_from_float(-INFINITY), 0xfe);
  EXPECT_EQ(fp8_e4m3_from_float(NAN) & 0x7f, 0x7f);
  EXPECT_EQ(int8_from_float(-1e30f), -127);
}

// ---- the kernels against the oracle ---------------------------------------------------------

PagedCaseSpec random_quant_spec(std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  const auto uniform = [&](i64 lo, i64 hi) {
    return lo + static_cast<i64>(rng() % static_cast<std::uint64_t>(hi - lo + 1));
  };
  PagedCaseSpec s;
  s.seed = seed;
  s.kv_dtype = seed % 2 ? DType::i8 : DType::fp8_e4m3;
  s.scales = (seed / 2) % 2 ? KVScales::per_tensor : KVScales::per_token;
  const DType q_dtypes[] = {DType::f32, DType::bf16, DType::f16};
  s.dtype = q_dtypes[(seed / 4) % 3];
  const i64 ps[] = {1, 3, 16, 16};
  s.page_size = ps[rng() % 4];
  const i64 hq[] = {1, 4, 8, 8}, hkv[] = {1, 2, 2, 8};
  const int heads = static_cast<int>(rng() % 4);
  s.Hq = hq[heads], s.Hkv = hkv[heads];
  const i64 dims[] = {8, 24, 40, 64, 128};
  s.D = dims[rng() % 5];
  s.Dv = rng() % 3 == 0 ? dims[rng() % 3] : s.D;
  const i64 S = uniform(1, 6);
  for (i64 x = 0; x < S; ++x) {
    i64 kv = 0, q = 0;
    switch (rng() % 4) {
      case 0:
        kv = uniform(1, 300), q = 1;
        break;
      case 1:
        kv = uniform(2, 200), q = uniform(2, std::min<i64>(kv, 40));
        break;
      case 2:
        kv = uniform(1, 100), q = kv;
        break;
      default:
        kv = uniform(4, 200), q = uniform(2, 3);
        break;
    }
    s.kv_lens.push_back(kv), s.q_lens.push_back(q);
  }
  if (rng() % 3 == 0) s.window = Window{uniform(0, 30), 0};
  if (rng() % 4 == 0) s.soft_cap = 20.0;
  s.sinks = rng() % 4 == 0;
  if (rng() % 2 == 0) s.split = uniform(16, 70);
  return s;
}

AttentionOutput run_tier(const PagedCase& c, cpu::Isa tier, int threads = 0) {
  OperationMetadata md;
  md.num_threads = threads;
  const PagedPlan plan = plan_paged(c.batch, c.cache.spec(), c.N, c.spec.Hq, c.options);
  const PagedProblem p = make_paged_problem(c.q, c.cache, plan, c.options, md);
  PagedBuffers b = allocate_paged_buffers(p);
  cpu::paged_attention(p, b, tier);
  AttentionOutput o;
  o.out = b.out;
  o.lse = b.lse;
  o.decision.run = b.run;
  return o;
}

// The tolerances of q's dtype; a sequence of many query rows (a tile item) reads an 8-bit cache
// rounded to q's 16-bit dtype (the tiled kernel's input), which adds a rounding of K to the lse.
Tolerance quant_tolerance(const PagedCase& c, std::size_t s) {
  Tolerance t = tolerance_for(c.spec.dtype);
  const bool tile = c.spec.q_lens[s] > kPagedStreamMaxQ &&
                    c.spec.q_lens[s] * (c.spec.Hq / c.spec.Hkv) > kPagedStreamMaxRows;
  if (tile && c.spec.dtype != DType::f32) t.lse = 4e-3;
  return t;
}

class QuantBatch : public ::testing::TestWithParam<int> {};

TEST_P(QuantBatch, NativeIsTheOracleOverTheValuesAndCpuTiersAreWithinTolerance) {
  const PagedCaseSpec spec = random_quant_spec(static_cast<std::uint64_t>(GetParam()) + 500);
  SCOPED_TRACE(spec.describe());
  const PagedCase c = make_paged_case(spec);
  const AttentionOutput native = run_paged(c, Backend::native);
  std::vector<AttentionOutput> dense;
  for (std::size_t s = 0; s < spec.q_lens.size(); ++s) {
    dense.push_back(dense_oracle(c, s));
    EXPECT_TRUE(rows_match(c, s, native, dense.back(), 0, 0));
  }
  for (cpu::Isa tier : cpu_tiers_to_test()) {
    SCOPED_TRACE(tier_label(tier));
    const AttentionOutput cpu = run_tier(c, tier);
    EXPECT_TRUE(cpu.decision.run.batch_invariant);
    EXPECT_THAT(cpu.decision.run.kernel_detail, HasSubstr(std::string(dtype_name(*spec.kv_dtype))));
    for (std::size_t s = 0; s < spec.q_lens.size(); ++s) {
      const Tolerance tol = quant_tolerance(c, s);
      EXPECT_TRUE(rows_match(c, s, cpu, dense[s], tol.out, tol.lse));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paged, QuantBatch, ::testing::Range(0, random_case_count(24)));

// A long decode over many splits and pages, every q dtype, both 8-bit dtypes and scale kinds.
TEST(PagedQuant, LongDecodeOfEveryKind) {
  for (DType kv : {DType::i8, DType::fp8_e4m3})
    for (KVScales kind : {KVScales::per_token, KVScales::per_tensor})
      for (DType q : {DType::f32, DType::bf16}) {
        PagedCaseSpec s;
        s.q_lens = {1, 1, 2};
        s.kv_lens = {700, 33, 129};
        s.Hq = 8, s.Hkv = 2, s.D = 128, s.Dv = 128, s.page_size = 16;
        s.dtype = q, s.kv_dtype = kv, s.scales = kind;
        s.split = 128;
        SCOPED_TRACE(s.describe());
        const PagedCase c = make_paged_case(s);
        for (cpu::Isa tier : cpu_tiers_to_test()) {
          SCOPED_TRACE(tier_label(tier));
          const AttentionOutput cpu = run_tier(c, tier, 2);
          for (std::size_t x = 0; x < s.q_lens.size(); ++x) {
            const Tolerance tol = tolerance_for(q);
            EXPECT_TRUE(rows_match(c, x, cpu, dense_oracle(c, x), tol.out, tol.lse));
          }
        }
      }
}

// An f16 q over an 8-bit cache whose code x scale passes f16's largest value (65504): a prefill
// (tile item, which reads the cache in q's 16-bit dtype where that is safe) must read it in f32,
// not as inf; a decode row (stream item) reads in f32 anyway. Codes are set in the pools directly
// (write() of f16 rows cannot make such values) and q is small, so the logits stay moderate.
TEST(PagedQuant, F16QueriesOverCodesTimesScalesPastF16sRange) {
  for (DType kv : {DType::i8, DType::fp8_e4m3})
    for (KVScales kind : {KVScales::per_tensor, KVScales::per_token}) {
      PagedCaseSpec s;
      s.q_lens = {128, 1};
      s.kv_lens = {128, 90};
      s.Hq = 4, s.Hkv = 2, s.D = 16, s.Dv = 16, s.page_size = 16;
      s.dtype = DType::f16, s.kv_dtype = kv, s.scales = kind;
      s.tensor_scales = KVTensorScales{1000.f, 0.01f};
      SCOPED_TRACE(s.describe());
      PagedCase c = make_paged_case(s);
      std::mt19937 rng(7);
      const TensorView kp = c.cache.k_pages();
      auto* codes = static_cast<std::uint8_t*>(const_cast<void*>(kp.data()));
      for (i64 e = 0; e < kp.numel(); ++e) {  // codes of magnitude 64..127 (int8) or 64..448 (e4m3)
        const float x = static_cast<float>(64 + rng() % 64) * (rng() % 2 ? 1.f : -1.f);
        codes[e] = kv == DType::i8 ? static_cast<std::uint8_t>(static_cast<std::int8_t>(x))
                                   : fp8_e4m3_from_float(x * 3.5f);
      }
      if (kind == KVScales::per_token) {
        const TensorView ks = c.cache.k_scales();
        auto* sc = static_cast<float*>(const_cast<void*>(ks.data()));
        for (i64 e = 0; e < ks.numel(); ++e) sc[e] = 1000.f;
      }
      for (std::size_t e = 0; e < static_cast<std::size_t>(c.q.numel()); ++e) c.q.set(e, c.q.at(e) * 1e-3f);
      const i64 width = c.table.dim(1);
      for (std::size_t x = 0; x < s.q_lens.size(); ++x) {  // the sequences' keys: the new code x scale
        const TensorView row(static_cast<const char*>(c.table.data()) +
                                 static_cast<i64>(x) * width * static_cast<i64>(dtype_size(s.index_dtype)),
                             s.index_dtype, {width});
        c.k_seq[x] = c.cache.gather(row, s.kv_lens[x]).k;
      }
      for (cpu::Isa tier : cpu_tiers_to_test()) {
        SCOPED_TRACE(tier_label(tier));
        const AttentionOutput cpu = run_tier(c, tier, 2);
        for (std::size_t x = 0; x < s.q_lens.size(); ++x) {
          const Tolerance tol = tolerance_for(DType::f16);
          EXPECT_TRUE(rows_match(c, x, cpu, dense_oracle(c, x), tol.out, tol.lse)) << "sequence " << x;
        }
      }
    }
}

// An e4m3 NaN code (S.1111.111) reads as NaN on every backend: in a key a row sees, the row is
// NaN; in the value of a key a row does not weigh (outside its window), nothing for that row.
TEST(PagedQuant, Fp8NanCodesFollowTheNonFinitePolicy) {
  PagedCaseSpec s;
  s.q_lens = {1, 2};
  s.kv_lens = {90, 90};
  s.Hq = 2, s.Hkv = 1, s.D = 16, s.Dv = 16, s.page_size = 8;
  s.dtype = DType::f32, s.kv_dtype = DType::fp8_e4m3;
  s.window = Window{40, 0};
  s.split = 32;
  s.permute_pages = false;
  PagedCase c = make_paged_case(s);
  // Sequence 0: a NaN code in the key of position 70 (its row sees 49..89). Sequence 1: in the
  // value of position 48, which its first row (48..88) sees and its second (49..89) does not.
  const auto poke = [&](const TensorView& pool, std::size_t seq, i64 j, i64 e) {
    const i64 col = static_cast<i64>(seq) * c.table.dim(1) + j / 8;
    const i64 page =
        c.table.dtype() == DType::i32 ? c.table.data_as<std::int32_t>()[col] : c.table.data_as<i64>()[col];
    auto* b = static_cast<std::uint8_t*>(const_cast<void*>(pool.data()));
    b[page * pool.stride(0) + (j % 8) * pool.stride(1) + e] = 0xff;
  };
  poke(c.cache.k_pages(), 0, 70, 3);
  poke(c.cache.v_pages(), 1, 48, 5);
  const AttentionOutput native = run_paged(c, Backend::native);
  const auto at = [](const AttentionOutput& o, i64 n, i64 e) {
    return o.out.at(static_cast<std::size_t>(n * 32 + e));
  };
  for (cpu::Isa tier : cpu_tiers_to_test()) {
    SCOPED_TRACE(tier_label(tier));
    const AttentionOutput cpu = run_tier(c, tier);
    for (i64 e = 0; e < 32; ++e) {
      EXPECT_TRUE(std::isnan(at(native, 0, e)) && std::isnan(at(cpu, 0, e))) << e;
      if (e % 16 == 5) {  // the NaN value's column
        EXPECT_TRUE(std::isnan(at(native, 1, e)) && std::isnan(at(cpu, 1, e))) << e;
      } else {
        EXPECT_NEAR(at(cpu, 1, e), at(native, 1, e), 2e-5) << e;
      }
      EXPECT_TRUE(std::isfinite(at(native, 2, e))) << e;
      EXPECT_NEAR(at(cpu, 2, e), at(native, 2, e), 2e-5) << e;
    }
  }
}

// ---- bad input --------------------------------------------------------------------------------

TEST(PagedQuant, BadScalesAreTypedErrorsNamingThem) {
  const i64 P = 2, ps = 4, H = 2, D = 8;
  Tensor k(DType::i8, {P, ps, H, D}), v(DType::i8, {P, ps, H, D});
  const auto scales = [&](float x) {
    Tensor t(DType::f32, {P, ps, H});
    for (i64 i = 0; i < t.numel(); ++i) t.data_as<float>()[i] = 1.f;
    t.data_as<float>()[5] = x;
    return t;
  };
  const Tensor good = scales(1.f);
  expect_error(
      [&] {
        (void)PagedKVCache::wrap(k, v, Tensor(DType::f32, {P, ps}), good);
      },
      ErrorCode::shape_mismatch, "k_scales");
  expect_error(
      [&] {
        (void)PagedKVCache::wrap(k, v, good, Tensor(DType::f16, {P, ps, H}));
      },
      ErrorCode::unsupported_dtype, "v_scales");
  for (float bad : {0.f, -1.f, NAN, INFINITY, 1e-40f, 1e38f})
    expect_error([&] { (void)PagedKVCache::wrap(k, v, scales(bad), good); }, ErrorCode::invalid_argument,
                 "k_scales: scale [0, 2, 1]");
  expect_error([&] { (void)PagedKVCache::wrap(k, v); }, ErrorCode::invalid_argument, "k_scales");
  Tensor one(DType::f32, {1});
  one.data_as<float>()[0] = 0.5f;
  expect_error([&] { (void)PagedKVCache::wrap(k, v, one, good); }, ErrorCode::invalid_argument, "per token");
  expect_error(
      [&] {
        (void)PagedKVCache::host({P, ps, H, D, D, DType::i8, KVScales::per_token}, KVTensorScales{});
      },
      ErrorCode::invalid_argument, "tensor_scales");
  expect_error(
      [&] {
        (void)PagedKVCache::host({P, ps, H, D, D, DType::fp8_e4m3, KVScales::per_tensor},
                                 KVTensorScales{1.f, 0.f});
      },
      ErrorCode::invalid_argument, "v_scales");
  Tensor kf(DType::f32, {P, ps, H, D});
  expect_error([&] { (void)PagedKVCache::wrap(kf, kf, good, good); }, ErrorCode::invalid_argument,
               "k_scales");
  // Per tensor: a scale of one element each.
  const PagedKVCache ok = PagedKVCache::wrap(k, v, one, one);
  EXPECT_EQ(ok.spec().scales, KVScales::per_tensor);
  EXPECT_EQ(ok.tensor_scales().k, 0.5f);
}

// Pools and rows of the wrong dtype, scales for the wrong pages or of the wrong dtype, bad
// per-tensor scales: typed errors naming the argument.
TEST(PagedQuant, BadPoolsAndScaleTensorsAreTypedErrorsNamingThem) {
  const i64 P = 2, ps = 4, H = 2, D = 8;
  Tensor k(DType::i8, {P, ps, H, D}), v8(DType::fp8_e4m3, {P, ps, H, D});
  Tensor ks(DType::f32, {P, ps, H}), extra(DType::f32, {P + 1, ps, H});
  for (Tensor* t : {&ks, &extra})
    for (i64 i = 0; i < t->numel(); ++i) t->data_as<float>()[i] = 1.f;
  expect_error([&] { (void)PagedKVCache::wrap(k, v8, ks, ks); }, ErrorCode::unsupported_dtype, "v_pages");
  expect_error([&] { (void)PagedKVCache::wrap(k, k, extra, ks); }, ErrorCode::shape_mismatch, "k_scales");
  expect_error(
      [&] {
        (void)PagedKVCache::wrap(k, k, ks, Tensor(DType::f32, {P, ps, H + 1}));
      },
      ErrorCode::shape_mismatch, "v_scales");
  Tensor neg(DType::f32, {1}), half(DType::f16, {1});
  neg.data_as<float>()[0] = -0.5f;
  Tensor pos = Tensor::copy_of(neg);
  pos.data_as<float>()[0] = 0.5f;
  expect_error([&] { (void)PagedKVCache::wrap(k, k, neg, pos); }, ErrorCode::invalid_argument, "k_scales");
  expect_error([&] { (void)PagedKVCache::wrap(k, k, pos, half); }, ErrorCode::unsupported_dtype, "v_scales");
  for (float bad : {-1.f, NAN, INFINITY})
    expect_error(
        [&] {
          (void)PagedKVCache::host({P, ps, H, D, D, DType::i8, KVScales::per_tensor},
                                   KVTensorScales{bad, 1.f});
        },
        ErrorCode::invalid_argument, "k_scales");
  expect_error(
      [&] {
        (void)PagedKVCache::host({P, ps, H, D, D, DType::f32}, KVTensorScales{1.f, 1.f});
      },
      ErrorCode::invalid_argument, "tensor_scales");
  // Rows of codes are not rows to quantize.
  PagedKVCache cache = PagedKVCache::host({P, ps, H, D, D, DType::i8, KVScales::per_token});
  Tensor slots(DType::i32, {1});
  slots.data_as<std::int32_t>()[0] = 0;
  const Tensor rows = random_tensor(DType::f32, {1, H, D}, 3);
  expect_error(
      [&] {
        cache.write(Tensor(DType::i8, {1, H, D}), rows, slots);
      },
      ErrorCode::unsupported_dtype, "k_new");
}

TEST(PagedQuant, WriteOfNonFiniteRowsWritesNothing) {
  for (DType t : {DType::i8, DType::fp8_e4m3})
    for (KVScales kind : {KVScales::per_token, KVScales::per_tensor}) {
      PagedKVCache cache = PagedKVCache::host({2, 4, 2, 8, 8, t, kind});
      Tensor kn = random_tensor(DType::f32, {3, 2, 8}, 1), vn = random_tensor(DType::f32, {3, 2, 8}, 2);
      Tensor slots(DType::i32, {3});
      for (int i = 0; i < 3; ++i) slots.data_as<std::int32_t>()[i] = i;
      const Tensor k0 = Tensor::copy_of(cache.k_pages()), v0 = Tensor::copy_of(cache.v_pages());
      for (float bad : {NAN, INFINITY, -INFINITY}) {
        vn.data_as<float>()[2 * 16 + 8 + 3] = bad;  // row 2, head 1
        expect_error([&] { cache.write(kn, vn, slots); }, ErrorCode::invalid_argument,
                     "v_new: row 2, kv head 1");
        EXPECT_TRUE(same_bits(Tensor::copy_of(cache.k_pages()), k0));
        EXPECT_TRUE(same_bits(Tensor::copy_of(cache.v_pages()), v0));
      }
      // A skipped row (slot -1) may hold anything.
      slots.data_as<std::int32_t>()[2] = -1;
      cache.write(kn, vn, slots);
    }
}

TEST(PagedQuant, QueriesMustBeFloatAndTheRuntimeDtype) {
  PagedCaseSpec s;
  s.q_lens = {1};
  s.kv_lens = {10};
  s.kv_dtype = DType::i8;
  const PagedCase c = make_paged_case(s);
  const Attention attn = registry().get("paged");
  const Tensor qi(DType::i8, c.q.shape());
  expect_error([&] { (void)attn.paged(qi, c.cache, c.batch, c.options); }, ErrorCode::unsupported_dtype,
               "q: dtype int8");
  OperationMetadata md;
  md.runtime_dtype = DType::bf16;
  expect_error([&] { (void)registry().get("paged", md).paged(c.q, c.cache, c.batch, c.options); },
               ErrorCode::unsupported_dtype, "runtime_dtype bf16");
  // Any float q runs, and the output has its dtype.
  const Tensor qb = Tensor::copy_of(c.q, DType::bf16);
  EXPECT_EQ(attn.paged(qb, c.cache, c.batch, c.options).out.dtype(), DType::bf16);
}

}  // namespace
}  // namespace attnops::testing
