// The compiled shaders, embedded at build time (see CMakeLists.txt and embed_spirv.cmake; the
// definitions are generated into the build tree from shaders/*.comp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "backends/vulkan/vk_pipeline_key.h"

namespace attnops::vulkan::spirv {

// The SPIR-V words of a shader; empty when it is not part of this build (the cooperative-matrix
// shaders need a glslc that compiles their extension: build_caps()).
std::span<const std::uint32_t> code(ShaderId id);

}  // namespace attnops::vulkan::spirv
