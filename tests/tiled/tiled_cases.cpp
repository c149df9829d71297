#include "tests/tiled/tiled_cases.h"

#include <algorithm>
#include <random>

namespace attnops::tiled_test {
namespace {

// A per-head mask for Hq heads cycling through the four mask kinds.
Mask per_head_mask(std::int64_t Hq) {
  std::vector<Mask> heads;
  for (std::int64_t h = 0; h < Hq; ++h) {
    switch (h % 4) {
      case 0:
        heads.push_back(Mask::causal());
        break;
      case 1:
        heads.push_back(Mask::full());
        break;
      case 2:
        heads.push_back(Mask::local(17 + h, 3));
        break;
      default:
        heads.push_back(Mask::chunked_causal(29 + h));
        break;
    }
  }
  return Mask::per_head(std::move(heads));
}

}  // namespace

std::vector<KernelCase> explicit_cases() {
  using testing::CaseSpec;
  std::vector<KernelCase> v;
  // Shape first, then the features a case exercises (designated initialisers would leave
  // CaseSpec's optionals to -Wmissing-field-initializers).
  auto shape = [](std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                  std::int64_t D) {
    CaseSpec s;
    s.B = B, s.Tq = Tq, s.Tk = Tk, s.Hq = Hq, s.Hkv = Hkv, s.D = D;
    return s;
  };
  auto add = [&](std::string name, CaseSpec s, std::int64_t bq, std::int64_t bk, auto&& features) {
    features(s);
    v.push_back({std::move(name), s, bq, bk, v.size() + 101});
  };
  auto none = [](CaseSpec&) {};
  add("causal_square", shape(1, 128, 128, 2, 2, 64), 64, 64, none);
  add("full_TqGtTk", shape(1, 100, 37, 2, 1, 80), 32, 16, [](CaseSpec& s) { s.causal = false; });
  add("window_noncausal", shape(1, 150, 150, 1, 1, 96), 64, 32, [](CaseSpec& s) {
    s.causal = false;
    s.window = Window{20, 5};
  });
  add("window_causal", shape(1, 150, 170, 1, 1, 72), 48, 64, [](CaseSpec& s) { s.window = Window{33, 0}; });
  add("chunked", shape(1, 200, 200, 1, 1, 112), 64, 32, [](CaseSpec& s) { s.chunk = 48; });
  add("segments", shape(2, 180, 180, 2, 1, 40), 64, 64, [](CaseSpec& s) { s.segments = true; });
  add("segments_noncausal", shape(3, 70, 90, 1, 1, 24), 32, 32, [](CaseSpec& s) {
    s.causal = false;
    s.segments = true;
  });
  add("bias_full", shape(2, 77, 91, 2, 1, 32), 32, 64, [](CaseSpec& s) {
    s.causal = false;
    s.bias = true;
  });
  add("bias_broadcast", shape(2, 77, 91, 2, 1, 32), 64, 32, [](CaseSpec& s) {
    s.bias = true;
    s.bias_broadcast = true;
  });
  add("soft_cap", shape(1, 90, 90, 1, 1, 64), 32, 32, [](CaseSpec& s) {
    s.soft_cap = 5.0;
    s.scale_inputs = 4.f;
  });
  add("sinks", shape(1, 90, 120, 4, 2, 48), 32, 64, [](CaseSpec& s) { s.sinks = true; });
  add("sinks_fully_masked_rows", shape(1, 90, 30, 2, 1, 16), 32, 16, [](CaseSpec& s) { s.sinks = true; });
  add("all_features_f16", shape(2, 133, 150, 4, 2, 80), 64, 48, [](CaseSpec& s) {
    s.dtype = DType::f16;
    s.window = Window{60, 10};
    s.segments = s.bias = s.sinks = true;
    s.soft_cap = 20.0;
  });
  add("all_features_bf16", shape(2, 133, 150, 4, 1, 96), 32, 64, [](CaseSpec& s) {
    s.dtype = DType::bf16;
    s.chunk = 40;
    s.segments = s.bias = s.bias_broadcast = s.sinks = true;
    s.soft_cap = 30.0;
  });
  for (std::int64_t D : {1, 8, 40, 64, 80, 96, 112, 128, 192, 256, 512})
    add("head_dim_" + std::to_string(D), shape(1, 45, 61, 2, 1, D), 32, 32, none);
  add("dv_smaller", shape(1, 50, 70, 1, 1, 64), 32, 32, [](CaseSpec& s) { s.Dv = 40; });
  add("dv_larger", shape(1, 50, 70, 1, 1, 40), 16, 64, [](CaseSpec& s) {
    s.Dv = 128;
    s.causal = false;
  });
  for (std::int64_t g : {2, 4, 8, 16})
    add("gqa_" + std::to_string(g), shape(1, 40, 64, 16, 16 / g, 32), 16, 32, none);
  add("tq_gt_tk_causal", shape(1, 90, 30, 1, 1, 32), 32, 32, none);
  // V rows >= 4 KiB apart in place (Hkv * Dv * 4 bytes): the AVX2 tier reads V^T tiles
  // (tiled_common.h, transposes_v); Dv and the last tile's keys not multiples of 8 (the
  // transpose's scalar edges).
  add("v_rows_4k_apart", shape(1, 77, 133, 16, 16, 40), 32, 48, [](CaseSpec& s) { s.Dv = 68; });
  add("v_rows_8k_apart_window_sinks", shape(1, 90, 100, 32, 16, 128), 64, 37, [](CaseSpec& s) {
    s.causal = false;
    s.window = Window{40, 9};
    s.sinks = true;
  });
  add("decode_row", shape(1, 1, 300, 8, 2, 64), 128, 128, none);
  add("single_key", shape(1, 20, 1, 1, 1, 16), 8, 8, [](CaseSpec& s) { s.causal = false; });
  add("prefill_after_cache", shape(1, 50, 600, 2, 1, 64), 64, 128, none);
  add("window_rows_empty", shape(1, 40, 20, 1, 1, 16), 16, 16, [](CaseSpec& s) {
    s.causal = false;
    s.window = Window{0, 0};
  });
  add("large_causal_f32", shape(1, 700, 700, 2, 1, 64), 128, 128, none);
  add("large_noncausal_bf16", shape(1, 640, 700, 1, 1, 128), 64, 128, [](CaseSpec& s) {
    s.dtype = DType::bf16;
    s.causal = false;
  });
  add("large_window_f16", shape(1, 700, 700, 2, 2, 80), 96, 80, [](CaseSpec& s) {
    s.dtype = DType::f16;
    s.window = Window{100, 0};
  });
  add("online_softmax_stress", shape(1, 200, 300, 1, 1, 64), 32, 32, [](CaseSpec& s) {
    s.causal = false;
    s.scale_inputs = 12.f;
  });
  add("per_head_mask", shape(1, 100, 100, 4, 2, 32), 32, 32, [](CaseSpec& s) {
    s.causal = false;
    s.mask = per_head_mask(4);
  });
  add("and_or_mask", shape(1, 100, 120, 1, 1, 32), 16, 48, [](CaseSpec& s) {
    s.causal = false;
    s.mask = (Mask::local(10, 2) & Mask::causal()) | Mask::chunked_causal(37);
  });
  for (auto [bq, bk] : {std::pair<std::int64_t, std::int64_t>{1, 1},
                        {17, 23},
                        {96, 80},
                        {256, 256},
                        {128, 32},
                        {7, 200},
                        {200, 7},
                        {48, 112}})
    add("blocks_" + std::to_string(bq) + "x" + std::to_string(bk), shape(1, 150, 160, 2, 1, 40), bq, bk,
        [](CaseSpec& s) {
          s.window = Window{70, 3};
          s.segments = true;
        });
  return v;
}

std::vector<KernelCase> random_cases(int count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  auto pick = [&](auto const& list) {
    return list[std::uniform_int_distribution<std::size_t>(0, list.size() - 1)(rng)];
  };
  auto chance = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  auto uniform = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  const std::vector<std::int64_t> dims = {1, 8, 40, 64, 80, 96, 112, 128, 192, 256, 512};
  const std::vector<std::int64_t> groups = {1, 2, 4, 8, 16};
  const std::vector<std::pair<std::int64_t, std::int64_t>> blocks = {
      {128, 128}, {64, 64}, {32, 48}, {17, 23}, {64, 128}, {128, 32}, {16, 16}, {96, 80}};
  const std::vector<DType> dtypes = {DType::f32, DType::f32, DType::f16, DType::bf16};
  // Oracle cost bound per case: B * Hq * Tq * Tk * (D + Dv) multiply-adds.
  constexpr double kBudget = 1.5e7;
  std::vector<KernelCase> v;
  for (int n = 0; n < count; ++n) {
    testing::CaseSpec s;
    s.dtype = pick(dtypes);
    s.D = pick(dims);
    s.Dv = chance(0.2) ? pick(dims) : s.D;
    const std::int64_t g = pick(groups);
    s.Hkv = uniform(1, 2);
    s.Hq = s.Hkv * g;
    s.B = uniform(1, 3);
    const double per_pair = static_cast<double>(s.B * s.Hq * (s.D + (s.Dv < 0 ? s.D : s.Dv)));
    const auto tmax = static_cast<std::int64_t>(std::min(700.0, std::sqrt(kBudget / per_pair)));
    s.Tq = uniform(1, std::max<std::int64_t>(1, tmax));
    s.Tk = chance(0.5) ? s.Tq : uniform(1, std::max<std::int64_t>(1, tmax));
    s.causal = chance(0.6);
    if (chance(0.25)) s.window = Window{uniform(0, 80), chance(0.5) ? 0 : uniform(0, 40)};
    if (chance(0.15)) s.chunk = uniform(1, 100);
    if (chance(0.1))
      s.mask = per_head_mask(s.Hq);
    else if (chance(0.1))
      s.mask = Mask::local(uniform(0, 30), uniform(0, 30)) | Mask::chunked_causal(uniform(5, 60));
    s.segments = chance(0.25);
    s.bias = chance(0.2);
    s.bias_broadcast = s.bias && chance(0.5);
    if (chance(0.2)) s.soft_cap = static_cast<double>(uniform(1, 50));
    s.sinks = chance(0.2);
    s.scale_inputs = chance(0.2) ? 6.f : 1.f;
    const auto [bq, bk] = pick(blocks);
    std::string name = "r";  // (not "r" + to_string: GCC 12 warns -Wrestrict on it, bug 105651)
    name += std::to_string(n);
    v.push_back({std::move(name), s, bq, bk, seed + static_cast<std::uint64_t>(n)});
  }
  return v;
}

}  // namespace attnops::tiled_test
