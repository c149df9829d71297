// Launch plans of the flash variants, and what every plan shares (vk_launch.h).
#include "backends/vulkan/vk_launch.h"

#include <algorithm>

#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "backends/vulkan/vk_attention.h"

namespace attnops::vulkan {

namespace {

std::uint32_t ceil_div(std::int64_t a, std::int64_t b) {
  return static_cast<std::uint32_t>((a + b - 1) / b);
}

// The split-KV merge after a first pass that wrote partials [B, Hq, Tq, nsplit, Dv + 2] f32:
// combined by log-sum-exp into out and lse (attn_merge.comp).
void add_merge(const AttentionProblem& p, const PushConstants& push, std::uint32_t nsplit, LaunchPlan& plan) {
  plan.scratch_bytes =
      static_cast<std::uint64_t>(p.B * p.Hq * p.Tq) * nsplit * static_cast<std::uint64_t>(p.Dv + 2) * 4u;
  KernelStep merge;
  merge.key.shader = rt::ShaderId::attn_merge;
  merge.key.spec = {64u};
  merge.key.spec_count = 1;
  merge.label = "merge";
  merge.push = push;
  merge.groups = {static_cast<std::uint32_t>(p.Tq), static_cast<std::uint32_t>(p.Hq),
                  static_cast<std::uint32_t>(p.B)};
  plan.steps.push_back(merge);
}

// The pass of a kernel over (q block * nsplit + split, head block, batch) workgroups of
// head_rows q heads each (flash_tiled.comp, flash_decode.comp), and the merge after it when the
// keys are split. `step` has its pipeline key and label; its push constants are the base's.
void add_row_blocks(const AttentionProblem& p, KernelStep step, std::uint32_t head_rows, std::uint32_t nsplit,
                    LaunchPlan& plan) {
  step.push.head_rows = static_cast<std::int32_t>(head_rows);
  step.push.nsplit = static_cast<std::int32_t>(nsplit);
  step.groups = {static_cast<std::uint32_t>(step.push.nq) * nsplit,
                 static_cast<std::uint32_t>(p.Hq) / head_rows, static_cast<std::uint32_t>(p.B)};
  plan.steps.push_back(step);
  if (nsplit > 1) add_merge(p, step.push, nsplit, plan);
}

}  // namespace

MapTile map_tile(const Selection& s) {
  switch (s.variant) {
    case Variant::flash_subgroup:
      return {s.subgroup.q_rows, s.subgroup.bc};
    case Variant::flash_decode:
      return {s.decode.q_rows, s.decode.bc};
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
  fill_problem_push(p, plan.param, pc);
  if (p.want_lse) pc.flags |= kLse;
  // Packed q / k / v (host inputs); device views override these.
  pc.q_sb = static_cast<std::uint32_t>(p.Tq * p.Hq * p.D);
  pc.q_st = static_cast<std::uint32_t>(p.Hq * p.D);
  pc.k_sb = static_cast<std::uint32_t>(p.Tk * p.Hkv * p.D);
  pc.k_st = static_cast<std::uint32_t>(p.Hkv * p.D);
  pc.v_sb = static_cast<std::uint32_t>(p.Tk * p.Hkv * p.Dv);
  pc.v_st = static_cast<std::uint32_t>(p.Hkv * p.Dv);
  set_alignment_flags(pc, dtype_size(p.dtype));
  pc.map_heads = static_cast<std::int32_t>(bm.heads);
  pc.nq = static_cast<std::int32_t>(bm.nq);
  pc.words_per_row = static_cast<std::int32_t>(bm.words_per_row * 2);  // uint64 -> uint words
  pc.q_rows = static_cast<std::int32_t>(bm.bq);
  pc.head_rows = 1;
  pc.nsplit = 1;
  pc.kv_block = static_cast<std::int32_t>(bm.bk);
  return pc;
}

void set_alignment_flags(PushConstants& pc, std::size_t elem_size) {
  pc.flags &= ~(kVec | kAligned4);
  const std::uint64_t at[] = {static_cast<std::uint64_t>(pc.D),
                              static_cast<std::uint64_t>(pc.Dv),
                              pc.q_off,
                              pc.k_off,
                              pc.v_off,
                              pc.q_sb,
                              pc.q_st,
                              pc.k_sb,
                              pc.k_st,
                              pc.v_sb,
                              pc.v_st};
  // Rows of whole 16-byte vectors that start on 16-byte boundaries are read 16 bytes at a time;
  // rows of whole 4-element groups that start on 4-element boundaries 4 elements at a time.
  bool vec = true, four = true;
  for (std::uint64_t e : at) {
    vec = vec && e * elem_size % 16 == 0;
    four = four && e % 4 == 0;
  }
  if (vec) pc.flags |= kVec;
  if (four) pc.flags |= kAligned4;
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
      step.key.shader = rt::ShaderId::flash_tiled;
      const std::uint32_t aligned = (base.flags & kAligned4) != 0 ? 1u : 0u;
      step.key.spec = {t.wg,   dt, t.ds, t.rpt, t.bc, t.dk4, t.dv4, split, t.ku, t.one_subgroup ? 1u : 0u,
                       aligned};
      step.key.spec_count = 11;
      step.key.full_subgroups = s.full_subgroups;
      step.label = split ? "split_kv" : "flash_subgroup";
      add_row_blocks(p, step, t.head_rows, t.nsplit, plan);
      break;
    }
    case Variant::flash_decode: {
      const DecodeTiles& t = s.decode;
      const std::uint32_t split = t.nsplit > 1 ? 1u : 0u;
      step.key.shader = rt::ShaderId::flash_decode;
      // 2: 16-byte loads (FLAG_VEC), 1: 4-element loads (FLAG_ALIGNED4), 0: element loads.
      const std::uint32_t aligned = (base.flags & kAligned4) == 0 ? 0u : (base.flags & kVec) != 0 ? 2u : 1u;
      step.key.spec = {t.wg, dt, t.ds, t.rows, t.bc, t.dk8, t.dv8, split, t.ku, t.max_subgroups, aligned};
      step.key.spec_count = 11;
      step.key.full_subgroups = s.full_subgroups;
      step.label = split ? "decode_split_kv" : "flash_decode";
      add_row_blocks(p, step, t.head_rows, t.nsplit, plan);
      break;
    }
    case Variant::flash_coopmat_khr:
    case Variant::flash_coopmat_nv: {
      const CoopTiles& t = s.coop;
      step.key.shader = s.variant == Variant::flash_coopmat_khr ? rt::ShaderId::flash_coopmat_khr
                                                                : rt::ShaderId::flash_coopmat_nv;
      step.key.spec = {t.subgroups * t.subgroup, dt, t.subgroups, t.bc, t.dpad, t.dvpad, t.subgroup};
      step.key.spec_count = 7;
      step.key.subgroup_size = s.required_size ? t.subgroup : 0u;
      step.label = variant_name(s.variant);
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
      // Specialization of flash.comp: BQ, DTYPE, DMAX (private arrays), BK. Constants 4 and 5
      // (exact head dims: loops of constant length) stay 0: on lavapipe the fully unrolled
      // variants cost far more to compile than they save.
      const std::int64_t dmax = std::max(p.D, p.Dv);
      step.key.shader = rt::ShaderId::flash;
      step.key.spec_count = 4;
      step.label = "flash_rowwise";
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
