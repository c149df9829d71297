// The compiled shaders, embedded at build time (see CMakeLists.txt and embed_spirv.cmake; the
// definitions are generated into the build tree from shaders/*.comp).
#pragma once

#include <cstddef>
#include <cstdint>

namespace attnops::vulkan::spirv {

extern const std::uint32_t k_flash[];
extern const std::size_t k_flash_words;
extern const std::uint32_t k_vanilla[];
extern const std::size_t k_vanilla_words;
extern const std::uint32_t k_sgemm[];
extern const std::size_t k_sgemm_words;

}  // namespace attnops::vulkan::spirv
