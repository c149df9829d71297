// Launch plan of vanilla's GEMM path (vk_launch.h): scores, row softmax, P V.
#include "attnops/ext/problem.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_launch.h"

namespace attnops::vulkan {

LaunchPlan plan_vanilla_gemm(const AttentionProblem& p, const Selection& s, const PushConstants& base) {
  LaunchPlan plan;
  const std::uint32_t dt = dtype_code(p.dtype);
  const std::uint32_t B = static_cast<std::uint32_t>(p.B), Hq = static_cast<std::uint32_t>(p.Hq);
  const std::uint32_t nq = static_cast<std::uint32_t>(base.nq);
  const std::uint32_t ncol = static_cast<std::uint32_t>((p.Dv + s.gemm.tn - 1) / s.gemm.tn);
  // Scores [B, Hq, Tq, Tk] f32: the weights after the softmax pass.
  plan.scratch_bytes = static_cast<std::uint64_t>(p.B * p.Hq * p.Tq * p.Tk) * 4u;
  KernelStep scores;
  scores.key.shader = rt::ShaderId::vanilla_scores;
  scores.key.spec = {dt};
  scores.key.spec_count = 1;
  scores.label = "vanilla_scores";
  scores.push = base;
  scores.groups = {nq, Hq, B};
  KernelStep softmax;
  softmax.key.shader = rt::ShaderId::vanilla_softmax;
  softmax.label = "vanilla_softmax";
  softmax.push = base;
  softmax.groups = {static_cast<std::uint32_t>(p.Tq), Hq, B};
  KernelStep pv;
  pv.key.shader = rt::ShaderId::vanilla_pv;
  pv.key.spec = {dt};
  pv.key.spec_count = 1;
  pv.label = "vanilla_pv";
  pv.push = base;
  pv.groups = {nq * ncol, Hq, B};
  plan.steps = {scores, softmax, pv};
  return plan;
}

}  // namespace attnops::vulkan
