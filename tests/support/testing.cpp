#include "tests/support/testing.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>
#include <sstream>

#include "attnops/ext/problem.h"
#include "attnops/gpu.h"
#include "backends/native/reference.h"

#if defined(ATTNOPS_TEST_EMULATED_TIERS)
namespace attnops::cpu {
// The emulated builds of tests/CMakeLists.txt (attnops_cpu_<tier>_emulated).
namespace tier_avx512bf16_emulated {
const TierKernels& tier_kernels();
}
namespace tier_amx_emulated {
const TierKernels& tier_kernels();
}
}  // namespace attnops::cpu
#endif

namespace attnops::testing {

namespace {
// Every test program releases the GPU state after its last test, before main returns (gpu.h):
// nothing Vulkan runs from exit(). gtest runs the environment's TearDown after all tests.
class GpuRelease : public ::testing::Environment {
 public:
  void TearDown() override { release_gpu(); }
};
[[maybe_unused]] ::testing::Environment* const kGpuRelease =
    ::testing::AddGlobalTestEnvironment(new GpuRelease);
}  // namespace

int random_case_count(int n) {
  const char* env = std::getenv("ATTNOPS_TEST_RANDOM_CASES");
  if (env == nullptr || *env == '\0') return n;
  char* end = nullptr;
  const long cap = std::strtol(env, &end, 10);
  if (*end != '\0' || cap < 1) return n;  // not a positive count: every case
  return static_cast<int>(std::min<long>(n, cap));
}

Tolerance tolerance_for(DType t) {
  switch (t) {
    case DType::f16:
      return {2e-3, 1e-3};
    case DType::bf16:
      return {1.6e-2, 1e-3};
    default:
      return {2e-5, 1e-4};
  }
}

Tensor random_tensor(DType dtype, std::vector<std::int64_t> shape, std::uint64_t seed, float lo, float hi) {
  Tensor t(dtype, std::move(shape));
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(lo, hi);
  for (std::int64_t i = 0; i < t.numel(); ++i) t.set(static_cast<std::size_t>(i), u(rng));
  return t;
}

Tensor random_segments(std::int64_t B, std::int64_t T, std::uint64_t seed, std::int64_t max_run) {
  Tensor t(DType::i32, {B, T});
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<std::int64_t> run(1, std::max<std::int64_t>(1, max_run));
  for (std::int64_t b = 0; b < B; ++b) {
    std::int32_t id = 0;
    for (std::int64_t i = 0; i < T;) {
      const std::int64_t n = run(rng);
      for (std::int64_t k = 0; k < n && i < T; ++k, ++i) t.data_as<std::int32_t>()[b * T + i] = id;
      ++id;
    }
  }
  return t;
}

std::string Case::describe() const {
  std::ostringstream os;
  os << "B=" << B << " Tq=" << Tq << " Tk=" << Tk << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D
     << " Dv=" << Dv << " dtype=" << dtype_name(dtype) << " causal=" << options.causal;
  if (options.sliding_window)
    os << " window=(" << options.sliding_window->left << "," << options.sliding_window->right << ")";
  if (options.chunk_size) os << " chunk=" << *options.chunk_size;
  if (seg_q) os << " segments";
  if (bias) os << " bias" << shape_string(bias->shape());
  if (options.logits_soft_cap) os << " soft_cap=" << *options.logits_soft_cap;
  if (sinks) os << " sinks";
  if (options.mask) os << " mask=" << options.mask->key();
  return os.str();
}

Case make_case(const CaseSpec& s, std::uint64_t seed) {
  Case c;
  c.B = s.B, c.Tq = s.Tq, c.Tk = s.Tk, c.Hq = s.Hq, c.Hkv = s.Hkv, c.D = s.D, c.Dv = s.Dv < 0 ? s.D : s.Dv;
  c.dtype = s.dtype;
  c.q = random_tensor(s.dtype, {c.B, c.Tq, c.Hq, c.D}, seed * 7 + 1, -s.scale_inputs, s.scale_inputs);
  c.k = random_tensor(s.dtype, {c.B, c.Tk, c.Hkv, c.D}, seed * 7 + 2);
  c.v = random_tensor(s.dtype, {c.B, c.Tk, c.Hkv, c.Dv}, seed * 7 + 3);
  c.options.causal = s.causal;
  c.options.sliding_window = s.window;
  c.options.chunk_size = s.chunk;
  c.options.logits_soft_cap = s.soft_cap;
  c.options.mask = s.mask;
  c.options.return_lse = s.return_lse;
  if (s.segments) {
    // Independent runs for q and kv, so that some q rows match no kv segment (fully masked).
    c.seg_q = random_segments(c.B, c.Tq, seed * 7 + 4, 24);
    c.seg_kv = random_segments(c.B, c.Tk, seed * 7 + 5, 24);
    c.options.segment_ids_q = c.seg_q->view();
    c.options.segment_ids_kv = c.seg_kv->view();
  }
  if (s.bias) {
    c.bias = s.bias_broadcast ? random_tensor(DType::f32, {1, 1, c.Tq, c.Tk}, seed * 7 + 6, -2.f, 2.f)
                              : random_tensor(DType::f32, {c.B, c.Hq, c.Tq, c.Tk}, seed * 7 + 6, -2.f, 2.f);
    c.options.bias = c.bias->view();
  }
  if (s.sinks) {
    c.sinks = random_tensor(DType::f32, {c.Hq}, seed * 7 + 7, -2.f, 2.f);
    c.options.sinks = c.sinks->view();
  }
  return c;
}

AttentionProblem problem_for(const Case& c, std::int64_t bq, std::int64_t bk,
                             std::optional<DType> runtime_dtype) {
  OperationMetadata md;
  md.blocksize_q = bq;
  md.blocksize_k = bk;
  md.runtime_dtype = runtime_dtype;
  return make_problem(c.q, c.k, c.v, c.options, md);
}

Comparison compare_with_oracle(const AttentionProblem& p, const AttentionBuffers& got) {
  return compare_with_reference(p, native::reference_attention_f64(p, false), got);
}

Comparison compare_with_reference(const AttentionProblem& p, const native::ReferenceResult& ref,
                                  const AttentionBuffers& got) {
  Comparison r;
  for (std::size_t i = 0; i < ref.out.size(); ++i) {
    const double g = got.out.at(i);
    if (!std::isfinite(g)) r.out_finite = false;
    const double e = std::abs(g - ref.out[i]);
    if (!(e <= r.max_out_err)) {  // also catches NaN
      r.max_out_err = std::isnan(e) ? std::numeric_limits<double>::infinity() : e;
      const std::int64_t d = static_cast<std::int64_t>(i) % p.Dv, rest = static_cast<std::int64_t>(i) / p.Dv;
      const std::int64_t h = rest % p.Hq, bi = rest / p.Hq;
      std::ostringstream os;
      os << "out[b=" << bi / p.Tq << ", i=" << bi % p.Tq << ", h=" << h << ", d=" << d << "] = " << g
         << ", oracle " << ref.out[i];
      r.where = os.str();
    }
  }
  if (got.lse) {
    for (std::size_t i = 0; i < ref.lse.size(); ++i) {
      const double g = got.lse->data_as<float>()[i], e = ref.lse[i];
      const bool gi = std::isinf(g) && g < 0, ei = std::isinf(e) && e < 0;
      if (gi != ei || std::isnan(g)) {
        r.lse_inf_rows_match = false;
        continue;
      }
      if (!ei) r.max_lse_err = std::max(r.max_lse_err, std::abs(g - e));
    }
  }
  return r;
}

::testing::AssertionResult within_tolerance(const AttentionProblem& p, const AttentionBuffers& got,
                                            std::optional<Tolerance> tol) {
  return within_tolerance(p, native::reference_attention_f64(p, false), got, tol);
}

std::vector<cpu::Isa> cpu_tiers_to_test() {
  std::vector<cpu::Isa> tiers;
  const cpu::Isa top = cpu::choose_isa().tier;
  for (int i = 0; i <= static_cast<int>(top); ++i)
    if (cpu::isa_compiled(static_cast<cpu::Isa>(i))) tiers.push_back(static_cast<cpu::Isa>(i));
  return tiers;
}

std::string tier_label(cpu::Isa isa) {
  return "tier " + std::string(cpu::isa_name(isa));
}

std::vector<const cpu::TierKernels*> emulated_tier_tables() {
#if defined(ATTNOPS_TEST_EMULATED_TIERS)
  return {&cpu::tier_avx512bf16_emulated::tier_kernels(), &cpu::tier_amx_emulated::tier_kernels()};
#else
  return {};
#endif
}

std::vector<cpu::ForcedTier> cpu_kernel_tiers_to_test() {
  std::vector<cpu::ForcedTier> tiers;
  for (const cpu::Isa isa : cpu_tiers_to_test()) tiers.emplace_back(isa);
  const cpu::Isa top = cpu::choose_isa().tier;
  if (cpu::detect_isa().best >= cpu::Isa::avx2)
    for (const cpu::TierKernels* k : emulated_tier_tables())
      if (k->isa > top) tiers.emplace_back(*k);
  return tiers;
}

std::string tier_label(const cpu::ForcedTier& tier) {
  return tier_label(tier.isa) + (tier.table && tier.table->emulated ? " (emulated)" : "");
}

::testing::AssertionResult within_tolerance(const AttentionProblem& p, const native::ReferenceResult& ref,
                                            const AttentionBuffers& got, std::optional<Tolerance> tol) {
  const Tolerance t = tol.value_or(tolerance_for(p.dtype));
  const Comparison c = compare_with_reference(p, ref, got);
  if (c.out_finite && c.max_out_err <= t.out && c.lse_inf_rows_match && c.max_lse_err <= t.lse)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "max |out err| " << c.max_out_err << " (tol " << t.out << ") at " << c.where << "; max |lse err| "
         << c.max_lse_err << " (tol " << t.lse << "); -inf lse rows match: " << c.lse_inf_rows_match
         << "; out finite: " << c.out_finite;
}

}  // namespace attnops::testing
