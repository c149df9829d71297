// attnops registry operators from Python: Operator (a configured attnops::Attention, callable),
// Result, Gradients and Config. See python/README.md for the Python API.
//
// Each call: the arguments are viewed without copies (arrays.h, call.h) with the GIL held; the
// C++ call runs with the GIL released (device.h: without_gil); the outputs come back in the kind
// of q (numpy, torch; a DeviceTensor when q was one), sharing the C++ tensors' memory
// (outputs.h). The decision is kept as the C++ struct and turned into a dict on first access.
#include <pybind11/stl.h>
#include <time.h>

#include <chrono>
#include <memory>
#include <string>
#include <utility>

#include "arrays.h"
#include "attnops/attnops.h"
#include "bindings.h"
#include "call.h"
#include "device.h"
#include "outputs.h"
#include "paged.h"
#include "result.h"

namespace attnops::python {
namespace {

PyObject* json_loads() {
  static PyObject* fn = nullptr;  // a leaked reference: no Python object in a static destructor
  if (fn == nullptr) fn = py::object(py::module_::import("json").attr("loads")).release().ptr();
  return fn;
}

}  // namespace

// The decision as a dict: the C++ JSON (requested, operator, backend, reasons [{code, detail}],
// kernel, ...), plus "pass" and "bytes_copied" always.
py::dict decision_dict(const DispatchDecision& d) {
  py::object parsed =
      py::reinterpret_steal<py::object>(PyObject_CallOneArg(json_loads(), py::str(d.to_json()).ptr()));
  if (!parsed) throw py::error_already_set();
  py::dict dict = parsed;
  dict["pass"] = std::string(pass_name(d.pass));
  dict["bytes_copied"] = d.run.bytes_copied;
  return dict;
}

namespace {

// The outputs of one backward call; unpacks as (dq, dk, dv, dsinks, dbias).
struct Gradients {
  py::object dq, dk, dv, dsinks, dbias;
  DispatchDecision decision;
  py::object decision_cache;

  py::dict decision_as_dict() {
    if (!decision_cache) decision_cache = decision_dict(decision);
    return decision_cache;
  }
  py::tuple as_tuple() const { return py::make_tuple(dq, dk, dv, dsinks, dbias); }
};

// A configured operator: the registry entry `name` with `config`. Per-call settings (backend=,
// softmax_scale=, ...) travel in each call's options, so one operator serves every call.
class Operator {
 public:
  Operator(const std::string& name, std::shared_ptr<const Config> config)
      : config_(config ? std::move(config) : std::make_shared<const Config>()),
        base_(registry().get(name, *config_)) {}

  py::object call(py::handle q, py::handle k, py::handle v, const CallArgs& a) {
    const BorrowedTensor bq = borrow(q, "q", a.uint16_is_bf16), bk = borrow(k, "k", a.uint16_is_bf16),
                         bv = borrow(v, "v", a.uint16_is_bf16);
    AttentionOutput out = without_gil([&] { return base_(bq.view, bk.view, bv.view, a.options); });
    // Outputs in q's kind; lse and weights are host tensors even when q is on the device.
    const ArrayKind kind = bq.kind == ArrayKind::device ? ArrayKind::numpy : bq.kind;
    auto r = std::make_unique<Result>();
    if (bq.kind == ArrayKind::device)
      r->out = wrap_device_tensor(std::move(out.device_out));
    else
      r->out = to_python(std::move(out.out), kind);
    r->lse = to_python(std::move(out.lse), kind);
    r->weights = to_python(std::move(out.attention_weights), kind);
    r->decision = std::move(out.decision);
    return py::cast(std::move(r));
  }

  py::dict explain(py::handle q, py::handle k, py::handle v, const CallArgs& a) {
    const BorrowedTensor bq = borrow(q, "q", a.uint16_is_bf16), bk = borrow(k, "k", a.uint16_is_bf16),
                         bv = borrow(v, "v", a.uint16_is_bf16);
    const DispatchDecision d =
        without_gil([&] { return base_.explain(bq.view, bk.view, bv.view, a.options); });
    return decision_dict(d);
  }

  py::object backward(py::handle q, py::handle k, py::handle v, py::handle out, py::handle lse,
                      py::handle dout, const CallArgs& a) {
    const bool bf = a.uint16_is_bf16;
    const BorrowedTensor bq = borrow(q, "q", bf), bk = borrow(k, "k", bf), bv = borrow(v, "v", bf),
                         bout = borrow(out, "out", bf), blse = borrow(lse, "lse", false),
                         bdout = borrow(dout, "dout", bf);
    AttentionGradients g = without_gil([&] {
      return base_.backward(bq.view, bk.view, bv.view, bout.view, blse.view, bdout.view, a.options);
    });
    const ArrayKind kind = bq.kind == ArrayKind::device ? ArrayKind::numpy : bq.kind;
    auto r = std::make_unique<Gradients>();
    r->dq = to_python(std::move(g.dq), kind);
    r->dk = to_python(std::move(g.dk), kind);
    r->dv = to_python(std::move(g.dv), kind);
    r->dsinks = to_python(std::move(g.dsinks), kind);
    r->dbias = to_python(std::move(g.dbias), kind);
    r->decision = std::move(g.decision);
    return py::cast(std::move(r));
  }

  // The benchmark's baseline: the same call `n` times from C++ (the views made once, the GIL
  // released): (wall seconds, this thread's CPU seconds) per call. python/bench/bench_overhead.py
  // compares them with the Python call's.
  py::tuple time_calls(py::handle q, py::handle k, py::handle v, int n, const py::kwargs& kwargs) {
    CallArgs a = parse_call_args(kwargs);
    const BorrowedTensor bq = borrow(q, "q", a.uint16_is_bf16), bk = borrow(k, "k", a.uint16_is_bf16),
                         bv = borrow(v, "v", a.uint16_is_bf16);
    const Attention& attn = base_;
    const auto [wall, cpu] = without_gil([&] {
      const auto thread_cpu = [] {
        timespec ts{};
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
        return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
      };
      const auto t0 = std::chrono::steady_clock::now();
      const double c0 = thread_cpu();
      for (int i = 0; i < n; ++i) {
        AttentionOutput out = attn(bq.view, bk.view, bv.view, a.options);
        (void)out;
      }
      const double c1 = thread_cpu();
      return std::pair{std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n,
                       (c1 - c0) / n};
    });
    return py::make_tuple(wall, cpu);
  }

  const Attention& base() const { return base_; }
  const Config& config() const { return *config_; }

 private:
  std::shared_ptr<const Config> config_;
  Attention base_;
};

// The keyword values of the declared wrapper (attnops/_operator.py), passed positionally in
// Keyword's order.
CallArgs positional_args(const py::args& values) {
  if (values.size() != kNumKeywords)
    throw py::type_error("expected " + std::to_string(kNumKeywords) + " keyword values in order, got " +
                         std::to_string(values.size()));
  CallValues v{};
  for (std::size_t i = 0; i < kNumKeywords; ++i) v[i] = values[i];
  return parse_call_values(v);
}

py::list backend_names(const std::vector<Backend>& bs) {
  py::list l;
  for (Backend b : bs) l.append(std::string(backend_name(b)));
  return l;
}

template <class T>
py::object opt(const std::optional<T>& v) {
  return v ? py::cast(*v) : py::none();
}

py::dict metadata_dict(const OperationMetadata& md) {
  py::dict d;
  d["runtime_dtype"] = md.runtime_dtype ? py::cast(std::string(dtype_name(*md.runtime_dtype))) : py::none();
  d["softmax_scale"] = opt(md.softmax_scale);
  d["blocksize_q"] = opt(md.blocksize_q);
  d["blocksize_k"] = opt(md.blocksize_k);
  d["backends"] = backend_names(md.backends);
  d["disabled_backends"] = backend_names(md.disabled_backends);
  py::dict fb;
  fb["decode"] = md.fallbacks.decode;
  fb["non_causal"] = md.fallbacks.non_causal;
  fb["seq_multiple"] = md.fallbacks.seq_multiple;
  fb["seq_multiple_of"] = md.fallbacks.seq_multiple_of;
  d["fallbacks"] = fb;
  py::dict gpu;
  gpu["device"] = md.gpu.device;
  gpu["allow_software"] = md.gpu.allow_software;
  gpu["pipeline_cache"] = md.gpu.pipeline_cache;
  d["gpu"] = gpu;
  d["num_threads"] = md.num_threads;
  return d;
}

Backend backend_arg(const std::string& s) {
  const auto b = parse_backend(s);
  if (!b)
    throw Error(ErrorCode::invalid_argument, "unknown backend '" + s + "' (expected native, cpu, gpu, tpu)");
  return *b;
}

constexpr const char* kCallDoc = R"(op(q, k, v, *, causal=True, sliding_window=None, chunk_size=None,
   segment_ids_q=None, segment_ids_kv=None, bias=None, logits_soft_cap=None, sinks=None,
   mask=None, return_lse=False, return_weights=False, profile=False, backend=None,
   softmax_scale=None, runtime_dtype=None, num_threads=None, dtype=None) -> Result

Attention over BTHD arrays: q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv] (numpy
float32 / float16, uint16 holding bf16 with dtype="bf16", torch CPU tensors through DLPack, or
attnops.DeviceTensor). Views are used in place; outputs come back as q's kind.
Result: out [B, Tq, Hq, Dv], lse [B, Hq, Tq] f32 (return_lse), weights [B, Hq, Tq, Tk] f32
(return_weights, vanilla only), decision (dict).
Options are attnops::AttentionOptions (sinks = softmax_aux), per-call settings included:
backend ("auto", "cpu", "gpu,cpu", [..]), softmax_scale, runtime_dtype and num_threads
override the operator's configuration for this call only.)";

}  // namespace

void bind_operator(py::module_& m) {
  py::class_<Config, std::shared_ptr<Config>>(m, "Config", "A parsed attnops YAML configuration.")
      .def_property_readonly("source", [](const Config& c) { return c.source; })
      .def_property_readonly("attn_mechanism", [](const Config& c) { return c.attn_mechanism; })
      .def("__repr__", [](const Config& c) { return "attnops.Config(" + c.source + ")"; });
  m.def(
      "load_config", [](const std::string& path) { return std::make_shared<Config>(load_config(path)); },
      py::arg("path"), "Reads a YAML configuration file (attnops.ConfigError / IoError on failure).");
  m.def(
      "parse_config",
      [](const std::string& text, const std::string& source) {
        return std::make_shared<Config>(parse_config(text, source));
      },
      py::arg("text"), py::arg("source") = "<string>", "Parses YAML text (JSON is YAML too).");

  m.def(
      "config_allowing_software",
      [](const std::shared_ptr<Config>& c) {
        auto copy = std::make_shared<Config>(c ? *c : Config{});
        copy->gpu_allow_software = true;
        return copy;
      },
      py::arg("config"), "A copy of config (None: the defaults) with gpu.allow_software set.");
  m.def(
      "registry_names", [] { return registry().list(); }, "Canonical operator names, sorted.");
  m.def(
      "registry_entry",
      [](const std::string& name) {
        const OperationEntry e = registry().entry(name);
        return py::make_tuple(e.name, e.aliases, metadata_dict(e.defaults));
      },
      py::arg("name"), "(canonical name, aliases, default metadata) of an operator or alias.");

  py::class_<Result>(
      m, "Result",
      "The outputs of one attention call; unpacks as (out, lse, weights), None where not asked for.")
      .def_readonly("out", &Result::out, "[B, Tq, Hq, Dv] in the runtime dtype (q's kind).")
      .def_readonly("lse", &Result::lse,
                    "[B, Hq, Tq] float32 (natural log; -inf for a fully masked row), or None.")
      .def_readonly("weights", &Result::weights, "[B, Hq, Tq, Tk] float32 probabilities (vanilla), or None.")
      .def_property_readonly("decision", &Result::decision_as_dict,
                             "Which operator and backend ran, and why (reasons with codes), as a dict.")
      .def_property_readonly("decision_json", [](const Result& r) { return r.decision.to_json(); })
      .def("__iter__", [](const Result& r) { return py::iter(r.as_tuple()); })
      .def("__len__", [](const Result&) { return 3; })
      .def("__getitem__", [](const Result& r, py::object i) -> py::object { return r.as_tuple()[i]; })
      .def("__repr__", [](Result& r) {
        return "attnops.Result(decision=" + std::string(py::repr(r.decision_as_dict())) + ")";
      });

  py::class_<Gradients>(m, "Gradients",
                        "The gradients of one backward call; unpacks as (dq, dk, dv, dsinks, dbias).")
      .def_readonly("dq", &Gradients::dq)
      .def_readonly("dk", &Gradients::dk)
      .def_readonly("dv", &Gradients::dv)
      .def_readonly("dsinks", &Gradients::dsinks, "[Hq] float32 when sinks were given, else None.")
      .def_readonly("dbias", &Gradients::dbias,
                    "float32 in the bias's shape when a bias was given, else None.")
      .def_property_readonly("decision", &Gradients::decision_as_dict)
      .def_property_readonly("decision_json", [](const Gradients& g) { return g.decision.to_json(); })
      .def("__iter__", [](const Gradients& g) { return py::iter(g.as_tuple()); })
      .def("__len__", [](const Gradients&) { return 5; })
      .def("__getitem__", [](const Gradients& g, py::object i) -> py::object { return g.as_tuple()[i]; })
      .def("__repr__", [](Gradients& g) {
        return "attnops.Gradients(decision=" + std::string(py::repr(g.decision_as_dict())) + ")";
      });

  py::class_<Operator>(m, "Operator",
                       "A configured attention operator from the registry (attnops.registry().get).")
      .def(py::init([](const std::string& name, std::shared_ptr<Config> config) {
             return std::make_unique<Operator>(name, std::move(config));
           }),
           py::arg("name"), py::arg("config") = nullptr)
      .def(
          "__call__",
          [](Operator& o, py::handle q, py::handle k, py::handle v, const py::kwargs& kw) {
            return o.call(q, k, v, parse_call_args(kw));
          },
          py::arg("q"), py::arg("k"), py::arg("v"), kCallDoc)
      .def(
          "explain",
          [](Operator& o, py::handle q, py::handle k, py::handle v, const py::kwargs& kw) {
            return o.explain(q, k, v, parse_call_args(kw));
          },
          py::arg("q"), py::arg("k"), py::arg("v"),
          "The decision (a dict) the call would get, without running it. Same keywords as op(...).")
      .def(
          "plan",
          [](Operator& o, py::handle q, py::handle k, py::handle v, const py::kwargs& kw) {
            return o.explain(q, k, v, parse_call_args(kw));
          },
          py::arg("q"), py::arg("k"), py::arg("v"), "explain's former name (the same call).")
      .def(
          "_call",
          [](Operator& o, py::handle q, py::handle k, py::handle v, const py::args& values) {
            return o.call(q, k, v, positional_args(values));
          },
          "op(q, k, v, ...) with the keyword values in Keyword's order (attnops.Operator's fast path).")
      .def(
          "_explain",
          [](Operator& o, py::handle q, py::handle k, py::handle v, const py::args& values) {
            return o.explain(q, k, v, positional_args(values));
          },
          "explain(q, k, v, ...) with the keyword values in Keyword's order.")
      .def(
          "_backward",
          [](Operator& o, py::handle q, py::handle k, py::handle v, py::handle out, py::handle lse,
             py::handle dout,
             const py::args& values) { return o.backward(q, k, v, out, lse, dout, positional_args(values)); },
          "backward(q, k, v, out, lse, dout, ...) with the keyword values in Keyword's order.")
      .def(
          "backward",
          [](Operator& o, py::handle q, py::handle k, py::handle v, py::handle out, py::handle lse,
             py::handle dout,
             const py::kwargs& kw) { return o.backward(q, k, v, out, lse, dout, parse_call_args(kw)); },
          py::arg("q"), py::arg("k"), py::arg("v"), py::arg("out"), py::arg("lse"), py::arg("dout"),
          "Gradients of a forward call with these inputs and options: out and lse from that call "
          "(return_lse=True), dout [B, Tq, Hq, Dv] the gradient of out. Returns Gradients (dq, dk, dv, "
          "dsinks, dbias, decision).")
      .def(
          "paged",
          [](Operator& o, py::handle q, py::handle cache, py::handle batch, const py::kwargs& kw) {
            PagedCallArgs a = parse_paged_args(kw);
            return paged_call(o.base(), q, cache, batch, a, false);
          },
          py::arg("q"), py::arg("cache"), py::arg("batch"),
          "A paged call (operator ragged_paged): q [N, Hq, D] over cache (attnops.PagedKVCache) for "
          "batch (an attnops.RaggedBatch, or an attnops.PagedPlan made once per step). Keywords: causal, "
          "sliding_window, chunk_size, logits_soft_cap, sinks, return_lse, kv_split_tokens, backend, "
          "softmax_scale, num_threads, dtype. Result: out [N, Hq, Dv], lse [N, Hq], decision.")
      .def(
          "explain_paged",
          [](Operator& o, py::handle q, py::handle cache, py::handle batch, const py::kwargs& kw) {
            PagedCallArgs a = parse_paged_args(kw);
            return paged_call(o.base(), q, cache, batch, a, true);
          },
          py::arg("q"), py::arg("cache"), py::arg("batch"),
          "The decision (a dict) a paged call would get, without running it.")
      .def("_time_calls", &Operator::time_calls, py::arg("q"), py::arg("k"), py::arg("v"), py::arg("n"),
           "Benchmark baseline: (wall, thread CPU) seconds per call of the same call made n times from C++.")
      .def_property_readonly(
          "name", [](const Operator& o) { return o.base().name(); },
          "The canonical name of the requested operator.")
      .def_property_readonly("aliases", [](const Operator& o) { return o.base().aliases(); })
      .def_property_readonly(
          "metadata", [](const Operator& o) { return metadata_dict(o.base().metadata()); },
          "The operator's settings after the config (backend order, fallbacks, ...).")
      .def(
          "implements",
          [](const Operator& o, const std::string& b) { return o.base().implements(backend_arg(b)); },
          py::arg("backend"), "Whether the operator has a forward for this backend.")
      .def(
          "implements_backward",
          [](const Operator& o, const std::string& b) {
            return o.base().implements_backward(backend_arg(b));
          },
          py::arg("backend"), "Whether the operator has a backward for this backend.")
      .def("returns_weights", [](const Operator& o) { return o.base().returns_weights(); })
      .def("__repr__", [](const Operator& o) {
        return "attnops.Operator('" + o.base().name() + "', config=" + o.config().source + ")";
      });
}

}  // namespace attnops::python
