// Fills a DeviceDesc from the Vulkan driver, and the optional device features that the kernels
// can use (subgroup size control, 16-bit arithmetic, the memory model, cooperative matrices),
// to be enabled when the logical device is created. Internal to backends/vulkan.
#pragma once

#include <vulkan/vulkan.h>

#include <cstdint>
#include <string>
#include <vector>

#include "backends/vulkan/vk_device_desc.h"

namespace attnops::vulkan::rt {

// What the device supports: limits, subgroup properties and the optional features (each optional
// flag of DeviceDesc is true only if the device offers it; OptionalFeatures enables exactly
// those). `api_version` is the device's; structures past Vulkan 1.2 are queried only through
// their extensions (the instance is created for Vulkan 1.2).
DeviceDesc query_device_desc(VkInstance instance, VkPhysicalDevice device, std::uint32_t api_version);

// The extensions and feature structures to pass to vkCreateDevice so that what `desc` lists as
// supported is enabled. Holds the structures; chain() stays valid while this object lives.
class OptionalFeatures {
 public:
  explicit OptionalFeatures(const DeviceDesc& desc);
  OptionalFeatures(const OptionalFeatures&) = delete;
  OptionalFeatures& operator=(const OptionalFeatures&) = delete;
  const void* chain() const { return head_; }
  const std::vector<const char*>& extensions() const { return extensions_; }

 private:
  void link(void* s);  // appends a structure to the pNext chain
  std::vector<const char*> extensions_;
  void* head_ = nullptr;
  VkBaseOutStructure* tail_ = nullptr;
  VkPhysicalDeviceVulkan11Features f11_{};
  VkPhysicalDeviceVulkan12Features f12_{};
  VkPhysicalDeviceSubgroupSizeControlFeaturesEXT size_control_{};
  VkPhysicalDeviceCooperativeMatrixFeaturesNV coopmat_nv_{};
  struct CoopMatFeaturesKHR {  // VkPhysicalDeviceCooperativeMatrixFeaturesKHR (newer headers)
    VkStructureType sType;
    void* pNext;
    VkBool32 cooperativeMatrix;
    VkBool32 cooperativeMatrixRobustBufferAccess;
  } coopmat_khr_{};
};

}  // namespace attnops::vulkan::rt
