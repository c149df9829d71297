// Inputs from Python without copies (arrays.h).
#include "arrays.h"

#include <dlpack/dlpack.h>
#include <pybind11/numpy.h>

#include <string>
#include <vector>

#include "attnops/error.h"
#include "device.h"

namespace attnops::python {
namespace {

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

std::string type_name(py::handle obj) {
  return Py_TYPE(obj.ptr())->tp_name;
}

// numpy: the storage dtype of a dtype of `kind` ('f', 'i', 'u') and `size` bytes. The dtype's
// text (numpy's str(), Python code) is made only for the message.
DType numpy_dtype(char kind, int size, bool uint16_is_bf16, const char* name, py::handle descr) {
  if (kind == 'f' && size == 4) return DType::f32;
  if (kind == 'f' && size == 2) return DType::f16;
  if (kind == 'u' && size == 2 && uint16_is_bf16) return DType::bf16;
  if (kind == 'i' && size == 4) return DType::i32;
  if (kind == 'i' && size == 8) return DType::i64;
  if (kind == 'i' && size == 1) return DType::i8;  // the codes of an int8 KV cache
  std::string msg = std::string(name) + ": numpy dtype " + std::string(py::str(descr)) +
                    " is not supported (attnops stores float32, float16 and bf16; segment ids int32 / int64)";
  if (kind == 'u' && size == 2) msg += "; a uint16 array holding bf16 bit patterns needs dtype=\"bf16\"";
  if (kind == 'u' && size == 1)
    msg += "; a uint8 array of KV pages holding e4m3 bit patterns needs dtype=\"fp8_e4m3\"";
  if (kind == 'f' && size == 8) msg += "; convert with .astype(numpy.float32)";
  fail(ErrorCode::unsupported_dtype, msg);
}

DType dlpack_dtype(const DLDataType& t, bool uint16_is_bf16, const char* name) {
  if (t.lanes == 1) {
    if (t.code == kDLFloat && t.bits == 32) return DType::f32;
    if (t.code == kDLFloat && t.bits == 16) return DType::f16;
    if (t.code == kDLBfloat && t.bits == 16) return DType::bf16;
    if (t.code == kDLUInt && t.bits == 16 && uint16_is_bf16) return DType::bf16;
    if (t.code == kDLInt && t.bits == 32) return DType::i32;
    if (t.code == kDLInt && t.bits == 64) return DType::i64;
    if (t.code == kDLInt && t.bits == 8) return DType::i8;  // the codes of an int8 KV cache
  }
  static const char* codes[] = {"int", "uint", "float", "opaque", "bfloat", "complex"};
  const std::string code = t.code < 6 ? codes[t.code] : "code " + std::to_string(t.code);
  fail(ErrorCode::unsupported_dtype, std::string(name) + ": DLPack dtype " + code + std::to_string(t.bits) +
                                         (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "") +
                                         " is not supported (attnops stores float32, float16 and bfloat16; "
                                         "segment ids int32 / int64)");
}

std::string dims_text(const std::vector<std::int64_t>& v) {
  return shape_string(v);
}

// Element strides from byte strides; each must be a multiple of the element size.
std::vector<std::int64_t> element_strides(const std::vector<std::int64_t>& bytes, std::int64_t itemsize,
                                          const char* name) {
  std::vector<std::int64_t> out(bytes.size());
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    if (bytes[i] % itemsize != 0)
      fail(ErrorCode::invalid_argument,
           std::string(name) + ": byte stride " + std::to_string(bytes[i]) + " of dimension " +
               std::to_string(i) + " is not a multiple of the element size " + std::to_string(itemsize) +
               " (strides " + dims_text(bytes) + "); pass a copy, e.g. numpy.ascontiguousarray");
    out[i] = bytes[i] / itemsize;
  }
  return out;
}

constexpr int kNpyAligned = 0x0100;    // NPY_ARRAY_ALIGNED
constexpr int kNpyWriteable = 0x0400;  // NPY_ARRAY_WRITEABLE

TensorView numpy_view(py::handle obj, const char* name, bool uint16_is_bf16) {
  // The ndarray's fields directly (no temporary Python objects: this is the per-call path).
  const auto* arr = py::detail::array_proxy(obj.ptr());
  const auto* descr = py::detail::array_descriptor_proxy(arr->descr);
  const py::handle descr_h(arr->descr);
  const DType dtype = numpy_dtype(descr->kind, descr->elsize, uint16_is_bf16, name, descr_h);
  if (descr->byteorder == '>')
    fail(ErrorCode::invalid_argument, std::string(name) + ": a big-endian numpy array (" +
                                          std::string(py::str(descr_h)) +
                                          "); convert it to native byte order first");
  if (!(arr->flags & kNpyAligned))
    fail(ErrorCode::invalid_argument,
         std::string(name) +
             ": a misaligned numpy array (its data is not aligned to its element size); pass a "
             "copy, e.g. numpy.ascontiguousarray");
  const int nd = arr->nd;
  std::vector<std::int64_t> shape(arr->dimensions, arr->dimensions + nd);
  std::vector<std::int64_t> bytes(arr->strides, arr->strides + nd);
  return TensorView(arr->data, dtype, shape, element_strides(bytes, descr->elsize, name));
}

// Buffer-protocol objects that are not ndarrays (memoryview, array.array, ...): numpy views them
// without a copy (PyArray_FromAny of a buffer).
bool is_buffer(py::handle obj) {
  return PyObject_CheckBuffer(obj.ptr()) != 0;
}

PyObject* cached_torch_tensor_type() {
  static PyObject* type = nullptr;  // a leaked reference: no Python object in a static destructor
  if (type == nullptr) {
    PyObject* modules = PyImport_GetModuleDict();
    PyObject* torch = PyDict_GetItemString(modules, "torch");  // borrowed; null: not imported
    if (torch == nullptr) return nullptr;
    PyObject* t = PyObject_GetAttrString(torch, "Tensor");
    if (t == nullptr) {
      PyErr_Clear();  // torch is still being imported
      return nullptr;
    }
    type = t;
  }
  return type;
}

// torch.utils.dlpack.to_dlpack: the C function behind Tensor.__dlpack__ (which wraps it in
// Python-level checks that cost more than the rest of the call; requires_grad is handled here).
PyObject* cached_torch_to_dlpack() {
  static PyObject* fn = nullptr;  // a leaked reference: no Python object in a static destructor
  if (fn == nullptr)
    fn = py::object(py::module_::import("torch.utils.dlpack").attr("to_dlpack")).release().ptr();
  return fn;
}

}  // namespace

bool is_torch_tensor(py::handle obj) {
  PyObject* type = cached_torch_tensor_type();
  if (type == nullptr) return false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(obj.ptr())) == type) return true;  // the common case, fast
  const int r = PyObject_IsInstance(obj.ptr(), type);
  if (r < 0) throw py::error_already_set();
  return r == 1;
}

BorrowedTensor::BorrowedTensor(BorrowedTensor&& o) noexcept
    : view(o.view), kind(o.kind), owner_(std::move(o.owner_)), managed_(o.managed_) {
  o.managed_ = nullptr;
}

BorrowedTensor& BorrowedTensor::operator=(BorrowedTensor&& o) noexcept {
  if (this != &o) {
    release();
    view = o.view;
    kind = o.kind;
    owner_ = std::move(o.owner_);
    managed_ = o.managed_;
    o.managed_ = nullptr;
  }
  return *this;
}

BorrowedTensor::~BorrowedTensor() {
  release();
}

void BorrowedTensor::release() noexcept {
  if (managed_ != nullptr && managed_->deleter != nullptr) managed_->deleter(managed_);
  managed_ = nullptr;
}

BorrowedTensor borrow(py::handle obj, const char* name, bool uint16_is_bf16) {
  BorrowedTensor b;
  if (py::isinstance<py::array>(obj)) {
    b.kind = ArrayKind::numpy;
    b.view = numpy_view(obj, name, uint16_is_bf16);
    b.owner_ = py::reinterpret_borrow<py::object>(obj);
    return b;
  }
  if (is_device_tensor(obj)) {
    b.kind = ArrayKind::device;
    b.view = obj.cast<const PyDeviceTensor&>().tensor.view();
    b.owner_ = py::reinterpret_borrow<py::object>(obj);
    return b;
  }
  if (PyObject_HasAttrString(obj.ptr(), "__dlpack__")) {
    b.kind = is_torch_tensor(obj) ? ArrayKind::torch : ArrayKind::dlpack;
    py::object src = py::reinterpret_borrow<py::object>(obj);
    // torch refuses to export a tensor that requires grad; detach() is a view, not a copy.
    if (b.kind == ArrayKind::torch && py::bool_(src.attr("requires_grad"))) src = src.attr("detach")();
    py::object capsule =
        b.kind == ArrayKind::torch
            ? py::reinterpret_steal<py::object>(PyObject_CallOneArg(cached_torch_to_dlpack(), src.ptr()))
            : src.attr("__dlpack__")();
    if (!capsule) throw py::error_already_set();
    if (!PyCapsule_IsValid(capsule.ptr(), "dltensor")) {
      const char* cname = PyCapsule_CheckExact(capsule.ptr()) ? PyCapsule_GetName(capsule.ptr()) : nullptr;
      PyErr_Clear();
      throw py::type_error(std::string(name) + ": " + type_name(obj) + ".__dlpack__() returned " +
                           (cname ? "a capsule named '" + std::string(cname) + "'" : "no capsule") +
                           ", expected an unused \"dltensor\" capsule");
    }
    b.managed_ = static_cast<DLManagedTensor*>(PyCapsule_GetPointer(capsule.ptr(), "dltensor"));
    // Consumed: the producer's capsule destructor must no longer free it; b's destructor calls
    // the deleter (DLPack's Python specification).
    if (PyCapsule_SetName(capsule.ptr(), "used_dltensor") != 0) throw py::error_already_set();
    const DLTensor& t = b.managed_->dl_tensor;
    if (t.device.device_type != kDLCPU)
      fail(ErrorCode::invalid_argument, std::string(name) + ": a DLPack tensor on device type " +
                                            std::to_string(static_cast<int>(t.device.device_type)) +
                                            " (attnops reads host memory: kDLCPU); move it to the CPU first "
                                            "(e.g. .cpu()), or use attnops.DeviceTensor for the GPU");
    const DType dtype = dlpack_dtype(t.dtype, uint16_is_bf16, name);
    if (t.ndim < 0 || t.ndim > kMaxRank)
      fail(ErrorCode::shape_mismatch,
           std::string(name) + ": rank " + std::to_string(t.ndim) + " exceeds the maximum of 4");
    std::vector<std::int64_t> shape(t.shape, t.shape + t.ndim);
    const void* data = static_cast<const char*>(t.data) + t.byte_offset;
    if (t.strides != nullptr)  // DLPack strides are in elements; null means compact row-major
      b.view = TensorView(data, dtype, shape, std::vector<std::int64_t>(t.strides, t.strides + t.ndim));
    else
      b.view = TensorView(data, dtype, shape);
    return b;
  }
  if (is_buffer(obj)) {
    py::array arr = py::array::ensure(obj);  // a view of the buffer, no copy
    if (!arr) throw py::error_already_set();
    b.kind = ArrayKind::numpy;
    b.view = numpy_view(arr, name, uint16_is_bf16);
    b.owner_ = std::move(arr);
    return b;
  }
  throw py::type_error(std::string(name) +
                       ": expected a numpy array, a tensor with __dlpack__ (e.g. a torch CPU "
                       "tensor) or an attnops.DeviceTensor, got " +
                       type_name(obj));
}

BorrowedTensor borrow_writable(py::handle obj, const char* name, bool uint16_is_bf16) {
  BorrowedTensor b = borrow(obj, name, uint16_is_bf16);
  // numpy arrays (and buffers, viewed through numpy) carry their writeability; DLPack tensors
  // (torch) and device tensors are writeable.
  if (b.kind == ArrayKind::numpy && !(py::detail::array_proxy(b.owner_.ptr())->flags & kNpyWriteable))
    fail(ErrorCode::invalid_argument,
         std::string(name) +
             ": a read-only array (flags.writeable is False: a read-only memory map, an array over bytes, a "
             "broadcast view...); the cache writes into its pools: pass a writeable array, e.g. a copy "
             "(numpy.array(x)) or numpy.load(..., mmap_mode=\"r+\")");
  return b;
}

}  // namespace attnops::python
