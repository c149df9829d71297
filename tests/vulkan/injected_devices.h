// Device descriptions of GPUs this machine does not have, for the pure parts of the Vulkan
// backend (kernel selection, input gates, memory planning): lavapipe as this machine reports it,
// an NVIDIA H100 as the GPU recipe reported it (driver 580: 132 SMs, subgroup 32 with size
// control and full subgroups, 48 KiB shared memory, a 4 GiB storage-buffer range, device-local
// memory that is host-visible through a resizable BAR, cooperative matrices), and an AMD-like
// wave64 device.
#pragma once

#include "backends/vulkan/vk_device_desc.h"
#if ATTNOPS_TEST_VULKAN_BUILT
#include "backends/vulkan/vk_instance.h"
#endif

namespace attnops::testing {

inline vulkan::DeviceDesc lavapipe() {
  vulkan::DeviceDesc d;
  d.name = "llvmpipe (LLVM 15.0.6, 256 bits)";
  d.software = true;
  d.subgroup_size = d.min_subgroup_size = d.max_subgroup_size = 8;
  d.subgroup_size_control = true;
  d.full_subgroups = true;
  d.subgroup_shuffle = d.subgroup_arithmetic = d.subgroup_ballot = true;
  d.shared_memory_bytes = 32768;
  d.max_invocations = d.max_group_size_x = 1024;
  d.max_group_count[0] = d.max_group_count[1] = d.max_group_count[2] = 65535;
  d.shader_f16 = d.storage_16bit = d.vulkan_memory_model = true;
  return d;
}

inline vulkan::DeviceDesc h100() {
  using vulkan::CoopMatShape;
  using vulkan::MatType;
  vulkan::DeviceDesc d;
  d.name = "NVIDIA H100 80GB HBM3";
  d.subgroup_size = d.min_subgroup_size = d.max_subgroup_size = 32;
  d.subgroup_size_control = d.full_subgroups = true;
  d.subgroup_shuffle = d.subgroup_arithmetic = d.subgroup_ballot = true;
  d.shared_memory_bytes = 49152;
  d.max_invocations = d.max_group_size_x = 1024;
  d.max_group_count[0] = 2147483647;
  d.max_group_count[1] = d.max_group_count[2] = 65535;
  d.compute_units = 132;
  d.shader_f16 = d.storage_16bit = d.shader_bf16 = d.vulkan_memory_model = true;
  d.coopmat_khr = d.coopmat_nv = true;
  const CoopMatShape f16_f32{16, 16, 16, MatType::f16, MatType::f16, MatType::f32, MatType::f32};
  const CoopMatShape f16_f16{16, 16, 16, MatType::f16, MatType::f16, MatType::f16, MatType::f16};
  const CoopMatShape f16_8{16, 8, 16, MatType::f16, MatType::f16, MatType::f32, MatType::f32};
  const CoopMatShape bf16_f32{16, 16, 16, MatType::bf16, MatType::bf16, MatType::f32, MatType::f32};
  d.coopmat_khr_shapes = {f16_f16, f16_f32, f16_8, bf16_f32};
  d.coopmat_nv_shapes = {f16_f16, f16_f32, f16_8};
  return d;
}

inline vulkan::DeviceDesc wave64() {  // an AMD-like device: subgroups of 32 or 64 lanes, 64 KiB shared memory
  vulkan::DeviceDesc d = h100();
  d.name = "wave64";
  d.subgroup_size = 64;
  d.min_subgroup_size = 32;
  d.max_subgroup_size = 64;
  d.shared_memory_bytes = 65536;
  d.compute_units = 0;
  d.coopmat_khr = d.coopmat_nv = false;
  d.coopmat_khr_shapes.clear();
  d.coopmat_nv_shapes.clear();
  return d;
}

#if ATTNOPS_TEST_VULKAN_BUILT
// The H100 as the runtime's PhysicalDevice (no handle: for the pure gates only).
inline vulkan::rt::PhysicalDevice h100_physical() {
  vulkan::rt::PhysicalDevice pd;
  pd.info.name = "NVIDIA H100 80GB HBM3";
  pd.info.type = "discrete";
  pd.api_version = (1u << 22) | (4u << 12);
  pd.compute_family = 0;
  vulkan::rt::DeviceCaps& c = pd.caps;
  c.subgroup_size = c.min_subgroup_size = c.max_subgroup_size = 32;
  c.subgroup_size_control = c.required_subgroup_size_compute = c.compute_full_subgroups = true;
  c.subgroup_ops = 0xff;
  c.subgroup_ops_compute = true;
  c.compute_units = 132;
  c.max_shared_memory = 49152;
  c.max_invocations = 1024;
  c.max_push_constants = 256;
  c.max_group_size[0] = c.max_group_size[1] = c.max_group_size[2] = 1024;
  c.max_group_count[0] = 2147483647;
  c.max_group_count[1] = c.max_group_count[2] = 65535;
  c.max_storage_buffer_range = 4ull << 30;
  c.max_allocation = 4ull << 30;
  c.min_storage_offset_alignment = 16;
  c.shader_float16 = c.storage_16bit = c.vulkan_memory_model = true;
  c.heaps = {{80ull << 30, true}, {64ull << 30, false}};
  c.device_local_host_visible = true;
  return pd;
}
#endif

}  // namespace attnops::testing
