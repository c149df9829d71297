// The process's GPU state: the Vulkan instance, devices, memory pools, pipelines. It is created
// on first use and released only by release_gpu(), never by a static destructor (drivers may
// already be tearing down then). Programs call release_gpu() before they return from main();
// whatever is still alive at exit is left to the OS. After release_gpu(), device tensors can
// only be destroyed; the next GPU call starts the state again.
#pragma once

namespace attnops {

// Waits for the GPU, destroys every Vulkan object and the instance. Calls on other threads must
// have returned. Safe to call when no GPU was used, and more than once.
void release_gpu();

}  // namespace attnops
