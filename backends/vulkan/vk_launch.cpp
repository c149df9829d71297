// Launch plans of the flash variants, and what every plan shares (vk_launch.h).
#include "backends/vulkan/vk_launch.h"

#include <algorithm>

#include "attnops/error.h"

namespace attnops::vulkan {

namespace {

std::int32_t clip32(std::int64_t v, std::int64_t hi) {
  return static_cast<std::int32_t>(std::min(v, hi));
}

std::uint32_t ceil_div(std::int64_t a, std::int64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

}  // namespace

std::uint32_t dtype_code(DType t) {
  return t == DType::f32 ? 0u : t == DType::f16 ? 1u : 2u;
}

MapTile map_tile(const Selection& s) {
  switch (s.variant) {
    case Variant::flash_subgroup:
      return {s.subgroup.q_rows, s.subgroup.bc};
    case Variant::flash_coopmat_khr:
    case Variant::flash_coopmat_nv:
      return {s.coop.q_rows, s.coop.bc};
    case Variant::vanilla_gemm:
      return {s.gemm.tm, s.gemm.tn};
    case Variant::flash_rowwise:
      break;
  }
  return {kBlockQ, kBlockK};
}

PushConstants base_push(const AttentionProblem& p, const TilePlan& plan) {
  const BlockMap& bm = *plan.map;
  PushConstants pc{};
  pc.B = static_cast<std::int32_t>(p.B);
  pc.Tq = static_cast<std::int32_t>(p.Tq);
  pc.Tk = static_cast<std::int32_t>(p.Tk);
  pc.Hq = static_cast<std::int32_t>(p.Hq);
  pc.Hkv = static_cast<std::int32_t>(p.Hkv);
  pc.D = static_cast<std::int32_t>(p.D);
  pc.Dv = static_cast<std::int32_t>(p.Dv);
  pc.scale = static_cast<float>(p.scale);
  pc.soft_cap = p.soft_cap ? static_cast<float>(*p.soft_cap) : 0.f;
  pc.win_left = pc.win_right = -1;
  if (plan.param) {
    // Bounds past the sequence act like no bound; clipping keeps the shader's int math exact.
    const std::int64_t span = p.Tq + p.Tk;
    pc.flags |= kParamMask | (plan.param->causal ? kCausal : 0u);
    if (plan.param->left >= 0) pc.win_left = clip32(plan.param->left, span);
    if (plan.param->right >= 0) pc.win_right = clip32(plan.param->right, span);
    if (plan.param->chunk > 0) pc.chunk = clip32(plan.param->chunk, std::max<std::int64_t>(p.Tk, 1));
  }
  if (p.has_segments()) pc.flags |= kSegments;
  if (p.bias) pc.flags |= kBias;
  if (p.sinks) pc.flags |= kSinks;
  if (p.want_lse) pc.flags |= kLse;
  if (p.soft_cap) pc.flags |= kSoftCap;
  // Rows of whole 16-byte vectors start 16-byte aligned in the packed buffers; rows of whole
  // 4-element groups start 4-element aligned.
  const std::size_t es = dtype_size(p.dtype);
  if ((static_cast<std::size_t>(p.D) * es) % 16 == 0 && (static_cast<std::size_t>(p.Dv) * es) % 16 == 0)
    pc.flags |= kVec;
  if (p.D % 4 == 0 && p.Dv % 4 == 0) pc.flags |= kAligned4;
  pc.bias_stride_b = static_cast<std::uint32_t>(p.bias_stride_b);
  pc.bias_stride_h = static_cast<std::uint32_t>(p.bias_stride_h);
  pc.map_heads = static_cast<std::int32_t>(bm.heads);
  pc.nq = static_cast<std::int32_t>(bm.nq);
  pc.words_per_row = static_cast<std::int32_t>(bm.words_per_row * 2);  // uint64 -> uint words
  pc.q_rows = static_cast<std::int32_t>(bm.bq);
  pc.head_rows = 1;
  pc.nsplit = 1;
  pc.kv_block = static_cast<std::int32_t>(bm.bk);
  return pc;
}

LaunchPlan plan_flash(const AttentionProblem& p, const Selection& s, const PushConstants& base) {
  LaunchPlan plan;
  const std::uint32_t dt = dtype_code(p.dtype);
  const std::uint32_t B = static_cast<std::uint32_t>(p.B), Hq = static_cast<std::uint32_t>(p.Hq);
  KernelStep step;
  step.push = base;
  switch (s.variant) {
    case Variant::flash_subgroup: {
      const SubgroupTiles& t = s.subgroup;
      const std::uint32_t split = t.nsplit > 1 ? 1u : 0u;
      step.key.shader = ShaderId::flash_tiled;
      const std::uint32_t aligned = p.D % 4 == 0 && p.Dv % 4 == 0 ? 1u : 0u;
      step.key.spec = {t.wg,   dt, t.ds, t.rpt, t.bc, t.dk4, t.dv4, split, t.ku, t.one_subgroup ? 1u : 0u,
                       aligned};
      step.key.full_subgroups = s.full_subgroups;
      step.push.head_rows = static_cast<std::int32_t>(t.head_rows);
      step.push.nsplit = static_cast<std::int32_t>(t.nsplit);
      step.groups = {static_cast<std::uint32_t>(base.nq) * t.nsplit, Hq / t.head_rows, B};
      plan.steps.push_back(step);
      if (split) {
        // Partials [B, Hq, Tq, nsplit, Dv + 2] f32, merged by log-sum-exp into out and lse.
        plan.scratch_bytes = static_cast<std::uint64_t>(p.B * p.Hq * p.Tq) * t.nsplit *
                             static_cast<std::uint64_t>(p.Dv + 2) * 4u;
        KernelStep merge;
        merge.key.shader = ShaderId::attn_merge;
        merge.key.spec = {64u};
        merge.push = step.push;
        merge.groups = {static_cast<std::uint32_t>(p.Tq), Hq, B};
        plan.steps.push_back(merge);
      }
      break;
    }
    case Variant::flash_coopmat_khr:
    case Variant::flash_coopmat_nv: {
      const CoopTiles& t = s.coop;
      step.key.shader =
          s.variant == Variant::flash_coopmat_khr ? ShaderId::flash_coopmat_khr : ShaderId::flash_coopmat_nv;
      step.key.spec = {t.subgroups * t.subgroup, dt, t.subgroups, t.bc, t.dpad, t.dvpad, t.subgroup};
      step.key.required_subgroup_size = s.required_size ? t.subgroup : 0u;
      step.key.full_subgroups = s.full_subgroups;
      step.push.head_rows = static_cast<std::int32_t>(t.head_rows);
      step.groups = {static_cast<std::uint32_t>(base.nq), Hq / t.head_rows, B};
      plan.steps.push_back(step);
      break;
    }
    case Variant::vanilla_gemm:
      throw Error(ErrorCode::internal,
                  "vulkan: plan_flash called for vanilla_gemm (plan_vanilla_gemm plans it)");
    case Variant::flash_rowwise: {
      // Specialization of flash.comp: BQ, DTYPE, DMAX (private arrays), BK.
      const std::int64_t dmax = std::max(p.D, p.Dv);
      step.key.shader = ShaderId::flash_rowwise;
      step.key.spec = {static_cast<std::uint32_t>(kBlockQ), dt,
                       dmax <= 64    ? 64u
                       : dmax <= 128 ? 128u
                                     : 256u,
                       static_cast<std::uint32_t>(kBlockK)};
      step.groups = {ceil_div(p.Tq, kBlockQ), Hq, B};
      plan.steps.push_back(step);
      break;
    }
  }
  return plan;
}

}  // namespace attnops::vulkan
