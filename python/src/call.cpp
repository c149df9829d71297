// One call's keyword arguments (call.h).
#include "call.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstring>
#include <string_view>

#include "attnops/error.h"

namespace attnops::python {
namespace {

constexpr std::array<const char*, kNumKeywords> kKeywords = {
    "causal",          "sliding_window", "chunk_size",    "segment_ids_q", "segment_ids_kv", "bias",
    "logits_soft_cap", "sinks",          "mask",          "return_lse",    "return_weights", "profile",
    "backend",         "softmax_scale",  "runtime_dtype", "num_threads",   "dtype"};

// Names other libraries (and the C++ struct) use for the same options.
constexpr std::array<std::pair<const char*, const char*>, 9> kOtherNames = {
    {{"softmax_aux", "sinks"},
     {"window", "sliding_window"},
     {"window_size", "sliding_window"},
     {"scale", "softmax_scale"},
     {"sm_scale", "softmax_scale"},
     {"softcap", "logits_soft_cap"},
     {"attn_bias", "bias"},
     {"is_causal", "causal"},
     {"chunk", "chunk_size"}}};

std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diag = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

[[noreturn]] void unknown_keyword(std::string_view key) {
  std::string msg = "unexpected keyword argument '" + std::string(key) + "'";
  const char* best = nullptr;
  std::size_t best_d = 4;  // suggest a keyword at most 3 edits away
  for (const char* k : kKeywords)
    if (const std::size_t d = edit_distance(key, k); d < best_d) best_d = d, best = k;
  for (const auto& [other, ours] : kOtherNames)
    if (key == other) best = ours;
  if (best) msg += "; did you mean '" + std::string(best) + "'?";
  msg += " (options:";
  for (std::size_t i = 0; i < kKeywords.size(); ++i) msg += std::string(i ? ", " : " ") + kKeywords[i];
  msg += ")";
  throw py::type_error(msg);
}

std::string type_name(py::handle obj) {
  return Py_TYPE(obj.ptr())->tp_name;
}

double as_double(py::handle obj, const char* what) {
  if (PyBool_Check(obj.ptr()) || !PyNumber_Check(obj.ptr()))
    throw py::type_error(std::string(what) + ": expected a number, got " + type_name(obj));
  const double v = PyFloat_AsDouble(obj.ptr());
  if (v == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": expected a number, got " + type_name(obj));
  }
  return v;
}

Window as_window(py::handle obj) {
  if (PyLong_Check(obj.ptr()) && !PyBool_Check(obj.ptr())) return Window{as_int(obj, "sliding_window"), 0};
  if (PyTuple_Check(obj.ptr()) || PyList_Check(obj.ptr())) {
    py::sequence s = py::reinterpret_borrow<py::sequence>(obj);
    if (s.size() == 2)
      return Window{as_int(s[0], "sliding_window[0] (left)"), as_int(s[1], "sliding_window[1] (right)")};
  }
  throw py::type_error("sliding_window: expected (left, right) or left (right = 0), got " + type_name(obj));
}

}  // namespace

bool as_bool(py::handle obj, const char* what) {
  if (obj.ptr() == Py_True) return true;
  if (obj.ptr() == Py_False) return false;
  // numpy.bool_ (and other bool-likes that are not numbers in disguise)
  if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "numpy.bool_") == 0) return PyObject_IsTrue(obj.ptr()) == 1;
  throw py::type_error(std::string(what) + ": expected True or False, got " + type_name(obj));
}

std::int64_t as_int(py::handle obj, const char* what) {
  if (PyFloat_Check(obj.ptr()) || PyBool_Check(obj.ptr()))
    throw py::type_error(std::string(what) + ": expected an integer, got " + type_name(obj));
  PyObject* i = PyNumber_Index(obj.ptr());
  if (i == nullptr) {
    PyErr_Clear();
    throw py::type_error(std::string(what) + ": expected an integer, got " + type_name(obj));
  }
  const long long v = PyLong_AsLongLong(i);
  Py_DECREF(i);
  if (v == -1 && PyErr_Occurred()) {
    PyErr_Clear();
    throw Error(ErrorCode::invalid_argument, std::string(what) + ": integer out of the int64 range");
  }
  return v;
}

DType parse_dtype_arg(py::handle obj, const char* what) {
  std::string s;
  if (PyUnicode_Check(obj.ptr()))
    s = obj.cast<std::string>();
  else if (std::strcmp(Py_TYPE(obj.ptr())->tp_name, "torch.dtype") == 0)
    s = py::str(obj);  // "torch.float16"
  else {
    try {  // a numpy dtype or scalar type (numpy.float16): numpy.dtype(obj).name
      s = py::str(py::module_::import("numpy").attr("dtype")(obj).attr("name"));
    } catch (const py::error_already_set&) {
      throw py::type_error(std::string(what) + ": expected a dtype name (\"f32\", \"f16\", \"bf16\"), got " +
                           type_name(obj));
    }
  }
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  if (s == "float32" || s == "float") s = "f32";
  if (s == "float16" || s == "half") s = "f16";
  if (s == "bfloat16") s = "bf16";
  const auto dt = parse_dtype(s);
  if (!dt || !is_float(*dt))
    throw Error(ErrorCode::invalid_argument,
                std::string(what) + ": expected \"f32\", \"f16\" or \"bf16\", got '" + s + "'");
  return *dt;
}

std::vector<Backend> parse_backends(py::handle obj, const char* what) {
  std::vector<std::string> names;
  if (PyUnicode_Check(obj.ptr())) {
    const std::string s = obj.cast<std::string>();
    if (s == "auto") return {};
    std::size_t start = 0;
    while (start <= s.size()) {
      const std::size_t comma = s.find(',', start);
      names.push_back(s.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
      if (comma == std::string::npos) break;
      start = comma + 1;
    }
  } else if (PyTuple_Check(obj.ptr()) || PyList_Check(obj.ptr())) {
    for (py::handle h : py::reinterpret_borrow<py::sequence>(obj)) {
      if (!PyUnicode_Check(h.ptr()))
        throw py::type_error(std::string(what) + ": expected backend names, got " + type_name(h));
      names.push_back(h.cast<std::string>());
    }
  } else {
    throw py::type_error(std::string(what) + ": expected \"auto\", a backend name or a list of them, got " +
                         type_name(obj));
  }
  std::vector<Backend> out;
  for (const std::string& n : names) {
    const auto b = parse_backend(n);
    if (!b)
      throw Error(ErrorCode::invalid_argument, std::string(what) + ": unknown backend '" + n +
                                                   "' (expected auto or a list of native, cpu, gpu, tpu)");
    out.push_back(*b);
  }
  return out;
}

CallArgs parse_call_args(const py::kwargs& kwargs) {
  CallValues values{};
  if (kwargs)
    for (auto [key_h, value] : kwargs) {
      const std::string_view key = PyUnicode_AsUTF8(key_h.ptr());
      const auto at =
          std::find_if(kKeywords.begin(), kKeywords.end(), [&](const char* k) { return key == k; });
      if (at == kKeywords.end()) unknown_keyword(key);
      values[static_cast<std::size_t>(at - kKeywords.begin())] = value;
    }
  return parse_call_values(values);
}

CallArgs parse_call_values(const CallValues& values) {
  CallArgs a;
  const auto given = [&](Keyword k) -> py::handle { return values[static_cast<std::size_t>(k)]; };
  const auto set = [&](Keyword k) { return given(k) && !given(k).is_none(); };
  // dtype first: it says how the option arrays below are read.
  if (set(Keyword::dtype)) {
    const DType dt = parse_dtype_arg(given(Keyword::dtype), "dtype");
    if (dt != DType::bf16)
      throw Error(ErrorCode::invalid_argument,
                  "dtype: only \"bf16\" is meaningful (uint16 arrays hold bf16 bit patterns); f32 / f16 "
                  "arrays carry their own dtype, and runtime_dtype converts");
    a.uint16_is_bf16 = true;
  }
  AttentionOptions& o = a.options;
  if (given(Keyword::causal)) o.causal = as_bool(given(Keyword::causal), "causal");
  if (set(Keyword::sliding_window)) o.sliding_window = as_window(given(Keyword::sliding_window));
  if (set(Keyword::chunk_size)) o.chunk_size = as_int(given(Keyword::chunk_size), "chunk_size");
  if (set(Keyword::segment_ids_q))
    o.segment_ids_q =
        a.segment_ids_q.emplace(borrow(given(Keyword::segment_ids_q), "segment_ids_q", false)).view;
  if (set(Keyword::segment_ids_kv))
    o.segment_ids_kv =
        a.segment_ids_kv.emplace(borrow(given(Keyword::segment_ids_kv), "segment_ids_kv", false)).view;
  if (set(Keyword::bias))
    o.bias = a.bias.emplace(borrow(given(Keyword::bias), "bias", a.uint16_is_bf16)).view;
  if (set(Keyword::logits_soft_cap))
    o.logits_soft_cap = as_double(given(Keyword::logits_soft_cap), "logits_soft_cap");
  if (set(Keyword::sinks))
    o.sinks = a.sinks.emplace(borrow(given(Keyword::sinks), "sinks", a.uint16_is_bf16)).view;
  if (set(Keyword::mask)) {
    const py::handle m = given(Keyword::mask);
    if (!py::isinstance<Mask>(m)) throw py::type_error("mask: expected an attnops.Mask, got " + type_name(m));
    o.mask = m.cast<Mask>();
  }
  if (given(Keyword::return_lse)) o.return_lse = as_bool(given(Keyword::return_lse), "return_lse");
  if (given(Keyword::return_weights))
    o.return_weights = as_bool(given(Keyword::return_weights), "return_weights");
  if (given(Keyword::profile)) o.profile = as_bool(given(Keyword::profile), "profile");
  if (set(Keyword::backend)) o.backends = parse_backends(given(Keyword::backend), "backend");
  if (set(Keyword::softmax_scale))
    o.softmax_scale = as_double(given(Keyword::softmax_scale), "softmax_scale");
  if (set(Keyword::runtime_dtype))
    o.runtime_dtype = parse_dtype_arg(given(Keyword::runtime_dtype), "runtime_dtype");
  if (set(Keyword::num_threads)) {
    const std::int64_t n = as_int(given(Keyword::num_threads), "num_threads");
    if (n < 0 || n > INT_MAX)
      throw Error(ErrorCode::invalid_argument,
                  "num_threads: expected 0 (OpenMP's default) or a positive count, got " + std::to_string(n));
    o.num_threads = static_cast<int>(n);
  }
  return a;
}

}  // namespace attnops::python
