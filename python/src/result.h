// The result of one forward call as Python sees it (attnops.Result), shared by dense and paged
// calls, and the decision as a dict.
#pragma once

#include <pybind11/pybind11.h>

#include "attnops/decision.h"

namespace py = pybind11;

namespace attnops::python {

// The C++ decision's JSON as a dict, plus "pass" and "bytes_copied" always.
py::dict decision_dict(const DispatchDecision& d);

// The outputs of one forward call; unpacks as (out, lse, weights), None where not asked for.
struct Result {
  py::object out, lse, weights;
  DispatchDecision decision;
  py::object decision_cache;  // the dict, made on first access

  py::dict decision_as_dict() {
    if (!decision_cache) decision_cache = decision_dict(decision);
    return decision_cache;
  }
  py::tuple as_tuple() const { return py::make_tuple(out, lse, weights); }
};

}  // namespace attnops::python
