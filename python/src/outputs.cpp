// Outputs to Python without copies (outputs.h).
#include "outputs.h"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>

#include <array>
#include <utility>
#include <vector>

namespace attnops::python {
namespace {

// One exported tensor: the Tensor (which owns the memory through shared storage) and the shape
// and stride arrays the DLTensor points into. Freed by the DLPack deleter.
struct Exported {
  Tensor tensor;
  std::array<std::int64_t, kMaxRank> shape{}, strides{};
  DLManagedTensor managed{};
};

DLDataType dl_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return {kDLFloat, 32, 1};
    case DType::f16:
      return {kDLFloat, 16, 1};
    case DType::bf16:
      return {kDLBfloat, 16, 1};
    case DType::i32:
      return {kDLInt, 32, 1};
    case DType::i64:
      return {kDLInt, 64, 1};
    case DType::i8:
      return {kDLInt, 8, 1};
    case DType::fp8_e4m3:
      return {kDLUInt, 8, 1};  // e4m3 bit patterns
  }
  return {kDLFloat, 32, 1};
}

py::dtype numpy_dtype(DType t) {
  constexpr int kNpyHalf = 23;  // NPY_HALF (numpy's float16)
  switch (t) {
    case DType::f32:
      return py::dtype::of<float>();
    case DType::f16:
      return py::dtype(kNpyHalf);
    case DType::bf16:
      return py::dtype::of<std::uint16_t>();  // bit patterns: numpy has no bfloat16
    case DType::i32:
      return py::dtype::of<std::int32_t>();
    case DType::i64:
      return py::dtype::of<std::int64_t>();
    case DType::i8:
      return py::dtype::of<std::int8_t>();
    case DType::fp8_e4m3:
      return py::dtype::of<std::uint8_t>();  // e4m3 bit patterns: numpy has no fp8
  }
  return py::dtype::of<float>();
}

py::object numpy_from(Tensor t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end()), strides(shape.size());
  py::ssize_t s = static_cast<py::ssize_t>(dtype_size(t.dtype()));
  for (std::size_t i = shape.size(); i-- > 0;) {
    strides[i] = s;
    s *= shape[i];
  }
  void* data = t.data();
  py::dtype dt = numpy_dtype(t.dtype());
  auto* owner = new Tensor(std::move(t));
  py::capsule base(owner, [](void* p) { delete static_cast<Tensor*>(p); });
  return py::array(dt, std::move(shape), std::move(strides), data, base);
}

PyObject* cached_torch_from_dlpack() {
  static PyObject* fn = nullptr;  // a leaked reference: no Python object in a static destructor
  if (fn == nullptr)
    fn = py::object(py::module_::import("torch.utils.dlpack").attr("from_dlpack")).release().ptr();
  return fn;
}

}  // namespace

py::capsule to_dlpack_capsule(Tensor t) {
  auto* e = new Exported{std::move(t), {}, {}, {}};
  const int rank = e->tensor.rank();
  std::int64_t s = 1;
  for (int i = rank; i-- > 0;) {
    e->shape[static_cast<std::size_t>(i)] = e->tensor.dim(i);
    e->strides[static_cast<std::size_t>(i)] = s;
    s *= e->tensor.dim(i);
  }
  DLTensor& d = e->managed.dl_tensor;
  d.data = e->tensor.data();
  d.device = {kDLCPU, 0};
  d.ndim = rank;
  d.dtype = dl_dtype(e->tensor.dtype());
  d.shape = e->shape.data();
  d.strides = e->strides.data();
  d.byte_offset = 0;
  e->managed.manager_ctx = e;
  e->managed.deleter = [](DLManagedTensor* self) { delete static_cast<Exported*>(self->manager_ctx); };
  // The capsule frees the tensor only if no consumer took it (a consumer renames it).
  PyObject* cap = PyCapsule_New(&e->managed, "dltensor", [](PyObject* capsule) {
    if (PyCapsule_IsValid(capsule, "dltensor")) {
      auto* m = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule, "dltensor"));
      m->deleter(m);
    }
  });
  if (cap == nullptr) {
    delete e;
    throw py::error_already_set();
  }
  return py::reinterpret_steal<py::capsule>(cap);
}

py::object to_python(Tensor t, ArrayKind kind) {
  if (kind == ArrayKind::torch) {
    py::capsule cap = to_dlpack_capsule(std::move(t));
    PyObject* r = PyObject_CallOneArg(cached_torch_from_dlpack(), cap.ptr());
    if (r == nullptr) throw py::error_already_set();
    return py::reinterpret_steal<py::object>(r);
  }
  return numpy_from(std::move(t));
}

py::object to_python(std::optional<Tensor> t, ArrayKind kind) {
  if (!t) return py::none();
  return to_python(std::move(*t), kind);
}

}  // namespace attnops::python
