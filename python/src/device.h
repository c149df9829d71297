// Device tensors and the GPU state's lifetime, as Python sees them.
//
// attnops::release_gpu() may run only when no call is using the GPU state (gpu.h). Python
// threads run attnops calls with the GIL released, so the extension guards the state with one
// reader-writer lock: every call that may touch the GPU (a forward, a backward, a device tensor
// copy or its destruction) holds it shared; release_gpu() holds it exclusively (and so waits for
// running calls). attnops.release_gpu() is also registered with atexit.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <shared_mutex>

#include "attnops/device_tensor.h"

namespace py = pybind11;

namespace attnops::python {

std::shared_mutex& gpu_lifetime();

// Calls now running with the GIL released (attnops._attnops.calls_in_flight(); the GIL test
// reads it from another thread, which can only see it non-zero if the GIL was released).
std::atomic<int>& calls_in_flight();

// The Python object behind attnops.DeviceTensor. Its device memory is freed under the shared
// lock (never while release_gpu() runs).
struct PyDeviceTensor {
  DeviceTensor tensor;
  PyDeviceTensor() = default;
  explicit PyDeviceTensor(DeviceTensor t) : tensor(std::move(t)) {}
  PyDeviceTensor(const PyDeviceTensor&) = delete;
  PyDeviceTensor& operator=(const PyDeviceTensor&) = delete;
  ~PyDeviceTensor();
};

// Runs f() with the GIL released and the GPU state held shared, counted in calls_in_flight().
// Nothing in f may touch a Python object.
template <class F>
auto without_gil(F&& f) {
  struct Count {
    Count() { ++calls_in_flight(); }
    ~Count() { --calls_in_flight(); }
  } count;  // incremented with the GIL held, decremented after it is taken back
  py::gil_scoped_release release;
  std::shared_lock lock(gpu_lifetime());
  return f();
}

// Whether obj is an attnops.DeviceTensor (a pointer comparison: this is on the per-call path).
bool is_device_tensor(py::handle obj);

// A new attnops.DeviceTensor object owning `t`.
py::object wrap_device_tensor(DeviceTensor t);

}  // namespace attnops::python
