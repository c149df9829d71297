// The identity of one compute pipeline as plain data: which shader, its specialization constants
// and its subgroup requirements. Launch code builds keys; the runtime creates (and caches) the
// pipeline of a key. No Vulkan headers, so launch plans are testable without a device.
#pragma once

#include <array>
#include <compare>
#include <cstdint>

namespace attnops::vulkan {

// Every shader compiled into the backend (shaders/<name>.comp). The coopmat ones are present
// only when glslc could compile them (build_caps()).
enum class ShaderId : std::uint32_t {
  flash_rowwise,      // flash.comp: one invocation per query row (the first kernel; baseline)
  sgemm,              // sgemm.comp: the bench's SGEMM
  flash_tiled,        // flash_tiled.comp: subgroup tiles, K/V staged in shared memory, split-KV
  attn_merge,         // attn_merge.comp: log-sum-exp merge of split-KV partials
  vanilla_scores,     // vanilla_scores.comp: S = mask(logit(Q K^T)), tiled GEMM
  vanilla_softmax,    // vanilla_softmax.comp: row softmax of S in place (the weights), lse
  vanilla_pv,         // vanilla_pv.comp: O = P V, tiled GEMM over the non-empty tiles
  flash_coopmat_nv,   // flash_coopmat.comp with GL_NV_cooperative_matrix
  flash_coopmat_khr,  // flash_coopmat.comp with GL_KHR_cooperative_matrix
};
const char* shader_name(ShaderId s);

inline constexpr std::size_t kMaxSpecConstants = 12;

struct PipelineKey {
  ShaderId shader = ShaderId::flash_rowwise;
  // Specialization constant i (constant_id = i) takes spec[i]; ids the shader does not declare
  // are ignored by Vulkan, so every key specialises all of them.
  std::array<std::uint32_t, kMaxSpecConstants> spec{};
  std::uint32_t required_subgroup_size = 0;  // 0: the driver's choice (VK_EXT_subgroup_size_control)
  bool full_subgroups = false;               // VK_PIPELINE_SHADER_STAGE_CREATE_REQUIRE_FULL_SUBGROUPS_BIT
  auto operator<=>(const PipelineKey&) const = default;
};

}  // namespace attnops::vulkan
