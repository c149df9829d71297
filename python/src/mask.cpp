// attnops.Mask: static masks as combinable objects (attnops/mask.h), with & and |.
#include "attnops/mask.h"

#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "bindings.h"

namespace attnops::python {
namespace {

const char* kind_name(Mask::Kind k) {
  switch (k) {
    case Mask::Kind::full:
      return "full";
    case Mask::Kind::causal:
      return "causal";
    case Mask::Kind::local:
      return "local";
    case Mask::Kind::chunked_causal:
      return "chunked_causal";
    case Mask::Kind::per_head:
      return "per_head";
    case Mask::Kind::all_of:
      return "all_of";
    case Mask::Kind::any_of:
      return "any_of";
    case Mask::Kind::offset:
      return "offset";
  }
  return "?";
}

}  // namespace

void bind_mask(py::module_& m) {
  py::class_<Mask>(m, "Mask", R"(A static attention mask (rows aligned bottom-right: query i sits at
absolute position p = i + Tk - Tq). Combine with & and |; pass as mask=... (ANDed with causal,
sliding_window and chunk_size).

    Mask.causal() & Mask.local(256, 0)      # causal sliding window of 256 keys
    Mask.per_head([Mask.causal(), Mask.full()])   # one mask per q head)")
      .def(py::init<>(), "The full mask (every key visible).")
      .def_static("full", &Mask::full, "Every key visible.")
      .def_static("causal", &Mask::causal, "Key j visible from query position p when j <= p.")
      .def_static("local", &Mask::local, py::arg("left"), py::arg("right"),
                  "Keys p - left <= j <= p + right (both >= 0).")
      .def_static("chunked_causal", &Mask::chunked_causal, py::arg("chunk"),
                  "j <= p and floor(j / chunk) == floor(p / chunk) (chunk >= 1).")
      .def_static("per_head", &Mask::per_head, py::arg("masks"), "One mask per q head.")
      .def("at_offset", &Mask::at_offset, py::arg("q_offset"), py::arg("k_offset"), py::arg("tq"),
           py::arg("tk"),
           "This mask seen from the block of a (tq, tk) problem whose rows start at q_offset and "
           "columns at k_offset (a shard of a sequence-parallel problem).")
      .def("__and__", &Mask::operator&, py::is_operator())
      .def("__or__", &Mask::operator|, py::is_operator())
      .def_property_readonly("kind", [](const Mask& k) { return kind_name(k.kind()); })
      .def_property_readonly("key", &Mask::key, "Canonical text, e.g. '(causal&local(32,0))'.")
      .def_property_readonly("left", &Mask::left)
      .def_property_readonly("right", &Mask::right)
      .def_property_readonly("chunk", &Mask::chunk)
      .def_property_readonly("children", &Mask::children)
      .def_property_readonly("num_heads", &Mask::num_heads)
      .def("visible", &Mask::visible, py::arg("h"), py::arg("i"), py::arg("j"), py::arg("tq"), py::arg("tk"),
           "Whether key j is visible from query row i of q head h, for Tq queries and Tk keys.")
      .def(
          "__eq__", [](const Mask& a, const Mask& b) { return a.key() == b.key(); }, py::is_operator())
      .def("__hash__", [](const Mask& a) { return py::hash(py::str(a.key())); })
      .def("__repr__", [](const Mask& a) { return "attnops.Mask('" + a.key() + "')"; });
}

}  // namespace attnops::python
