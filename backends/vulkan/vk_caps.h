// Structures and names of VK_KHR_cooperative_matrix, which the Vulkan headers of Debian 12
// (1.3.239) predate. Layouts as in the registry (VK_KHR_cooperative_matrix revision 2); used only
// when the driver lists the extension. Internal to backends/vulkan.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>

namespace attnops::vulkan::rt {

inline constexpr const char* kKhrCoopMatExtension = "VK_KHR_cooperative_matrix";
inline constexpr auto kStypeKhrCoopMatFeatures = static_cast<VkStructureType>(1000506000);
inline constexpr auto kStypeKhrCoopMatProperties = static_cast<VkStructureType>(1000506001);

struct KhrCoopMatFeatures {
  VkStructureType sType;
  void* pNext;
  VkBool32 cooperativeMatrix;
  VkBool32 cooperativeMatrixRobustBufferAccess;
};

struct KhrCoopMatProperties {
  VkStructureType sType;
  void* pNext;
  std::uint32_t MSize, NSize, KSize;
  std::int32_t AType, BType, CType, ResultType;  // VkComponentTypeKHR
  VkBool32 saturatingAccumulation;
  std::int32_t scope;  // VkScopeKHR
};

using PfnKhrCoopMatProperties = VkResult(VKAPI_PTR*)(VkPhysicalDevice, std::uint32_t*, KhrCoopMatProperties*);

}  // namespace attnops::vulkan::rt
