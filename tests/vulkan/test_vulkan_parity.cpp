// run() of vanilla / flash / blocksparse against the fp64 oracle, over a grid of small shapes
// sized for lavapipe: odd lengths with Tq != Tk, head dims 1 .. 512 (not powers of two too), GQA
// ratios 1 .. 16, every mask kind (causal, window, chunk, per-head and | masks that take the
// bitset path, segments), bias, soft cap, sinks, fully masked rows, f32 / f16 / bf16. The
// variants are those the selection takes on the device (on lavapipe: flash_subgroup in its CPU
// shape, vanilla_gemm, split-KV for decode shapes); test_vulkan_kernels.cpp forces the others.
#include <cmath>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "attnops/ext/problem.h"
#include "backends/common/block_map.h"
#include "backends/native/reference.h"
#include "tests/support/testing.h"
#include "tests/vulkan/vulkan_fixture.h"

namespace attnops::testing {
namespace {

using vulkan::Kernel;

const char* kernel_name(Kernel k) {
  return k == Kernel::vanilla ? "vanilla" : k == Kernel::flash ? "flash" : "blocksparse";
}

// Runs `kernel` on the case's problem as the operators do (the tiled ones pass the block map at
// the problem's CPU block sizes) and compares with the oracle.
void expect_parity(Kernel kernel, const Case& c, const std::string& label) {
  SCOPED_TRACE(label + " " + kernel_name(kernel) + ": " + c.describe());
  const AttentionProblem p = problem_for(c);
  AttentionBuffers b = allocate_buffers(p);
  std::shared_ptr<const BlockMap> map;
  if (kernel != Kernel::vanilla) map = get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k);
  vulkan::run(kernel, p, map.get(), software_ok(), b);
  EXPECT_TRUE(within_tolerance(p, b));
  if (b.weights) {
    const native::ReferenceResult ref = native::reference_attention_f64(p, true);
    double worst = 0;
    for (std::size_t i = 0; i < ref.weights.size(); ++i)
      worst = std::max(worst, std::abs(ref.weights[i] - static_cast<double>(b.weights->data_as<float>()[i])));
    EXPECT_LT(worst, 2e-5) << "max |weights - oracle|";
  }
}

void expect_parity_all_kernels(const Case& c, const std::string& label) {
  for (Kernel k : {Kernel::vanilla, Kernel::flash, Kernel::blocksparse}) expect_parity(k, c, label);
}

// A per-head mask whose heads differ (one causal, one local, ...): takes the bitset path.
Mask mixed_per_head(std::int64_t Hq) {
  std::vector<Mask> heads;
  for (std::int64_t h = 0; h < Hq; ++h)
    heads.push_back(h % 3 == 0 ? Mask::causal() : h % 3 == 1 ? Mask::local(4, 1) : Mask::chunked_causal(5));
  return Mask::per_head(std::move(heads));
}

using VulkanParity = VulkanTest;

TEST_F(VulkanParity, HeadDims) {
  // The parity grid's head dims; the tiled kernels pad them inside (up to 512).
  const std::int64_t dims[] = {1, 40, 64, 80, 96, 112, 128, 192, 256, 512};
  std::uint64_t seed = 100;
  for (std::int64_t D : dims) {
    for (bool causal : {true, false}) {
      Case c = make_case(Spec().shape(1, 19, 27).heads(2, 1).dim(D).causal(causal), ++seed);
      expect_parity_all_kernels(c, "D=" + std::to_string(D));
    }
  }
  // Dv != D.
  expect_parity_all_kernels(make_case(Spec().shape(1, 11, 29).heads(2, 2).dim(40, 24), 1), "Dv<D");
  expect_parity_all_kernels(make_case(Spec().shape(1, 11, 29).heads(2, 2).dim(96, 136), 2), "Dv>D");
}

TEST_F(VulkanParity, ShapesAndGqa) {
  struct Shape {
    std::int64_t B, Tq, Tk;
  };
  const Shape shapes[] = {{1, 1, 37}, {2, 17, 45}, {1, 45, 17}, {2, 33, 33}, {1, 70, 101}, {1, 1, 1}};
  // GQA ratios 1, 2, 4, 8, 16.
  const std::pair<std::int64_t, std::int64_t> heads[] = {{1, 1}, {2, 1}, {4, 1}, {8, 1},
                                                         {4, 2}, {8, 4}, {16, 1}};
  std::uint64_t seed = 200;
  for (const Shape& s : shapes)
    for (const auto& [Hq, Hkv] : heads) {
      const bool causal = (seed % 2) == 0;
      Case c = make_case(Spec().shape(s.B, s.Tq, s.Tk).heads(Hq, Hkv).dim(40).causal(causal), ++seed);
      expect_parity_all_kernels(c, "shape");
    }
}

TEST_F(VulkanParity, Masks) {
  std::uint64_t seed = 300;
  const auto run = [&](Spec spec, const std::string& label) {
    spec.heads(4, 2).dim(80);
    for (auto [Tq, Tk] : {std::pair<std::int64_t, std::int64_t>{37, 53}, {53, 37}, {64, 64}}) {
      spec.shape(2, Tq, Tk);
      expect_parity_all_kernels(make_case(spec, ++seed), label);
    }
  };
  run(Spec().causal(true), "causal");
  run(Spec().causal(false), "full");
  run(Spec().causal(false).window(8, 3), "window(8,3)");
  run(Spec().causal(true).window(5, 0), "causal+window(5,0)");
  run(Spec().causal(false).window(0, 0), "window(0,0)");
  run(Spec().causal(true).chunk(7), "chunk(7)");
  run(Spec().causal(true).window(9, 0).chunk(16), "causal+window+chunk");
  run(Spec().causal(false).mask(Mask::causal() | Mask::local(2, 6)), "any_of");
  run(Spec().causal(false).mask(mixed_per_head(4)), "per_head");
  run(Spec().causal(true).mask(
          Mask::per_head({Mask::local(3, 0), Mask::local(3, 0), Mask::local(3, 0), Mask::local(3, 0)})),
      "per_head(equal)");
  run(Spec().causal(false).window(1000000, 1000000).chunk(1000000), "huge bounds");
}

TEST_F(VulkanParity, SegmentsBiasSoftCapSinks) {
  std::uint64_t seed = 400;
  const auto run = [&](Spec spec, const std::string& label) {
    spec.shape(2, 41, 59).heads(4, 1).dim(112);
    expect_parity_all_kernels(make_case(spec, ++seed), label);
  };
  run(Spec().causal(true).segments(), "segments causal");
  run(Spec().causal(false).segments(), "segments");
  run(Spec().causal(true).bias(), "bias");
  run(Spec().causal(false).bias(true), "bias broadcast");
  run(Spec().causal(true).soft_cap(3.0), "soft cap");
  run(Spec().causal(false).soft_cap(0.5).scale_inputs(8.f), "soft cap, large logits");
  run(Spec().causal(true).sinks(), "sinks");
  run(Spec().causal(true).window(6, 0).segments().bias().soft_cap(20.0).sinks(), "everything");
  run(Spec().causal(false).scale_inputs(12.f), "large logits");
}

TEST_F(VulkanParity, FullyMaskedRows) {
  std::uint64_t seed = 500;
  // Tq > Tk with causal: the first Tq - Tk queries see nothing (bottom-right alignment).
  expect_parity_all_kernels(make_case(Spec().shape(1, 45, 13).heads(2, 1).dim(40).causal(true), ++seed),
                            "Tq>Tk causal");
  expect_parity_all_kernels(
      make_case(Spec().shape(1, 45, 13).heads(2, 1).dim(40).causal(true).sinks(), ++seed),
      "Tq>Tk causal + sinks");
  expect_parity_all_kernels(
      make_case(Spec().shape(1, 40, 9).heads(2, 2).dim(64).causal(false).window(2, 0), ++seed),
      "Tq>Tk window");
  // Every row masked: the whole output 0, lse -inf (checked by within_tolerance), no NaN.
  Case c = make_case(Spec().shape(1, 5, 3).dim(8).causal(true).chunk(2), ++seed);
  for (Kernel k : {Kernel::vanilla, Kernel::flash}) {
    const AttentionProblem p = problem_for(c);
    AttentionBuffers b = allocate_buffers(p);
    vulkan::run(k, p, nullptr, software_ok(), b);
    EXPECT_TRUE(within_tolerance(p, b));
    for (std::int64_t i = 0; i < b.out.numel(); ++i)
      EXPECT_FALSE(std::isnan(b.out.at(static_cast<std::size_t>(i))));
  }
}

TEST_F(VulkanParity, Dtypes) {
  std::uint64_t seed = 600;
  for (DType t : {DType::f16, DType::bf16})
    for (std::int64_t D : {1, 40, 96, 128, 256}) {
      Spec spec = Spec().shape(2, 23, 31).heads(4, 2).dim(D).dtype(t).causal(D % 3 != 0);
      if (D == 96) spec.window(7, 2);
      if (D == 40) spec.bias();
      if (D == 128) spec.soft_cap(4.0);
      if (D == 256) spec.sinks();
      expect_parity_all_kernels(make_case(spec, ++seed), std::string(dtype_name(t)));
    }
  // Odd head dim with 16-bit storage: rows start in the middle of a 32-bit word.
  expect_parity_all_kernels(make_case(Spec().shape(1, 7, 9).heads(3, 1).dim(5).dtype(DType::f16), ++seed),
                            "f16 D=5");
}

TEST_F(VulkanParity, VanillaWeights) {
  std::uint64_t seed = 700;
  for (DType t : {DType::f32, DType::f16}) {
    Case c = make_case(Spec().shape(2, 21, 34).heads(4, 2).dim(40).dtype(t).causal(true).segments().sinks(),
                       ++seed);
    c.options.return_weights = true;
    expect_parity(Kernel::vanilla, c, "weights");
  }
}

TEST_F(VulkanParity, LongerSequences) {
  // Many kv tiles per row: the online softmax rescales across tiles; large logits stress it.
  expect_parity_all_kernels(make_case(Spec().shape(1, 300, 257).heads(2, 1).dim(64).causal(true), 901),
                            "causal");
  expect_parity_all_kernels(
      make_case(Spec().shape(1, 200, 333).heads(2, 2).dim(80).causal(false).scale_inputs(6.f), 902), "full");
  expect_parity_all_kernels(
      make_case(Spec().shape(1, 256, 256).heads(2, 1).dim(48).causal(true).window(70, 0).segments(), 903),
      "window");
}

// Random combinations beyond the hand-picked grids (deterministic seeds, so a failure repeats).
// ATTNOPS_VK_FUZZ_CASES / ATTNOPS_VK_FUZZ_SEED run more or other cases (default 40 / 20261122).
TEST_F(VulkanParity, RandomCombinations) {
  const char* cases_env = std::getenv("ATTNOPS_VK_FUZZ_CASES");
  const char* seed_env = std::getenv("ATTNOPS_VK_FUZZ_SEED");
  const int cases = cases_env ? std::atoi(cases_env) : 40;
  std::mt19937_64 rng(seed_env ? std::strtoull(seed_env, nullptr, 10) : 20261122ull);
  const auto pick = [&](auto... values) {
    const std::int64_t v[] = {static_cast<std::int64_t>(values)...};
    return v[rng() % sizeof...(values)];
  };
  const auto coin = [&](int percent) { return static_cast<int>(rng() % 100) < percent; };
  for (int n = 0; n < cases; ++n) {
    Spec spec;
    const std::int64_t Hkv = pick(1, 2), group = pick(1, 2, 4);
    spec.shape(pick(1, 2), 1 + static_cast<std::int64_t>(rng() % 80),
               1 + static_cast<std::int64_t>(rng() % 80))
        .heads(Hkv * group, Hkv);
    const std::int64_t D = pick(1, 7, 16, 40, 64, 80, 96, 112, 128);
    spec.dim(D, coin(25) ? pick(8, 24, 40, 72) : -1);
    spec.dtype(static_cast<DType>(pick(0, 1, 2)));  // f32, f16, bf16
    spec.causal(coin(60));
    if (coin(30)) spec.window(pick(0, 3, 17), pick(0, 2, 40));
    if (coin(20)) spec.chunk(pick(1, 5, 32));
    if (coin(30)) spec.segments();
    if (coin(30)) spec.bias(coin(50));
    if (coin(25)) spec.soft_cap(pick(1, 5, 30));
    if (coin(30)) spec.sinks();
    if (coin(15))
      spec.mask(coin(50) ? Mask::local(3, 3) | Mask::chunked_causal(9) : mixed_per_head(Hkv * group));
    expect_parity_all_kernels(make_case(spec, 1000 + static_cast<std::uint64_t>(n)),
                              "random #" + std::to_string(n));
  }
}

TEST_F(VulkanParity, StridedInputs) {
  // k and v as views into larger tensors (a KV cache slice): their outer strides are not packed.
  Case c = make_case(Spec().shape(2, 13, 21).heads(4, 2).dim(40), 800);
  Tensor kbig = random_tensor(DType::f32, {2, 40, 2, 40}, 801);
  Tensor vbig = random_tensor(DType::f32, {2, 40, 2, 40}, 802);
  const TensorView k = kbig.view().slice(1, 5, 26);
  const TensorView v = vbig.view().slice(1, 10, 31);
  AttentionProblem p = make_problem(c.q, k, v, c.options, OperationMetadata{});
  for (Kernel kernel : {Kernel::vanilla, Kernel::flash}) {
    AttentionBuffers b = allocate_buffers(p);
    vulkan::run(kernel, p, nullptr, software_ok(), b);
    EXPECT_TRUE(within_tolerance(p, b)) << kernel_name(kernel);
  }
}

}  // namespace
}  // namespace attnops::testing
