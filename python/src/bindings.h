// The pieces of the _attnops extension module, one bind_* function per file (module.cpp calls
// them in order). The extension uses the public C++ API only (<attnops/...>).
#pragma once

#include <pybind11/pybind11.h>

namespace py = pybind11;

namespace attnops::python {

void bind_errors(py::module_& m);    // errors.cpp: attnops::Error -> one Python class per code
void bind_mask(py::module_& m);      // mask.cpp: attnops.Mask
void bind_device(py::module_& m);    // device.cpp: attnops.DeviceTensor, release_gpu
void bind_operator(py::module_& m);  // operator.cpp: Operator, Result, Gradients, Config
void bind_host_info(py::module_& m);
void bind_paged(py::module_& m);  // paged.cpp: PagedKVCache, RaggedBatch, PagedPlan, merge_states  //
                                  // host_info.cpp: what `attnops info` reports, as data

}  // namespace attnops::python
