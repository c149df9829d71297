// Outputs to Python without copies: an attnops::Tensor (shared storage) becomes
//   numpy   an ndarray over the tensor's memory, which a capsule owning the Tensor keeps alive
//           (bf16 as uint16 bit patterns: numpy has no bfloat16);
//   torch   a torch.Tensor through DLPack (torch.utils.dlpack.from_dlpack of a "dltensor" capsule
//           whose deleter frees the Tensor), bf16 as torch.bfloat16.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "arrays.h"
#include "attnops/tensor.h"

namespace py = pybind11;

namespace attnops::python {

py::object to_python(Tensor t, ArrayKind kind);
py::object to_python(std::optional<Tensor> t, ArrayKind kind);  // None when empty

// A "dltensor" capsule over `t` (the DLPack producer side; also DeviceTensor-free host tensors).
py::capsule to_dlpack_capsule(Tensor t);

}  // namespace attnops::python
