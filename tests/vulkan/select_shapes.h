// Problem shapes, build capabilities and a helper shared by the kernel-selection tests
// (test_vulkan_select.cpp, test_vulkan_select_decode.cpp).
#pragma once

#include <string>
#include <vector>

#include "backends/vulkan/vk_kernel_select.h"

namespace attnops::testing {

using vulkan::BuildCaps;
using vulkan::ProblemShape;
using vulkan::Selection;
using vulkan::Variant;

inline ProblemShape prefill(DType t, std::int64_t D = 128, std::int64_t T = 4096, std::int64_t Hq = 16,
                            std::int64_t Hkv = 16) {
  ProblemShape p;
  p.dtype = t;
  p.B = 1;
  p.Tq = p.Tk = T;
  p.Hq = Hq;
  p.Hkv = Hkv;
  p.D = p.Dv = D;
  return p;
}

inline ProblemShape decode(DType t, std::int64_t Tk, std::int64_t Hq, std::int64_t Hkv,
                           std::int64_t D = 128) {
  ProblemShape p = prefill(t, D, 1, Hq, Hkv);
  p.Tk = Tk;
  return p;
}

inline bool mentions(const Selection& s, const std::string& text) {
  return s.detail().find(text) != std::string::npos;
}

inline constexpr BuildCaps kDebian12{true, false};  // glslc compiles the NV extension, not the KHR one
inline constexpr BuildCaps kNewGlslc{true, true};
inline constexpr BuildCaps kNoCoopmat{false, false};
// For flash_subgroup's decode shape on a GPU: flash_decode ruled out (as the self-check would).
inline const std::vector<vulkan::DisabledVariant> kNoDecodeKernel = {
    {Variant::flash_decode, "ruled out by the test"}};

}  // namespace attnops::testing
