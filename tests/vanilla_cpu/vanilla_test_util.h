// Helpers shared by the vanilla forward_cpu tests: run the kernel on a problem with a given
// thread count, and draw random case specs that cover every mask kind and feature.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>

#include "attnops/attnops.h"
#include "attnops/ext/problem.h"
#include "backends/cpu/vanilla_cpu.h"
#include "tests/support/testing.h"

namespace attnops::testing::vanilla {

// Runs cpu::vanilla_attention on p with `threads` OpenMP threads into fresh buffers, on the
// chosen ISA tier or on `tier`.
inline AttentionBuffers run_cpu(AttentionProblem& p, int threads,
                                std::optional<cpu::ForcedTier> tier = std::nullopt) {
  p.num_threads = threads;
  AttentionBuffers b = allocate_buffers(p);
  if (tier)
    cpu::vanilla_attention(p, b, *tier);
  else
    cpu::vanilla_attention(p, b);
  return b;
}

// Checks p on every tier of cpu_kernel_tiers_to_test() with each thread count, against the oracle
// computed once. `what` names the case in failure messages.
inline void expect_all_tiers_match(AttentionProblem& p, std::initializer_list<int> threads,
                                   const std::string& what) {
  const native::ReferenceResult ref = native::reference_attention_f64(p, false);
  for (const cpu::ForcedTier& tier : cpu_kernel_tiers_to_test())
    for (int t : threads)
      EXPECT_TRUE(within_tolerance(p, ref, run_cpu(p, t, tier)))
          << what << " threads=" << t << " " << tier_label(tier);
}

// A case spec with the given shape and no optional feature (set fields afterwards).
inline CaseSpec shape_spec(std::int64_t B, std::int64_t Tq, std::int64_t Tk, std::int64_t Hq,
                           std::int64_t Hkv, std::int64_t D, DType dtype, bool causal = true,
                           std::int64_t Dv = -1) {
  CaseSpec s;
  s.B = B, s.Tq = Tq, s.Tk = Tk, s.Hq = Hq, s.Hkv = Hkv, s.D = D, s.Dv = Dv, s.dtype = dtype,
  s.causal = causal;
  return s;
}

// The mask kinds a random case can take (each also combines with segments, bias, cap, sinks).
enum class MaskKind {
  causal,
  full,
  window,
  window_both,
  chunk,
  segments,
  per_head,
  and_mask,
  or_mask,
  all,
  count
};

inline std::string mask_kind_name(MaskKind k) {
  static const char* names[] = {"causal",   "full",     "window",   "window_both", "chunk",
                                "segments", "per_head", "and_mask", "or_mask",     "all"};
  return names[static_cast<int>(k)];
}

// Applies mask kind `k` to `s` (Hq already set), drawing its parameters from `rng`.
inline void apply_mask_kind(CaseSpec& s, MaskKind k, std::mt19937_64& rng) {
  auto pick = [&](std::int64_t lo, std::int64_t hi) {
    return std::uniform_int_distribution<std::int64_t>(lo, hi)(rng);
  };
  s.causal = true;
  switch (k) {
    case MaskKind::causal:
      break;
    case MaskKind::full:
      s.causal = false;
      break;
    case MaskKind::window:
      s.window = Window{pick(0, 40), 0};
      break;
    case MaskKind::window_both:
      s.causal = false;
      s.window = Window{pick(0, 30), pick(0, 30)};
      break;
    case MaskKind::chunk:
      s.chunk = pick(1, 48);
      break;
    case MaskKind::segments:
      s.causal = pick(0, 1) == 1;
      s.segments = true;
      break;
    case MaskKind::per_head: {
      s.causal = false;
      std::vector<Mask> heads;
      for (std::int64_t h = 0; h < s.Hq; ++h) {
        switch (pick(0, 3)) {
          case 0:
            heads.push_back(Mask::causal());
            break;
          case 1:
            heads.push_back(Mask::local(pick(0, 20), pick(0, 5)));
            break;
          case 2:
            heads.push_back(Mask::chunked_causal(pick(1, 32)));
            break;
          default:
            heads.push_back(Mask::full());
            break;
        }
      }
      s.mask = Mask::per_head(std::move(heads));
      break;
    }
    case MaskKind::and_mask:
      s.causal = false;
      s.mask = Mask::local(pick(0, 40), pick(0, 10)) & Mask::chunked_causal(pick(4, 40));
      break;
    case MaskKind::or_mask:
      s.causal = false;
      s.mask = Mask::local(pick(0, 8), 0) | Mask::chunked_causal(pick(4, 40));
      break;
    case MaskKind::all:
      s.window = Window{pick(5, 60), 0};
      s.chunk = pick(8, 64);
      s.segments = true;
      break;
    case MaskKind::count:
      break;
  }
}

// Optional features (soft cap, sinks, bias full or broadcast), each with probability ~1/2.
inline void apply_random_features(CaseSpec& s, std::mt19937_64& rng) {
  auto coin = [&] { return std::uniform_int_distribution<int>(0, 1)(rng) == 1; };
  if (coin()) s.soft_cap = std::uniform_real_distribution<double>(0.5, 5.0)(rng);
  s.sinks = coin();
  if (coin()) {
    s.bias = true;
    s.bias_broadcast = coin();
  }
}

// Shrinks Tq / Tk until the fp64 oracle's work (B Hq Tq Tk (D + Dv)) fits `budget`, so the suite
// stays fast at D = 256.
inline void fit_budget(CaseSpec& s, double budget, std::int64_t min_tq) {
  auto cost = [&] {
    return static_cast<double>(s.B * s.Hq * s.Tq * s.Tk) * static_cast<double>(s.D + (s.Dv < 0 ? s.D : s.Dv));
  };
  while (cost() > budget && (s.Tq > min_tq || s.Tk > 8)) {
    if (s.Tq > min_tq) s.Tq = std::max(min_tq, s.Tq * 3 / 4);
    if (s.Tk > 8) s.Tk = std::max<std::int64_t>(8, s.Tk * 3 / 4);
  }
}

}  // namespace attnops::testing::vanilla
