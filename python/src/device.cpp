// attnops.DeviceTensor (attnops/device_tensor.h) and the GPU state's lifetime (device.h).
#include "device.h"

#include <pybind11/stl.h>

#include <mutex>
#include <string>
#include <vector>

#include "arrays.h"
#include "attnops/error.h"
#include "attnops/gpu.h"
#include "bindings.h"
#include "call.h"
#include "outputs.h"

namespace attnops::python {

std::shared_mutex& gpu_lifetime() {
  static std::shared_mutex mu;
  return mu;
}

std::atomic<int>& calls_in_flight() {
  static std::atomic<int> n{0};
  return n;
}

PyDeviceTensor::~PyDeviceTensor() {
  if (tensor.empty()) return;
  // Called with the GIL held; release_gpu() never needs the GIL, so waiting here cannot deadlock.
  std::shared_lock lock(gpu_lifetime());
  tensor = DeviceTensor();
}

namespace {
PyTypeObject* g_device_tensor_type = nullptr;  // set by bind_device; the class is never freed
}  // namespace

bool is_device_tensor(py::handle obj) {
  return g_device_tensor_type != nullptr && PyObject_TypeCheck(obj.ptr(), g_device_tensor_type);
}

py::object wrap_device_tensor(DeviceTensor t) {
  return py::cast(std::make_unique<PyDeviceTensor>(std::move(t)));
}

namespace {

GpuSettings gpu_settings(const std::string& device, bool allow_software) {
  GpuSettings g;
  g.device = device;
  g.allow_software = allow_software;
  return g;
}

std::string describe(const PyDeviceTensor& d) {
  const DeviceTensor& t = d.tensor;
  if (t.empty()) return "attnops.DeviceTensor(empty)";
  return "attnops.DeviceTensor(" + std::string(dtype_name(t.dtype())) + ", " + shape_string(t.shape()) +
         ", " + t.device() + ")";
}

const DeviceTensor& live(const PyDeviceTensor& d) {
  if (d.tensor.empty()) throw Error(ErrorCode::invalid_argument, "DeviceTensor: empty (no device memory)");
  return d.tensor;
}

}  // namespace

void bind_device(py::module_& m) {
  py::class_<PyDeviceTensor>(m, "DeviceTensor", R"(A tensor kept in GPU (Vulkan) memory between calls,
with the shape, stride and view rules of host tensors. Pass it as q, k or v (any mix with host
arrays); a call whose q is a DeviceTensor leaves its output on the device. A slice is a view:
writing rows into it moves only those bytes.

    ck = attnops.DeviceTensor.zeros([B, Tmax, Hkv, D], "f16", allow_software=True)
    ck.slice(1, 0, T).copy_from(k_prefill)          # host -> device, rows [0, T)
    out = op(q, ck.slice(1, 0, T), cv.slice(1, 0, T)).out
    host = out.numpy()                              # when q was a DeviceTensor too

Software devices (lavapipe) need allow_software=True or ATTNOPS_VK_ALLOW_SOFTWARE=1.)")
      .def_static(
          "zeros",
          [](const std::vector<std::int64_t>& shape, py::handle dtype, const std::string& device,
             bool allow_software) {
            const DType dt = parse_dtype_arg(dtype, "dtype");
            const GpuSettings g = gpu_settings(device, allow_software);
            DeviceTensor t = without_gil([&] { return DeviceTensor::zeros(dt, shape, g); });
            return wrap_device_tensor(std::move(t));
          },
          py::arg("shape"), py::arg("dtype") = "f32", py::kw_only(), py::arg("device") = "",
          py::arg("allow_software") = false,
          "A zero-filled device tensor. device: index or name substring ('' = the best device).")
      .def_static(
          "from_host",
          [](py::handle array, py::object dtype, const std::string& device, bool allow_software) {
            const bool bf16 = !dtype.is_none() && parse_dtype_arg(dtype, "dtype") == DType::bf16;
            BorrowedTensor src = borrow(array, "array", bf16);
            const GpuSettings g = gpu_settings(device, allow_software);
            DeviceTensor t = without_gil([&] { return DeviceTensor::from_host(src.view, g); });
            return wrap_device_tensor(std::move(t));
          },
          py::arg("array"), py::kw_only(), py::arg("dtype") = py::none(), py::arg("device") = "",
          py::arg("allow_software") = false,
          "A contiguous device copy of a host array (numpy or DLPack; dtype='bf16' for uint16 bf16 bits).")
      .def(
          "copy_from",
          [](PyDeviceTensor& self, py::handle array, py::object dtype) {
            const bool bf16 = !dtype.is_none() && parse_dtype_arg(dtype, "dtype") == DType::bf16;
            BorrowedTensor src = borrow(array, "array", bf16);
            DeviceTensor t = live(self);  // shares the storage: writes land in self
            without_gil([&] { t.copy_from(src.view); });
          },
          py::arg("array"), py::kw_only(), py::arg("dtype") = py::none(),
          "Overwrites this tensor (or view) with a host array of the same shape and dtype; only these "
          "elements move.")
      .def(
          "to_host",
          [](const PyDeviceTensor& self) {
            const DeviceTensor& t = live(self);
            Tensor host = without_gil([&] { return t.to_host(); });
            return to_python(std::move(host), ArrayKind::numpy);
          },
          "A contiguous host copy as a numpy array (bf16 as uint16 bit patterns).")
      .def(
          "numpy",
          [](const PyDeviceTensor& self) {
            const DeviceTensor& t = live(self);
            Tensor host = without_gil([&] { return t.to_host(); });
            return to_python(std::move(host), ArrayKind::numpy);
          },
          "Same as to_host().")
      .def(
          "torch",
          [](const PyDeviceTensor& self) {
            const DeviceTensor& t = live(self);
            Tensor host = without_gil([&] { return t.to_host(); });
            return to_python(std::move(host), ArrayKind::torch);
          },
          "A contiguous host copy as a torch CPU tensor (through DLPack; bf16 as torch.bfloat16).")
      .def(
          "slice",
          [](const PyDeviceTensor& self, int dim, std::int64_t begin, std::int64_t end) {
            return wrap_device_tensor(live(self).slice(dim, begin, end));
          },
          py::arg("dim"), py::arg("begin"), py::arg("end"),
          "A view over rows [begin, end) of dimension dim (no copy).")
      .def_property_readonly("shape",
                             [](const PyDeviceTensor& s) { return py::tuple(py::cast(live(s).shape())); })
      .def_property_readonly("dtype",
                             [](const PyDeviceTensor& s) { return std::string(dtype_name(live(s).dtype())); })
      .def_property_readonly(
          "strides",
          [](const PyDeviceTensor& s) {
            const DeviceTensor& t = live(s);
            std::vector<std::int64_t> st;
            for (int i = 0; i < t.rank(); ++i) st.push_back(t.stride(i));
            return py::tuple(py::cast(st));
          },
          "Strides in elements.")
      .def_property_readonly(
          "offset", [](const PyDeviceTensor& s) { return live(s).offset(); },
          "Element offset of element 0 in the device storage.")
      .def_property_readonly("is_contiguous", [](const PyDeviceTensor& s) { return live(s).is_contiguous(); })
      .def_property_readonly("device", [](const PyDeviceTensor& s) { return live(s).device(); })
      .def(
          "__dlpack_device__", [](const PyDeviceTensor&) { return py::make_tuple(7, 0); },
          "(kDLVulkan, 0): device memory.")
      .def(
          "__dlpack__",
          [](const PyDeviceTensor&, py::args, py::kwargs) {
            throw py::buffer_error(
                "attnops.DeviceTensor: Vulkan device memory cannot be exported through DLPack; use .numpy() "
                "or .torch() for a host copy");
          },
          "Refused: no DLPack consumer reads Vulkan memory.")
      .def("__repr__", &describe);
  g_device_tensor_type = reinterpret_cast<PyTypeObject*>(py::type::of<PyDeviceTensor>().ptr());

  m.def(
      "release_gpu",
      [] {
        py::gil_scoped_release release;
        std::unique_lock lock(gpu_lifetime());  // waits for running calls
        attnops::release_gpu();
      },
      R"(Waits for the GPU and destroys the process's GPU state (Vulkan instance, devices, memory
pools, pipelines). Device tensors alive then can only be dropped. The next GPU call starts the
state again. Called at interpreter exit (atexit) as well.)");
  m.def(
      "calls_in_flight", [] { return calls_in_flight().load(); },
      "attnops calls now running with the GIL released (on any thread).");
}

}  // namespace attnops::python
