// What the kernel selection needs to know about a Vulkan device, as plain data (no Vulkan
// headers): filled from the driver by vk_device_query.cpp, or written by hand in tests to stand
// for devices this machine does not have (an H100, a device without subgroup shuffles, ...).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnops::vulkan {

// Element types of cooperative-matrix operands (the subset attnops can use or must recognise).
enum class MatType { f16, bf16, f32, other };

// One supported cooperative-matrix multiply-add C[M, N] += A[M, K] * B[K, N] at subgroup scope
// (VkCooperativeMatrixPropertiesKHR / NV). Shapes of other scopes are not listed.
struct CoopMatShape {
  std::uint32_t M = 0, N = 0, K = 0;
  MatType a = MatType::other, b = MatType::other, c = MatType::other, result = MatType::other;
  bool operator==(const CoopMatShape&) const = default;
};

struct DeviceDesc {
  std::string name;
  bool software = false;  // VK_PHYSICAL_DEVICE_TYPE_CPU (lavapipe)
  // Subgroups: the default size, and the range a pipeline may require with
  // VK_EXT_subgroup_size_control (min == max == default without it).
  std::uint32_t subgroup_size = 0, min_subgroup_size = 0, max_subgroup_size = 0;
  bool subgroup_size_control = false;  // subgroupSizeControl enabled, compute stage allowed
  bool full_subgroups = false;         // computeFullSubgroups enabled
  bool subgroup_shuffle = false;       // VK_SUBGROUP_FEATURE_SHUFFLE_BIT in compute shaders
  bool subgroup_arithmetic = false;    // VK_SUBGROUP_FEATURE_ARITHMETIC_BIT in compute shaders
  bool subgroup_ballot = false;        // VK_SUBGROUP_FEATURE_BALLOT_BIT (subgroupBroadcast)
  // Limits.
  std::uint32_t shared_memory_bytes = 0;  // maxComputeSharedMemorySize
  std::uint32_t max_invocations = 0;      // maxComputeWorkGroupInvocations
  std::uint32_t max_group_size_x = 0;     // maxComputeWorkGroupSize[0]
  std::uint32_t max_group_count[3] = {0, 0, 0};
  std::uint32_t compute_units = 0;  // SMs / CUs when the driver says (0 = unknown)
  // 16-bit types in shaders (enabled on the device when supported).
  bool shader_f16 = false;     // shaderFloat16
  bool storage_16bit = false;  // storageBuffer16BitAccess
  bool shader_bf16 = false;    // VK_KHR_shader_bfloat16 (shaderBFloat16Type)
  bool vulkan_memory_model = false;
  // Cooperative matrices (the extension enabled on the device, subgroup-scope shapes).
  bool coopmat_khr = false, coopmat_nv = false;
  std::vector<CoopMatShape> coopmat_khr_shapes, coopmat_nv_shapes;
};

// Which optional shaders this build of attnops contains (set by CMake's glslc feature tests).
struct BuildCaps {
  bool coopmat_nv = false;   // GL_NV_cooperative_matrix compiled (glslang 11+)
  bool coopmat_khr = false;  // GL_KHR_cooperative_matrix compiled (glslang 13+)
};
// The shaders compiled into this binary.
BuildCaps build_caps();

}  // namespace attnops::vulkan
