// What the forward's and the backward's push constants share (vk_launch.h's PushConstants,
// vk_backward.cpp's BackwardPush): the flag bits, which shaders/mask_rules.glsl mirrors, and the
// fields both blocks start with (dims, scale, soft cap, the parametric mask, the feature flags).
#pragma once

#include <algorithm>
#include <cstdint>
#include <optional>

#include "attnops/ext/problem.h"
#include "backends/vulkan/vk_attention.h"
#include "backends/vulkan/vk_tile_plan.h"

namespace attnops::vulkan {

// Bit for bit shaders/mask_rules.glsl's FLAG_* constants.
enum Flag : std::uint32_t {
  kCausal = 1,
  kParamMask = 2,
  kSegments = 4,
  kBias = 8,
  kSinks = 16,
  kLse = 32,  // forward only
  kSoftCap = 64,
  kVec = 128,       // rows are whole 16-byte vectors (forward: and start on one; backward: D, Dv)
  kAligned4 = 256,  // forward only: every q/k/v row starts at a multiple of 4 elements, D and Dv too
};

// Sets B .. Dv, scale, soft_cap, the parametric mask (win_left / win_right / chunk, -1 / 0 when
// unbounded) and the flags of the features both directions share. `Push`: PushConstants or
// BackwardPush (fields of the same names).
template <class Push>
void fill_problem_push(const AttentionProblem& p, const std::optional<ParamMask>& param, Push& pc) {
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
  pc.chunk = 0;
  if (param) {
    // Bounds past the sequence act like no bound; clipping keeps the shader's int math exact.
    const std::int64_t span = p.Tq + p.Tk;
    pc.flags |= kParamMask | (param->causal ? kCausal : 0u);
    if (param->left >= 0) pc.win_left = clip32(param->left, span);
    if (param->right >= 0) pc.win_right = clip32(param->right, span);
    if (param->chunk > 0) pc.chunk = clip32(param->chunk, std::max<std::int64_t>(p.Tk, 1));
  }
  if (p.has_segments()) pc.flags |= kSegments;
  if (p.bias) pc.flags |= kBias;
  if (p.sinks) pc.flags |= kSinks;
  if (p.soft_cap) pc.flags |= kSoftCap;
  pc.bias_stride_b = static_cast<std::uint32_t>(p.bias_stride_b);
  pc.bias_stride_h = static_cast<std::uint32_t>(p.bias_stride_h);
}

}  // namespace attnops::vulkan
