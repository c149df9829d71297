// Launch plans: what the attention kernels dispatch, as plain data (pipeline keys, push
// constants, workgroup counts, scratch size, a label per pass), built from a problem, its block
// map and the selected variant. No Vulkan calls: vk_attention.cpp records a plan's steps into one
// rt::Batch (one submission; the batch puts a compute barrier between consecutive dispatches and
// times each pass under its label).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vk_push_common.h"
#include "backends/vulkan/vk_tile_plan.h"

namespace attnops::vulkan {

// Must match `PushConstants` in shaders/attn_io.glsl (std430 scalars).
struct PushConstants {
  std::int32_t B, Tq, Tk, Hq, Hkv, D, Dv;
  float scale, soft_cap;
  std::uint32_t flags;
  std::int32_t win_left, win_right, chunk;
  std::uint32_t bias_stride_b, bias_stride_h;
  std::int32_t map_heads, nq, words_per_row;
  // q / k / v addressing in elements: element (b, t, h, d) of q at q_off + b*q_sb + t*q_st + h*D + d.
  std::uint32_t q_off, k_off, v_off, q_sb, q_st, k_sb, k_st, v_sb, v_st;
  std::int32_t q_rows, head_rows, nsplit, kv_block;
};
static_assert(sizeof(PushConstants) == 31 * 4 && sizeof(PushConstants) <= rt::Device::kPushConstantBytes);

// Descriptor bindings (shaders/attn_io.glsl).
enum Binding : std::uint32_t {
  bQ,
  bK,
  bV,
  bOut,
  bLse,
  bBias,
  bSinks,
  bSegQ,
  bSegKv,
  bRowStart,
  bEntries,
  bPartIndex,
  bBits,
  bScratch,
  kBindingCount,
};

struct KernelStep {
  rt::PipelineKey key;
  PushConstants push{};
  std::array<std::uint32_t, 3> groups{1, 1, 1};
  const char* label = "";  // the pass's name in the timings ("flash_subgroup", "merge", ...)
};

struct LaunchPlan {
  std::vector<KernelStep> steps;
  std::uint64_t scratch_bytes = 0;  // binding bScratch (vanilla's scores, split-KV partials)
};

// The block map's tile (bq query rows x bk keys) that the selected kernel reads.
struct MapTile {
  std::int64_t bq, bk;
};
MapTile map_tile(const Selection& s);

// Push constants common to every step: the problem, its mask and the block map, with q / k / v
// addressed as packed arrays (the caller overrides the offsets and strides of device views and
// then calls set_alignment_flags).
PushConstants base_push(const AttentionProblem& p, const TilePlan& plan);
// Sets kVec / kAligned4 from D, Dv and the offsets and strides in `pc` (elements of `elem_size`
// bytes).
void set_alignment_flags(PushConstants& pc, std::size_t elem_size);

// The steps of the flash variants (flash_coopmat_*, flash_subgroup with or without split-KV,
// flash_rowwise) and of vanilla_gemm.
LaunchPlan plan_flash(const AttentionProblem& p, const Selection& s, const PushConstants& base);
LaunchPlan plan_vanilla_gemm(const AttentionProblem& p, const Selection& s, const PushConstants& base);

}  // namespace attnops::vulkan
