// Inputs from Python without copies. One Python object (a numpy array, through the buffer
// protocol; anything with __dlpack__, e.g. a PyTorch CPU tensor, bf16 included; an
// attnops.DeviceTensor) is viewed as an attnops::TensorView for the length of one call:
//
//   numpy     data pointer, shape and byte strides of the ndarray (strides / itemsize = element
//             strides); float32 -> f32, float16 -> f16, uint16 -> bf16 when the call says
//             dtype="bf16", int32 / int64 -> i32 / i64 (segment ids). The array is held.
//   DLPack    obj.__dlpack__() (for a torch tensor torch.utils.dlpack.to_dlpack(obj), the C function
//             behind __dlpack__; one that requires grad is detach()ed first: a view, no copy);
//             the legacy "dltensor" capsule is consumed (renamed "used_dltensor") and its
//             deleter runs when the view is dropped, with the GIL held. kDLCPU only.
//   device    DeviceTensor::view(); the Python object is held.
//
// Views keep their strides (a slice of a KV cache is passed as a slice). A view whose innermost
// stride is not 1 is passed as is too: the library copies it and records the bytes in
// decision.run.bytes_copied. Nothing here copies.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>

#include "attnops/tensor.h"

struct DLManagedTensor;

namespace py = pybind11;

namespace attnops::python {

// What the caller passed, so that outputs come back as the same kind.
enum class ArrayKind : std::uint8_t {
  numpy,   // numpy in, numpy out (also other buffer-protocol objects)
  torch,   // torch in (DLPack), torch out (DLPack, torch.utils.dlpack.from_dlpack)
  dlpack,  // another DLPack producer: outputs are numpy arrays
  device,  // attnops.DeviceTensor
};

class BorrowedTensor {
 public:
  BorrowedTensor() = default;
  BorrowedTensor(BorrowedTensor&& other) noexcept;
  BorrowedTensor& operator=(BorrowedTensor&& other) noexcept;
  BorrowedTensor(const BorrowedTensor&) = delete;
  BorrowedTensor& operator=(const BorrowedTensor&) = delete;
  ~BorrowedTensor();  // the DLPack deleter, if a capsule was consumed (the GIL must be held)

  TensorView view;
  ArrayKind kind = ArrayKind::numpy;

 private:
  friend BorrowedTensor borrow(py::handle, const char*, bool);
  friend BorrowedTensor borrow_writable(py::handle, const char*, bool);
  void release() noexcept;
  py::object owner_;                    // the numpy array / DeviceTensor object
  DLManagedTensor* managed_ = nullptr;  // a consumed DLPack capsule's tensor
};

// Views `obj` (argument `name`, for messages). uint16_is_bf16: a uint16 array (numpy) or a
// kDLUInt 16 DLPack tensor holds bf16 bit patterns (the call's dtype="bf16").
// Errors: TypeError for an object that is no array; attnops.UnsupportedDtype for a dtype attnops
// does not store (float64, ...); attnops.InvalidArgument for memory it cannot view (a GPU
// DLPack tensor, a byte stride that is not a multiple of the element size, a misaligned or
// byte-swapped numpy array).
BorrowedTensor borrow(py::handle obj, const char* name, bool uint16_is_bf16);

// As borrow(), for memory attnops will write into (PagedKVCache.wrap's pools): a read-only numpy
// array or buffer (a read-only memory map, an array over bytes, a broadcast view) is refused with
// attnops.InvalidArgument naming `name`, before anything could write through it.
BorrowedTensor borrow_writable(py::handle obj, const char* name, bool uint16_is_bf16);

// Whether `obj` is a torch.Tensor (false until torch is imported; torch is never imported here).
bool is_torch_tensor(py::handle obj);

}  // namespace attnops::python
