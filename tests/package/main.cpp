// The package test's consumer: a model program built against the installed package with the
// umbrella header alone. It makes the README's C++ calls (dense with options and per-call
// settings, explain, backward, a paged step with a plan that carries its options) and proves at
// compile time that the implementor types (attnops/ext/) are not visible through the umbrella
// header. ext_user.cpp is an operator author's translation unit: the ext headers are installed.
#include <attnops/attnops.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

// ---- what the umbrella header does not show ----------------------------------------------------
// A name declared both here and in attnops would make these uses ambiguous: the build fails the
// day the umbrella header shows an implementor type again.
namespace implementor_only {
struct AttentionProblem {};
struct BackwardProblem {};
struct PagedProblem {};
struct AttentionBuffers {};
struct GradientBuffers {};
struct PagedBuffers {};
}  // namespace implementor_only
namespace probe {
using namespace attnops;           // NOLINT(google-build-using-namespace)
using namespace implementor_only;  // NOLINT(google-build-using-namespace)
[[maybe_unused]] AttentionProblem* a = nullptr;
[[maybe_unused]] BackwardProblem* b = nullptr;
[[maybe_unused]] PagedProblem* c = nullptr;
[[maybe_unused]] AttentionBuffers* d = nullptr;
[[maybe_unused]] GradientBuffers* e = nullptr;
[[maybe_unused]] PagedBuffers* f = nullptr;
}  // namespace probe
// Opaque where a public class holds one: declared, never defined.
template <class T>
concept complete = requires {
  sizeof(T);
};
static_assert(!complete<attnops::OperationImpl>);
static_assert(!complete<attnops::PagedPlanData>);
static_assert(!complete<attnops::DeviceStorage>);
// Members that were implementation details are gone from the public classes.
template <class A>
concept shows_operators = requires(const A& a) {
  a.op();
}
|| requires(const A& a) {
  a.fallback();
};
template <class E>
concept shows_generation = requires(const E& e) {
  e.generation;
};
template <class P>
concept shows_plan_data = requires(const P& p) {
  p.data();
};
static_assert(!shows_operators<attnops::Attention>);
static_assert(!shows_generation<attnops::EnvironmentSettings>);
static_assert(!shows_plan_data<attnops::PagedPlan>);

// ext_user.cpp: an operator author's view of the same Attention.
std::string operator_name_via_ext(const attnops::Attention& attn);

#if defined(ATTNOPS_CONSUMER_CHECK_DRIVER_MAPPED)
#include <link.h>

// Whether lavapipe (the Vulkan driver the loader opens here) is mapped in this process.
bool vulkan_driver_mapped() {
  return dl_iterate_phdr(
             [](dl_phdr_info* info, std::size_t, void*) {
               const char* name = info->dlpi_name ? std::strrchr(info->dlpi_name, '/') : nullptr;
               return name && std::strcmp(name, "/libvulkan_lvp.so") == 0 ? 1 : 0;
             },
             nullptr) != 0;
}
#endif

int fail(const char* what) {
  std::printf("consumer: %s\n", what);
  return 1;
}

// Every value of v is 1, so every output is 1 (a convex combination of ones).
bool all_ones(const attnops::Tensor& t) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(t.numel()); ++i)
    if (t.at(i) < 0.999f || t.at(i) > 1.001f) return false;
  return true;
}

void fill(attnops::Tensor& q, attnops::Tensor& k, attnops::Tensor& v) {
  for (std::size_t i = 0; i < static_cast<std::size_t>(q.numel()); ++i)
    q.set(i, 0.01f * static_cast<float>(i % 13));
  for (std::size_t i = 0; i < static_cast<std::size_t>(k.numel()); ++i)
    k.set(i, 0.02f * static_cast<float>(i % 7));
  for (std::size_t i = 0; i < static_cast<std::size_t>(v.numel()); ++i) v.set(i, 1.0f);
}

int run_consumer() {
  using attnops::DType;
  // The README's dense calls.
  auto& reg = attnops::registry();
  auto attn = reg.get("flash_attn2");
  attnops::Tensor q(DType::f32, {1, 4, 2, 8}), k(DType::f32, {1, 4, 2, 8}), v(DType::f32, {1, 4, 2, 8});
  fill(q, k, v);
  attnops::AttentionOutput out = attn(q, k, v);
  if (!all_ones(out.out)) return fail("wrong output");
  out = attn(q, k, v, {.causal = true, .sliding_window = {{2, 0}}});
  if (!all_ones(out.out)) return fail("wrong windowed output");
  out = attn(q, k, v, {.softmax_scale = 0.1, .backends = {{attnops::Backend::cpu}}, .num_threads = 2});
  if (!all_ones(out.out) || out.decision.to_json().empty())
    return fail("wrong output with per-call settings");
  const attnops::DispatchDecision d = attn.explain(q, k, v, {.causal = true});
  if (d.requested != "flash_attn2") return fail("explain: wrong decision");
  if (attn.metadata().blocksize_q <= 0 || !attn.implements(attnops::Backend::native))
    return fail("the operator's metadata");
  // Training: the backward of a forward that kept its lse.
  attnops::AttentionOutput fwd = attn(q, k, v, {.causal = true, .return_lse = true});
  attnops::Tensor dout(DType::f32, {1, 4, 2, 8});
  for (std::size_t i = 0; i < 64; ++i) dout.set(i, 0.5f);
  attnops::AttentionGradients g = attn.backward(q, k, v, fwd, dout, {.causal = true});
  if (g.dq.numel() != 64 || g.dv.numel() != 64) return fail("backward: wrong gradients");

  // The README's serving step: a plan carries its options, a run takes tensors.
  auto cache =
      attnops::PagedKVCache::host({.num_pages = 4, .page_size = 4, .num_kv_heads = 1, .head_dim = 8});
  auto paged = reg.get("paged");
  attnops::PagedAttentionOptions opts{.sliding_window = {{5, 0}}, .return_lse = true};
  attnops::Tensor cu(DType::i32, {2}), kv_lens(DType::i32, {1}), table(DType::i32, {1, 2}),
      slots(DType::i32, {6});
  cu.data_as<std::int32_t>()[0] = 0, cu.data_as<std::int32_t>()[1] = 2;  // 2 new tokens of 6
  kv_lens.data_as<std::int32_t>()[0] = 6;
  table.data_as<std::int32_t>()[0] = 2, table.data_as<std::int32_t>()[1] = 0;
  for (std::int32_t t = 0; t < 6; ++t) slots.data_as<std::int32_t>()[t] = t < 4 ? 8 + t : t - 4;
  attnops::Tensor kn(DType::f32, {6, 1, 8}), vn(DType::f32, {6, 1, 8}), pq(DType::f32, {2, 2, 8});
  fill(pq, kn, vn);
  cache.write(kn, vn, slots);
  attnops::RaggedBatch batch{cu, kv_lens, table};
  attnops::PagedPlan plan = attnops::plan_paged(batch, cache.spec(), 2, /*Hq=*/2, opts);
  attnops::AttentionOutput o = paged.paged(pq, cache, plan);
  if (!all_ones(o.out) || !o.lse) return fail("paged: wrong output or no lse");
  if (paged.explain(pq, cache, plan).op != "ragged_paged") return fail("paged explain");

  if (operator_name_via_ext(attn) != "flash_attn2") return fail("ext: wrong operator");
  std::printf("consumer: %s ran as %s on %s\n", attn.name().c_str(), out.decision.op.c_str(),
              std::string(attnops::backend_name(out.decision.backend)).c_str());
  return 0;
}

// The GPU state is released before main returns (never from a static destructor: gpu.h).
int main() {
  const int status = run_consumer();
#if defined(ATTNOPS_CONSUMER_CHECK_DRIVER_MAPPED)
  // ASan build: a driver the loader opened must stay mapped until exit (keep_vulkan_loaded.cpp),
  // or LeakSanitizer reports its leaks as "<unknown module>", which no suppression can name.
  const bool mapped_during = vulkan_driver_mapped();
  attnops::release_gpu();
  if (mapped_during && !vulkan_driver_mapped()) {
    std::printf("consumer: the Vulkan driver was unloaded before exit (keep_vulkan_loaded.cpp missing)\n");
    return 1;
  }
#else
  attnops::release_gpu();
#endif
  return status;
}
