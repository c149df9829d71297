// Launch plans: what the attention kernels dispatch, as plain data (pipeline keys, push
// constants, workgroup counts, scratch size), built from a problem, its block map and the
// selected variant. No Vulkan calls: vulkan_backend.cpp executes a plan with the runtime
// (Context::pipeline per step, one buffer set, Context::dispatch_steps: the steps in order in one
// submission with a compute barrier between them).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "attnops/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/vulkan/vk_kernel_select.h"
#include "backends/vulkan/vk_pipeline_key.h"
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
  std::int32_t q_rows, head_rows, nsplit, kv_block;
};
static_assert(sizeof(PushConstants) == 22 * 4 && sizeof(PushConstants) <= 128);

enum Flag : std::uint32_t {
  kCausal = 1,
  kParamMask = 2,
  kSegments = 4,
  kBias = 8,
  kSinks = 16,
  kLse = 32,
  kSoftCap = 64,
  kVec = 128,
  kAligned4 = 256,
};

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
  PipelineKey key;
  PushConstants push{};
  std::array<std::uint32_t, 3> groups{1, 1, 1};
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

// Push constants common to every step: the problem, its mask and the block map.
PushConstants base_push(const AttentionProblem& p, const TilePlan& plan);

// The steps of the flash variants (flash_coopmat_*, flash_subgroup with or without split-KV,
// flash_rowwise) and of vanilla_gemm.
LaunchPlan plan_flash(const AttentionProblem& p, const Selection& s, const PushConstants& base);
LaunchPlan plan_vanilla_gemm(const AttentionProblem& p, const Selection& s, const PushConstants& base);

std::uint32_t dtype_code(DType t);  // 0 f32, 1 f16, 2 bf16 (the shaders' DTYPE)

}  // namespace attnops::vulkan
