// Where DeviceTensor's storage comes from. Core declares the allocator and the GPU backend
// registers its own when its code is linked, so that core links no backend; DeviceTensor::zeros /
// from_host call it.
#pragma once

#include <cstddef>
#include <memory>

#include "attnops/device_tensor.h"
#include "attnops/metadata.h"

namespace attnops::detail {

// `bytes` of storage on the device `gpu` selects, zero-filled when `zeroed`.
using DeviceAllocator = std::shared_ptr<DeviceStorage> (*)(std::size_t bytes, bool zeroed,
                                                           const GpuSettings& gpu);

// Makes `allocate` the allocator of every later DeviceTensor::zeros / from_host. Returns true, so
// that a namespace-scope constant of the backend can register it before main.
bool register_device_allocator(DeviceAllocator allocate);

}  // namespace attnops::detail
