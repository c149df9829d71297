// attnops::Error -> a Python exception of the class for its code (attnops/_errors.py defines
// them: attnops.ShapeMismatch, attnops.UnsupportedDtype, ..., all deriving from attnops.Error),
// with the C++ message. The classes are handed over once at import (_set_error_types); before
// that, or for a code without a class, RuntimeError. A message about the C++ option softmax_aux
// names the Python keyword too ("sinks (softmax_aux): ...").
#include <array>
#include <string>
#include <string_view>

#include "attnops/error.h"
#include "bindings.h"

namespace attnops::python {
namespace {

constexpr int kCodes = static_cast<int>(ErrorCode::internal) + 1;

// Leaked references (set once at import): no Python object in a static destructor.
std::array<PyObject*, kCodes>& error_types() {
  static std::array<PyObject*, kCodes> types{};
  return types;
}

}  // namespace

void bind_errors(py::module_& m) {
  m.def(
      "_set_error_types",
      [](const py::dict& by_code) {
        for (int c = 0; c < kCodes; ++c) {
          const std::string name(error_code_name(static_cast<ErrorCode>(c)));
          if (!by_code.contains(name)) throw py::key_error("no exception class for error code " + name);
          py::object cls = by_code[name.c_str()];
          if (!PyType_Check(cls.ptr()) || !PyType_IsSubtype(reinterpret_cast<PyTypeObject*>(cls.ptr()),
                                                            reinterpret_cast<PyTypeObject*>(PyExc_Exception)))
            throw py::type_error("the class for error code " + name + " is not an exception class");
          PyObject*& slot = error_types()[static_cast<std::size_t>(c)];
          Py_XDECREF(slot);
          slot = cls.release().ptr();
        }
      },
      "Internal: the exception class for each attnops::ErrorCode (attnops/_errors.py).");
  m.def(
      "error_codes",
      [] {
        py::list codes;
        for (int c = 0; c < kCodes; ++c)
          codes.append(py::str(std::string(error_code_name(static_cast<ErrorCode>(c)))));
        return codes;
      },
      "The error codes of attnops::Error, in the C++ enum's order.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      const auto c = static_cast<std::size_t>(e.code());
      PyObject* type = c < error_types().size() && error_types()[c] ? error_types()[c] : PyExc_RuntimeError;
      // The C++ option softmax_aux is the keyword sinks in Python: name both.
      const std::string_view what = e.what(), aux = "softmax_aux";
      if (what.substr(0, aux.size()) == aux)
        PyErr_SetString(type, ("sinks (softmax_aux)" + std::string(what.substr(aux.size()))).c_str());
      else
        PyErr_SetString(type, e.what());
    }
  });
}

}  // namespace attnops::python
