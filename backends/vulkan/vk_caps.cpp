// describe_device: what a physical device offers (limits, subgroups, 16/8-bit types,
// cooperative matrices, timestamps, memory heaps, budget and host-pointer import). Queried,
// never assumed: a structure is chained only when the device's version or extension list says
// the driver knows it.
#include "backends/vulkan/vk_caps.h"

#include <algorithm>
#include <cstring>

#include "backends/vulkan/vk_instance.h"

namespace attnops::vulkan::rt {

namespace {

std::string version_string(std::uint32_t v) {
  return std::to_string(VK_API_VERSION_MAJOR(v)) + "." + std::to_string(VK_API_VERSION_MINOR(v)) + "." +
         std::to_string(VK_API_VERSION_PATCH(v));
}

std::string type_name(VkPhysicalDeviceType t) {
  switch (t) {
    case VK_PHYSICAL_DEVICE_TYPE_DISCRETE_GPU:
      return "discrete";
    case VK_PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU:
      return "integrated";
    case VK_PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU:
      return "virtual";
    case VK_PHYSICAL_DEVICE_TYPE_CPU:
      return "cpu";
    default:
      return "other";
  }
}

std::vector<std::string> device_extensions(VkPhysicalDevice h) {
  std::uint32_t n = 0;
  std::vector<std::string> out;
  if (vkEnumerateDeviceExtensionProperties(h, nullptr, &n, nullptr) != VK_SUCCESS) return out;
  std::vector<VkExtensionProperties> ext(n);
  if (vkEnumerateDeviceExtensionProperties(h, nullptr, &n, ext.data()) != VK_SUCCESS) return out;
  for (const auto& e : ext) out.emplace_back(e.extensionName);
  return out;
}

void query_coopmat(VkInstance inst, PhysicalDevice& pd) {
  DeviceCaps& c = pd.caps;
  if (pd.has_extension(kKhrCoopMatExtension)) {
    auto fn = reinterpret_cast<PfnKhrCoopMatProperties>(
        vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesKHR"));
    std::uint32_t n = 0;
    if (fn != nullptr && fn(pd.handle, &n, nullptr) == VK_SUCCESS) {
      std::vector<KhrCoopMatProperties> props(n);
      for (auto& p : props) {
        p = KhrCoopMatProperties{};
        p.sType = kStypeKhrCoopMatProperties;
      }
      if (fn(pd.handle, &n, props.data()) == VK_SUCCESS) {
        for (std::uint32_t i = 0; i < n; ++i) {
          const auto& p = props[i];
          c.coopmat_khr_shapes.push_back(
              {p.MSize, p.NSize, p.KSize, static_cast<std::uint32_t>(p.AType),
               static_cast<std::uint32_t>(p.BType), static_cast<std::uint32_t>(p.CType),
               static_cast<std::uint32_t>(p.ResultType), p.saturatingAccumulation == VK_TRUE,
               static_cast<std::uint32_t>(p.scope)});
        }
        c.coopmat_khr = true;
      }
    }
  }
  if (pd.has_extension(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) {
    auto fn = reinterpret_cast<PFN_vkGetPhysicalDeviceCooperativeMatrixPropertiesNV>(
        vkGetInstanceProcAddr(inst, "vkGetPhysicalDeviceCooperativeMatrixPropertiesNV"));
    std::uint32_t n = 0;
    if (fn != nullptr && fn(pd.handle, &n, nullptr) == VK_SUCCESS) {
      std::vector<VkCooperativeMatrixPropertiesNV> props(
          n, make<VkCooperativeMatrixPropertiesNV>(VK_STRUCTURE_TYPE_COOPERATIVE_MATRIX_PROPERTIES_NV));
      if (fn(pd.handle, &n, props.data()) == VK_SUCCESS) {
        for (std::uint32_t i = 0; i < n; ++i) {
          const auto& p = props[i];
          c.coopmat_nv_shapes.push_back(
              {p.MSize, p.NSize, p.KSize, static_cast<std::uint32_t>(p.AType),
               static_cast<std::uint32_t>(p.BType), static_cast<std::uint32_t>(p.CType),
               static_cast<std::uint32_t>(p.DType), false, static_cast<std::uint32_t>(p.scope)});
        }
        c.coopmat_nv = true;
      }
    }
  }
}

}  // namespace

PhysicalDevice describe_device(VkInstance inst, VkPhysicalDevice h, int index) {
  PhysicalDevice pd;
  pd.handle = h;
  pd.extensions = device_extensions(h);
  VkPhysicalDeviceProperties props{};
  vkGetPhysicalDeviceProperties(h, &props);
  pd.api_version = props.apiVersion;
  pd.vendor_id = props.vendorID;
  pd.device_id = props.deviceID;
  pd.driver_version = props.driverVersion;
  std::memcpy(pd.cache_uuid, props.pipelineCacheUUID, sizeof pd.cache_uuid);
  DeviceCaps& c = pd.caps;
  const VkPhysicalDeviceLimits& lim = props.limits;
  c.max_shared_memory = lim.maxComputeSharedMemorySize;
  c.max_invocations = lim.maxComputeWorkGroupInvocations;
  c.max_push_constants = lim.maxPushConstantsSize;
  for (int a = 0; a < 3; ++a) {
    c.max_group_count[a] = lim.maxComputeWorkGroupCount[a];
    c.max_group_size[a] = lim.maxComputeWorkGroupSize[a];
  }
  c.max_storage_buffer_range = lim.maxStorageBufferRange;
  c.min_storage_offset_alignment = std::max<std::uint64_t>(lim.minStorageBufferOffsetAlignment, 1);
  c.non_coherent_atom_size = std::max<std::uint64_t>(lim.nonCoherentAtomSize, 1);
  c.timestamp_period_ns = lim.timestampPeriod;

  GpuDeviceInfo& info = pd.info;
  info.index = index;
  info.name = props.deviceName;
  info.type = type_name(props.deviceType);
  info.software = props.deviceType == VK_PHYSICAL_DEVICE_TYPE_CPU;
  info.api_version = version_string(props.apiVersion);
  info.max_shared_memory = c.max_shared_memory;
  info.max_workgroup_invocations = c.max_invocations;
  info.max_storage_buffer_range = c.max_storage_buffer_range;

  c.memory_budget = pd.has_extension(VK_EXT_MEMORY_BUDGET_EXTENSION_NAME);
  c.external_memory_host = pd.has_extension(VK_EXT_EXTERNAL_MEMORY_HOST_EXTENSION_NAME);
  const bool v13 = props.apiVersion >= VK_API_VERSION_1_3;
  const bool size_control = v13 || pd.has_extension(VK_EXT_SUBGROUP_SIZE_CONTROL_EXTENSION_NAME);
  bool coopmat_nv_feature = false, coopmat_khr_feature = false;
  if (props.apiVersion >= VK_API_VERSION_1_2) {
    // Structures of Vulkan 1.1/1.2 may only be chained for devices that report those versions.
    auto subgroup =
        make<VkPhysicalDeviceSubgroupProperties>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_PROPERTIES);
    auto m3 = make<VkPhysicalDeviceMaintenance3Properties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_MAINTENANCE_3_PROPERTIES);
    auto sizes = make<VkPhysicalDeviceSubgroupSizeControlProperties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_PROPERTIES);
    auto host = make<VkPhysicalDeviceExternalMemoryHostPropertiesEXT>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_EXTERNAL_MEMORY_HOST_PROPERTIES_EXT);
    subgroup.pNext = &m3;
    void** tail = &m3.pNext;
    if (size_control) {
      *tail = &sizes;
      tail = &sizes.pNext;
    }
    if (c.external_memory_host) {
      *tail = &host;
      tail = &host.pNext;
    }
    // Multiprocessor counts (the split-KV decision wants about two workgroups per SM / CU).
    auto sm = make<VkPhysicalDeviceShaderSMBuiltinsPropertiesNV>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_SM_BUILTINS_PROPERTIES_NV);
    auto amd = make<VkPhysicalDeviceShaderCorePropertiesAMD>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SHADER_CORE_PROPERTIES_AMD);
    if (pd.has_extension(VK_NV_SHADER_SM_BUILTINS_EXTENSION_NAME)) {
      *tail = &sm;
      tail = &sm.pNext;
    }
    if (pd.has_extension(VK_AMD_SHADER_CORE_PROPERTIES_EXTENSION_NAME)) *tail = &amd;
    auto fcp = make<VkPhysicalDeviceFloatControlsProperties>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FLOAT_CONTROLS_PROPERTIES);
    fcp.pNext = &subgroup;
    auto props2 = make<VkPhysicalDeviceProperties2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_PROPERTIES_2);
    props2.pNext = &fcp;
    vkGetPhysicalDeviceProperties2(h, &props2);
    c.float_controls.signed_zero_inf_nan_16 = fcp.shaderSignedZeroInfNanPreserveFloat16 == VK_TRUE;
    c.float_controls.signed_zero_inf_nan_32 = fcp.shaderSignedZeroInfNanPreserveFloat32 == VK_TRUE;
    c.float_controls.rte_16 = fcp.shaderRoundingModeRTEFloat16 == VK_TRUE;
    c.float_controls.rte_32 = fcp.shaderRoundingModeRTEFloat32 == VK_TRUE;
    c.float_controls.rounding_independent =
        fcp.roundingModeIndependence != VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_NONE;
    c.subgroup_size = subgroup.subgroupSize;
    c.subgroup_ops = subgroup.supportedOperations;
    c.subgroup_ops_compute = (subgroup.supportedStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    c.compute_units = sm.shaderSMCount;
    if (c.compute_units == 0)
      c.compute_units =
          amd.shaderEngineCount * amd.shaderArraysPerEngineCount * amd.computeUnitsPerShaderArray;
    c.max_allocation = m3.maxMemoryAllocationSize;
    c.min_subgroup_size = c.max_subgroup_size = c.subgroup_size;
    if (size_control) {
      c.min_subgroup_size = sizes.minSubgroupSize;
      c.max_subgroup_size = sizes.maxSubgroupSize;
      c.required_subgroup_size_compute =
          (sizes.requiredSubgroupSizeStages & VK_SHADER_STAGE_COMPUTE_BIT) != 0;
    }
    if (c.external_memory_host) c.host_pointer_alignment = host.minImportedHostPointerAlignment;

    auto f11 = make<VkPhysicalDeviceVulkan11Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_1_FEATURES);
    auto f12 = make<VkPhysicalDeviceVulkan12Features>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_VULKAN_1_2_FEATURES);
    auto fsize = make<VkPhysicalDeviceSubgroupSizeControlFeatures>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_SUBGROUP_SIZE_CONTROL_FEATURES);
    auto fnv = make<VkPhysicalDeviceCooperativeMatrixFeaturesNV>(
        VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_COOPERATIVE_MATRIX_FEATURES_NV);
    KhrCoopMatFeatures fkhr{};
    fkhr.sType = kStypeKhrCoopMatFeatures;
    f11.pNext = &f12;
    void** ftail = &f12.pNext;
    if (size_control) {
      *ftail = &fsize;
      ftail = &fsize.pNext;
    }
    if (pd.has_extension(VK_NV_COOPERATIVE_MATRIX_EXTENSION_NAME)) {
      *ftail = &fnv;
      ftail = &fnv.pNext;
    }
    if (pd.has_extension(kKhrCoopMatExtension)) *ftail = &fkhr;
    auto f2 = make<VkPhysicalDeviceFeatures2>(VK_STRUCTURE_TYPE_PHYSICAL_DEVICE_FEATURES_2);
    f2.pNext = &f11;
    vkGetPhysicalDeviceFeatures2(h, &f2);
    c.shader_float16 = f12.shaderFloat16 == VK_TRUE;
    c.shader_int8 = f12.shaderInt8 == VK_TRUE;
    c.storage_16bit = f11.storageBuffer16BitAccess == VK_TRUE;
    c.storage_8bit = f12.storageBuffer8BitAccess == VK_TRUE;
    c.vulkan_memory_model = f12.vulkanMemoryModel == VK_TRUE;
    coopmat_nv_feature = fnv.cooperativeMatrix == VK_TRUE;
    coopmat_khr_feature = fkhr.cooperativeMatrix == VK_TRUE;
    c.subgroup_size_control = size_control && fsize.subgroupSizeControl == VK_TRUE;
    c.compute_full_subgroups = size_control && fsize.computeFullSubgroups == VK_TRUE;
    if (!c.subgroup_size_control) c.required_subgroup_size_compute = false;
    // Reported for information: today's shaders read 16-bit data as uint words and need neither.
    info.shader_f16 = c.shader_float16 && c.storage_16bit;
    info.subgroup_size = c.subgroup_size;
  }
  query_coopmat(inst, pd);
  // The extension is enabled (Device) only where its feature is offered too.
  c.coopmat_nv = c.coopmat_nv && coopmat_nv_feature;
  c.coopmat_khr = c.coopmat_khr && coopmat_khr_feature;
  c.shader_bf16 = pd.has_extension("VK_KHR_shader_bfloat16");

  VkPhysicalDeviceMemoryProperties mp{};
  vkGetPhysicalDeviceMemoryProperties(h, &mp);
  for (std::uint32_t i = 0; i < mp.memoryHeapCount; ++i)
    c.heaps.push_back(
        {mp.memoryHeaps[i].size, (mp.memoryHeaps[i].flags & VK_MEMORY_HEAP_DEVICE_LOCAL_BIT) != 0});
  for (std::uint32_t t = 0; t < mp.memoryTypeCount; ++t) {
    const VkMemoryPropertyFlags f = mp.memoryTypes[t].propertyFlags;
    if ((f & VK_MEMORY_PROPERTY_DEVICE_LOCAL_BIT) && (f & VK_MEMORY_PROPERTY_HOST_VISIBLE_BIT))
      c.device_local_host_visible = true;
  }

  std::uint32_t nq = 0;
  vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, nullptr);
  std::vector<VkQueueFamilyProperties> families(nq);
  vkGetPhysicalDeviceQueueFamilyProperties(h, &nq, families.data());
  // Prefer a compute family without graphics (a dedicated compute queue), else any compute one.
  for (int pass = 0; pass < 2 && pd.compute_family == UINT32_MAX; ++pass)
    for (std::uint32_t f = 0; f < nq; ++f) {
      const VkQueueFlags fl = families[f].queueFlags;
      if ((fl & VK_QUEUE_COMPUTE_BIT) == 0 || families[f].queueCount == 0) continue;
      if (pass == 0 && (fl & VK_QUEUE_GRAPHICS_BIT) != 0) continue;
      pd.compute_family = f;
      break;
    }
  if (pd.compute_family != UINT32_MAX) {
    c.timestamp_valid_bits = families[pd.compute_family].timestampValidBits;
    c.timestamps = c.timestamp_valid_bits > 0 && c.timestamp_period_ns > 0;
  }
  return pd;
}

namespace {

MatType mat_type(std::uint32_t component) {
  switch (component) {
    case 0:  // VK_COMPONENT_TYPE_FLOAT16_KHR / _NV
      return MatType::f16;
    case 1:  // VK_COMPONENT_TYPE_FLOAT32_KHR / _NV
      return MatType::f32;
    case 1000141000:  // VK_COMPONENT_TYPE_BFLOAT16_KHR
      return MatType::bf16;
    default:
      return MatType::other;
  }
}

std::vector<CoopMatShape> subgroup_shapes(const std::vector<CoopMatShape>& all) {
  constexpr std::uint32_t kScopeSubgroup = 3;  // VK_SCOPE_SUBGROUP_KHR / _NV
  std::vector<CoopMatShape> out;
  for (const CoopMatShape& s : all)
    if (s.scope == kScopeSubgroup && !s.saturating) out.push_back(s);
  return out;
}

std::vector<vulkan::CoopMatShape> mat_shapes(const std::vector<CoopMatShape>& all) {
  std::vector<vulkan::CoopMatShape> out;
  for (const CoopMatShape& s : subgroup_shapes(all))
    out.push_back(
        {s.M, s.N, s.K, mat_type(s.a_type), mat_type(s.b_type), mat_type(s.c_type), mat_type(s.result_type)});
  return out;
}

}  // namespace

DeviceDesc selection_desc(const PhysicalDevice& pd) {
  const DeviceCaps& c = pd.caps;
  DeviceDesc d;
  d.name = pd.info.name;
  d.software = pd.info.software;
  d.subgroup_size = c.subgroup_size;
  d.subgroup_size_control = c.subgroup_size_control && c.required_subgroup_size_compute;
  // Without size control a pipeline cannot ask for a size: every subgroup has the default one.
  d.min_subgroup_size = d.subgroup_size_control ? c.min_subgroup_size : c.subgroup_size;
  d.max_subgroup_size = d.subgroup_size_control ? c.max_subgroup_size : c.subgroup_size;
  d.full_subgroups = c.compute_full_subgroups;
  const auto op = [&](VkSubgroupFeatureFlags bit) {
    return c.subgroup_ops_compute && (c.subgroup_ops & bit) != 0;
  };
  d.subgroup_shuffle = op(VK_SUBGROUP_FEATURE_SHUFFLE_BIT);
  d.subgroup_arithmetic = op(VK_SUBGROUP_FEATURE_ARITHMETIC_BIT);
  d.subgroup_ballot = op(VK_SUBGROUP_FEATURE_BALLOT_BIT);
  d.shared_memory_bytes = c.max_shared_memory;
  d.max_invocations = c.max_invocations;
  d.max_group_size_x = c.max_group_size[0];
  for (int a = 0; a < 3; ++a) d.max_group_count[a] = c.max_group_count[a];
  d.compute_units = c.compute_units;
  d.shader_f16 = c.shader_float16;
  d.storage_16bit = c.storage_16bit;
  d.shader_bf16 = c.shader_bf16;
  d.vulkan_memory_model = c.vulkan_memory_model;
  d.coopmat_khr = c.coopmat_khr;
  d.coopmat_nv = c.coopmat_nv;
  d.coopmat_khr_shapes = mat_shapes(c.coopmat_khr_shapes);
  d.coopmat_nv_shapes = mat_shapes(c.coopmat_nv_shapes);
  return d;
}

}  // namespace attnops::vulkan::rt
