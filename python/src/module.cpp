// _attnops: the compiled half of the Python package `attnops` (python/attnops/__init__.py is the
// other). A thin layer over the public C++ API; see python/README.md.
#include "bindings.h"

PYBIND11_MODULE(_attnops, m) {
  m.doc() = "attnops: attention operators with backend dispatch (compiled core; import attnops instead)";
  m.attr("__version__") = ATTNOPS_VERSION;  // the CMake project's version
  attnops::python::bind_errors(m);
  attnops::python::bind_mask(m);
  attnops::python::bind_device(m);
  attnops::python::bind_paged(m);  // before Operator: its paged() takes these types
  attnops::python::bind_operator(m);
  attnops::python::bind_host_info(m);
}
