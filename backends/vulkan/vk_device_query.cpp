// DeviceDesc from the driver, and the optional features to enable (vk_device_query.h).
#include "backends/vulkan/vk_device_query.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <utility>

namespace attnops::vulkan::rt {

namespace {

// VK_KHR_cooperative_matrix is newer than Debian 12's Vulkan headers (1.3.239): its structures
// are declared here with the registry's values and layouts.
constexpr VkStructureType kCoopMatFeaturesKHR = static_cast<VkStructureType>(1000506000);
constexpr VkStructureType kCoopMatPropertiesKHR = static_cast<VkStructureType>(1000506001);
constexpr std::uint32_t kComponentBFloat16KHR = 1000141000;  // VK_COMPONENT_TYPE_BFLOAT16_KHR
constexpr std::uint32_t kScopeSubgroup = 3;                  // VK_SCOPE_SUBGROUP_KHR / _NV
struct CoopMatPropertiesKHR {
  VkStructureType sType;
  void* pNext;
  std::uint32_t MSize, NSize, KSize;
  std::uint32_t AType, BType, CType, ResultType;
  VkBool32 saturatingAccumulation;
  std::uint32_t scope;
};
using PfnCoopMatPropertiesKHR = VkResult(VKAPI_PTR*)(VkPhysicalDevice, std::uint32_t*, CoopMatPropertiesKHR*);

template <class T>
T zeroed(VkStructureType type) {
  T s{};
  s.sType = type;
  return s;
}

MatType mat_type(std::uint32_t component) {
  switch (component) {
    case 0:  // VK_COMPONENT_TYPE_FLOAT16
      return MatType::f16;
    case 1:  // VK_COMPONENT_TYPE_FLOAT32
      return MatType::f32;
    case kComponentBFloat16KHR:
      return MatType::bf16;
    default:
      return MatType::other;
  }
}

std::set<std::string> device_extensions(VkPhysicalDevice device) {
  std::uint32_t n = 0;
  std::set<std::string> names;
  if (vkEnumerateDeviceExtensionProperties(device, nullptr, &n, nullptr) != VK_SUCCESS) return names;
  std::vector<VkExtensionProperties> ext(n);
  if (vkEnumerateDeviceExtensionProperties(device, nullptr, &n, ext.data()) != VK_SUCCESS) return names;
  for (const VkExtensionProperties& e : ext) names.insert(e.extensionName);
  return names;
}

std::vector<CoopMatShape> nv_shapes(VkInstance instance, VkPhysicalDevice device) {
  auto get = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
  std::vector<CoopMatShape> shapes;
  std::uint32_t n = 0;
  if (get == nullptr || get(device, &n, nullptr) != VK_SUCCESS) return shapes;
  std::vector<VkCooperativeMatrixPropertiesNV> props(
      n, zeroed<VkCooperativeMatrixPropertiesNV>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV));
  if (get(device, &n, props.data()) != VK_SUCCESS) return shapes;
  for (const auto& p : props)
    if (static_cast<std::uint32_t>(p.scope) == kScopeSubgroup)
      shapes.push_back({p.MSize, p.NSize, p.KSize, mat_type(p.AType), mat_type(p.BType), mat_type(p.CType),
                        mat_type(p.DType)});
  return shapes;
}

std::vector<CoopMatShape> khr_shapes(VkInstance instance, VkPhysicalDevice device) {
  auto get = reinterpret_cast<PfnCoopMatPropertiesKHR>(
      vkGetInstanceProcAddr(instance, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
  std::vector<CoopMatShape> shapes;
  std::uint32_t n = 0;
  if (get == nullptr || get(device, &n, nullptr) != VK_SUCCESS) return shapes;
  std::vector<CoopMatPropertiesKHR> props(n, zeroed<CoopMatPropertiesKHR>(kCoopMatPropertiesKHR));
  if (get(device, &n, props.data()) != VK_SUCCESS) return shapes;
  for (const auto& p : props)
    if (p.scope == kScopeSubgroup && !p.saturatingAccumulation)
      shapes.push_back({p.MSize, p.NSize, p.KSize, mat_type(p.AType), mat_type(p.BType), mat_type(p.CType),
                        mat_type(p.ResultType)});
  return shapes;
}

}  // namespace

DeviceDesc query_device_desc(VkInstance instance, VkPhysicalDevice device, std::uint32_t api_version) {
  DeviceDesc d;
  VkPhysicalDeviceProperties props{};
  vkGetPhysicalDeviceProperties(device, &props);
  d.name = props.deviceName;
  d.software = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  d.shared_memory_bytes = props.limits.maxComputeSharedMemorySize;
  d.max_invocations = props.limits.maxComputeWorkGroupInvocations;
  d.max_group_size_x = props.limits.maxComputeWorkGroupSize[0];
  for (int a = 0; a < 3; ++a) d.max_group_count[a] = props.limits.maxComputeWorkGroupCount[a];
  if (api_version < VK_API_VERSION_1_2) return d;  // not usable by the backend anyway

  const std::set<std::string> ext = device_extensions(device);
  const bool has_size_control =
      api_version >= VK_API_VERSION_1_3 || ext.count(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME) > 0;
  const bool has_nv = ext.count(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME) > 0;
  const bool has_khr = ext.count("VK_KHR_cooperative_matrix") > 0;
  d.shader_bf16 = ext.count("VK_KHR_shader_bfloat16") > 0;

  // Properties: subgroups, subgroup size range, SM / CU counts.
  auto subgroup =
      zeroed<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
  auto size_props = zeroed<VkPhysicalDeviceSubgroupSizeControlPropertiesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES_EXT);
  auto sm = zeroed<VkPhysicalDeviceShaderSMBuiltinsPropertiesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV);
  auto amd = zeroed<VkPhysicalDeviceShaderCorePropertiesAMD>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD);
  auto props2 = zeroed<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
  props2.pNext = &subgroup;
  void** next = &subgroup.pNext;
  if (has_size_control) *std::exchange(next, &size_props.pNext) = &size_props;
  if (ext.count(VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) *std::exchange(next, &sm.pNext) = &sm;
  if (ext.count(VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME)) *std::exchange(next, &amd.pNext) = &amd;
  vkGetPhysicalDeviceProperties2(device, &props2);
  d.subgroup_size = subgroup.subgroupSize;
  d.min_subgroup_size = d.max_subgroup_size = subgroup.subgroupSize;
  const bool compute_ops = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
  d.subgroup_shuffle = compute_ops && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_SHUFFLE_BIT) != 0;
  d.subgroup_arithmetic =
      compute_ops && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_ARITHMETIC_BIT) != 0;
  d.subgroup_ballot = compute_ops && (subgroup.supportedOperations & VK_SUBGROUP_FEATURE_BALLOT_BIT) != 0;
  d.compute_units = sm.shaderSMCount;
  if (d.compute_units == 0)
    d.compute_units = amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray;

  // Features.
  auto f11 = zeroed<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  auto f12 = zeroed<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  auto size_feat = zeroed<VkPhysicalDeviceSubgroupSizeControlFeaturesEXT>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT);
  auto nv_feat = zeroed<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
      VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
  struct {
    VkStructureType sType;
    void* pNext;
    VkBool32 cooperativeMatrix, cooperativeMatrixRobustBufferAccess;
  } khr_feat{kCoopMatFeaturesKHR, nullptr, VK_FALSE, VK_FALSE};
  auto f2 = zeroed<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
  f2.pNext = &f11;
  f11.pNext = &f12;
  next = &f12.pNext;
  if (has_size_control) *std::exchange(next, &size_feat.pNext) = &size_feat;
  if (has_nv) *std::exchange(next, &nv_feat.pNext) = &nv_feat;
  if (has_khr) *std::exchange(next, &khr_feat.pNext) = &khr_feat;
  vkGetPhysicalDeviceFeatures2(device, &f2);
  d.storage_16bit = f11.storageBuffer16BitAccess == VK_TRUE;
  d.shader_f16 = f12.shaderFloat16 == VK_TRUE;
  d.vulkan_memory_model = f12.vulkanMemoryModel == VK_TRUE;
  if (has_size_control && size_feat.subgroupSizeControl == VK_TRUE &&
      (size_props.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0) {
    d.subgroup_size_control = true;
    d.min_subgroup_size = size_props.minSubgroupSize;
    d.max_subgroup_size = size_props.maxSubgroupSize;
  }
  d.full_subgroups = has_size_control && size_feat.computeFullSubgroups == VK_TRUE;
  d.coopmat_nv = has_nv && nv_feat.cooperativeMatrix == VK_TRUE;
  d.coopmat_khr = has_khr && khr_feat.cooperativeMatrix == VK_TRUE;
  if (d.coopmat_nv) d.coopmat_nv_shapes = nv_shapes(instance, device);
  if (d.coopmat_khr) d.coopmat_khr_shapes = khr_shapes(instance, device);
  return d;
}

OptionalFeatures::OptionalFeatures(const DeviceDesc& desc) {
  // Vulkan 1.1 / 1.2 features: the device is at least 1.2 (list_devices requires it).
  f11_ = zeroed<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
  f12_ = zeroed<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
  f11_.storageBuffer16BitAccess = desc.storage_16bit ? VK_TRUE : VK_FALSE;
  f12_.shaderFloat16 = desc.shader_f16 ? VK_TRUE : VK_FALSE;
  f12_.vulkanMemoryModel = desc.vulkan_memory_model ? VK_TRUE : VK_FALSE;
  link(&f11_);
  link(&f12_);
  if (desc.subgroup_size_control || desc.full_subgroups) {
    size_control_ = zeroed<VkPhysicalDeviceSubgroupSizeControlFeaturesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES_EXT);
    size_control_.subgroupSizeControl = desc.subgroup_size_control ? VK_TRUE : VK_FALSE;
    size_control_.computeFullSubgroups = desc.full_subgroups ? VK_TRUE : VK_FALSE;
    extensions_.push_back(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
    link(&size_control_);
  }
  if (desc.coopmat_nv) {
    coopmat_nv_ = zeroed<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
    coopmat_nv_.cooperativeMatrix = VK_TRUE;
    extensions_.push_back(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME);
    link(&coopmat_nv_);
  }
  if (desc.coopmat_khr) {
    coopmat_khr_ = CoopMatFeaturesKHR{kCoopMatFeaturesKHR, nullptr, VK_TRUE, VK_FALSE};
    extensions_.push_back("VK_KHR_cooperative_matrix");
    link(&coopmat_khr_);
  }
}

void OptionalFeatures::link(void* s) {
  auto* node = static_cast<VkBaseOutStructure*>(s);
  node->pNext = nullptr;
  if (tail_ == nullptr)
    head_ = s;
  else
    tail_->pNext = node;
  tail_ = node;
}

}  // namespace attnops::vulkan::rt
