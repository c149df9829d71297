// The process's GPU state: the Vulkan instance and one Device per selected physical device.
// It lives on the heap behind a pointer that is never destroyed by a static destructor: it is
// created on first use and destroyed only by release() (attnops::release_gpu()), which the
// CLI, the tests, the benches and the example call before they return. Whatever is still alive
// at exit is left to the OS; no Vulkan call ever runs from exit().
// Internal to backends/vulkan.
#pragma once

#include <memory>
#include <string>

#include "attnops/metadata.h"
#include "backends/vulkan/vk_device.h"
#include "backends/vulkan/vk_instance.h"

namespace attnops::vulkan::rt {

// The instance, created on first use. Throws Error(backend_unavailable) when the loader has no
// usable Vulkan 1.2 instance (the failure is remembered until release()). The reference stays
// valid until release().
const Instance& instance();

// Index of the device `settings` select (ATTNOPS_VK_DEVICE, ATTNOPS_VK_ALLOW_SOFTWARE apply),
// or -1 with *why set.
int selected_index(const GpuSettings& settings, std::string* why);

// The Device of the selected physical device, created on first use; a lost one is replaced by a
// new one. Throws Error(backend_unavailable) when no device qualifies, Error(gpu_error) when
// creating it fails. Device tensors hold the shared_ptr: after release() their device is shut
// down and every use fails with gpu_error.
std::shared_ptr<Device> device(const GpuSettings& settings);

// Shuts every device down and destroys the instance. Calls in flight on other threads must have
// returned. The next call starts again from scratch. A device abandoned after a fence timeout is
// destroyed only once its last submission has finished (waited for a bounded time, after the
// injected hangs are released); one still running then is left to the OS, with the instance.
void release();

// Lets the kernels of the injected hang fault finish, on every device (vulkan_debug.h).
void release_hangs();

}  // namespace attnops::vulkan::rt
