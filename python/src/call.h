// One call's keyword arguments, from Python to the C++ API.
//
// Every option of attnops::AttentionOptions is a keyword (same names; softmax_aux is `sinks`):
//   causal=True, sliding_window=None (L, R) or L, chunk_size=None, segment_ids_q=None,
//   segment_ids_kv=None, bias=None, logits_soft_cap=None, sinks=None, mask=None (attnops.Mask),
//   return_lse=False, return_weights=False, profile=False
// plus the per-call settings (AttentionOptions::backends, softmax_scale, runtime_dtype,
// num_threads: each overrides the operator's metadata for this call only):
//   backend=None ("auto", "cpu", "native,cpu", ["gpu", "cpu"]), softmax_scale=None,
//   runtime_dtype=None ("f32" | "f16" | "bf16"), num_threads=None
// and how to read uint16 arrays: dtype="bf16" (numpy has no bfloat16).
// An unknown keyword is a TypeError naming it (and the nearest known one).
#pragma once

#include <pybind11/pybind11.h>

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "attnops/decision.h"
#include "attnops/options.h"

namespace py = pybind11;

namespace attnops::python {

struct CallArgs {
  AttentionOptions options;  // the per-call settings included
  bool uint16_is_bf16 = false;
  // The option tensors, held for the call (options' TensorViews point into them).
  std::optional<BorrowedTensor> segment_ids_q, segment_ids_kv, bias, sinks;
};

// The keywords, in the order of the positional form (attnops/_operator.py passes them so).
enum class Keyword {
  causal,
  sliding_window,
  chunk_size,
  segment_ids_q,
  segment_ids_kv,
  bias,
  logits_soft_cap,
  sinks,
  mask,
  return_lse,
  return_weights,
  profile,
  backend,
  softmax_scale,
  runtime_dtype,
  num_threads,
  dtype
};
inline constexpr std::size_t kNumKeywords = 17;
// One value per keyword, in Keyword's order; a null handle or None is "not given" (None is a
// value only for the bools, where it is a TypeError).
using CallValues = std::array<py::handle, kNumKeywords>;

// Parses keyword arguments (the forward's, plan's and backward's: the backward ignores
// return_lse / return_weights, as the C++ API does). An unknown keyword is a TypeError naming the
// nearest known one.
CallArgs parse_call_args(const py::kwargs& kwargs);
// The same from values in Keyword's order: the declared wrapper's fast path (no dict, no names).
CallArgs parse_call_values(const CallValues& values);

// "f32", "f16", "bf16" (also "float32", "float16", "bfloat16", a numpy dtype or torch dtype of
// those); TypeError / ValueError naming `what` otherwise.
DType parse_dtype_arg(py::handle obj, const char* what);

// True or False (or a numpy bool): TypeError naming `what` otherwise.
bool as_bool(py::handle obj, const char* what);

// An integer argument (int, numpy integer, anything with __index__; not bool or float): TypeError
// naming `what` otherwise, attnops.InvalidArgument past the int64 range.
std::int64_t as_int(py::handle obj, const char* what);

// Parses a backend list: "auto" (empty), "cpu", "gpu,cpu", ["gpu", "cpu"].
std::vector<Backend> parse_backends(py::handle obj, const char* what);

}  // namespace attnops::python
