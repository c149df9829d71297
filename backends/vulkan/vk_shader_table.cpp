// The table of embedded shaders (spirv.h). ATTNOPS_HAVE_COOPMAT_NV / _KHR are set by CMake when
// glslc compiled the cooperative-matrix shaders.
#include "backends/vulkan/spirv.h"

namespace attnops::vulkan {
namespace spirv {

#define ATTNOPS_DECLARE_SPIRV(name)      \
  extern const std::uint32_t k_##name[]; \
  extern const std::size_t k_##name##_words;
ATTNOPS_DECLARE_SPIRV(flash)
ATTNOPS_DECLARE_SPIRV(sgemm)
ATTNOPS_DECLARE_SPIRV(flash_tiled)
ATTNOPS_DECLARE_SPIRV(attn_merge)
ATTNOPS_DECLARE_SPIRV(vanilla_scores)
ATTNOPS_DECLARE_SPIRV(vanilla_softmax)
ATTNOPS_DECLARE_SPIRV(vanilla_pv)
#if ATTNOPS_HAVE_COOPMAT_NV
ATTNOPS_DECLARE_SPIRV(flash_coopmat_nv)
#endif
#if ATTNOPS_HAVE_COOPMAT_KHR
ATTNOPS_DECLARE_SPIRV(flash_coopmat_khr)
#endif
#undef ATTNOPS_DECLARE_SPIRV

std::span<const std::uint32_t> code(ShaderId id) {
#define ATTNOPS_SPIRV_CASE(id, name) \
  case ShaderId::id:                 \
    return {k_##name, k_##name##_words};
  switch (id) {
    ATTNOPS_SPIRV_CASE(flash_rowwise, flash)
    ATTNOPS_SPIRV_CASE(sgemm, sgemm)
    ATTNOPS_SPIRV_CASE(flash_tiled, flash_tiled)
    ATTNOPS_SPIRV_CASE(attn_merge, attn_merge)
    ATTNOPS_SPIRV_CASE(vanilla_scores, vanilla_scores)
    ATTNOPS_SPIRV_CASE(vanilla_softmax, vanilla_softmax)
    ATTNOPS_SPIRV_CASE(vanilla_pv, vanilla_pv)
#if ATTNOPS_HAVE_COOPMAT_NV
    ATTNOPS_SPIRV_CASE(flash_coopmat_nv, flash_coopmat_nv)
#endif
#if ATTNOPS_HAVE_COOPMAT_KHR
    ATTNOPS_SPIRV_CASE(flash_coopmat_khr, flash_coopmat_khr)
#endif
    default:
      return {};
  }
#undef ATTNOPS_SPIRV_CASE
}

}  // namespace spirv
}  // namespace attnops::vulkan
