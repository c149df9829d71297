// attnops.PagedKVCache, RaggedBatch, PagedPlan, plan_paged, merge_states and the paged call (see
// paged.h). Every C++ call runs with the GIL released (device.h: without_gil), so a device cache
// is used and freed under the GPU lifetime lock like a DeviceTensor.
#include "paged.h"

#include <pybind11/numpy.h>
#include <pybind11/stl.h>

#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "arrays.h"
#include "attnops/error.h"
#include "device.h"
#include "outputs.h"
#include "result.h"

namespace attnops::python {
namespace {

// The Python object behind attnops.PagedKVCache.
struct PyPagedCache {
  PagedKVCache cache;
  // wrap(): the caller's arrays, held (the cache views them and writes into them).
  std::optional<BorrowedTensor> k_src, v_src, ks_src, vs_src;
  py::object k_obj, v_obj, ks_obj, vs_obj;

  PyPagedCache() = default;
  PyPagedCache(const PyPagedCache&) = delete;
  PyPagedCache& operator=(const PyPagedCache&) = delete;
  ~PyPagedCache() {
    if (!cache.on_device()) return;
    std::shared_lock lock(gpu_lifetime());  // device pools are freed never while release_gpu() runs
    cache = PagedKVCache();
  }
};

// attnops.RaggedBatch: the index arrays, held for as long as the batch is.
struct PyRaggedBatch {
  BorrowedTensor cu, kv, pt;
  py::object cu_obj, kv_obj, pt_obj;
  std::int64_t num_seqs = -1;
  RaggedBatch batch() const { return RaggedBatch{cu.view, kv.view, pt.view, num_seqs}; }
};

struct PyPagedPlan {
  PagedPlan plan;
};

const char* numpy_format(DType t) {
  switch (t) {
    case DType::f32:
      return "float32";
    case DType::f16:
      return "float16";
    case DType::bf16:
      return "uint16";  // bit patterns, as every bf16 output (numpy has no bfloat16)
    case DType::i8:
      return "int8";
    case DType::fp8_e4m3:
      return "uint8";  // e4m3 bit patterns (numpy has no fp8)
    default:
      return "int32";
  }
}

// A cache dtype: the float dtypes as parse_dtype_arg, or "int8" / "fp8_e4m3".
DType cache_dtype_arg(py::handle obj) {
  if (PyUnicode_Check(obj.ptr())) {
    const std::string s = obj.cast<std::string>();
    if (s == "int8" || s == "i8") return DType::i8;
    if (s == "fp8_e4m3" || s == "fp8" || s == "float8_e4m3fn") return DType::fp8_e4m3;
  }
  return parse_dtype_arg(obj, "dtype");
}

// A pool argument (writable: write() writes into it): int8 arrays are int8 codes; with dtype
// "fp8_e4m3", a uint8 array (numpy or torch) holds e4m3 bit patterns (viewed as int8, no copy,
// and retyped). `obj` becomes the object that holds the memory.
BorrowedTensor borrow_pool(py::object& obj, const char* name, std::optional<DType> dtype) {
  if (dtype == DType::fp8_e4m3) {
    // Only one-byte arrays: viewing wider elements as int8 would silently read their bytes as codes.
    py::object as_i8;
    std::string held;
    if (is_torch_tensor(obj)) {
      const py::object torch = py::module_::import("torch");
      const py::object dt = obj.attr("dtype");
      if (dt.equal(torch.attr("uint8")) ||
          (py::hasattr(torch, "float8_e4m3fn") && dt.equal(torch.attr("float8_e4m3fn"))))
        as_i8 = obj.attr("view")(torch.attr("int8"));
      else
        held = py::str(dt);
    } else {
      const py::object np = py::module_::import("numpy");
      const py::object arr = np.attr("asarray")(obj);
      const py::object dt = arr.attr("dtype");
      if (dt.equal(np.attr("dtype")("uint8")))
        as_i8 = arr.attr("view")(np.attr("int8"));
      else
        held = py::str(dt);
    }
    if (!held.empty())
      throw Error(ErrorCode::unsupported_dtype, std::string(name) +
                                                    ": dtype=\"fp8_e4m3\" takes uint8 arrays of e4m3 bit "
                                                    "patterns, got " +
                                                    held);
    BorrowedTensor b = borrow_writable(as_i8, name, false);
    std::vector<std::int64_t> strides;
    for (int i = 0; i < b.view.rank(); ++i) strides.push_back(b.view.stride(i));
    b.view = TensorView(b.view.data(), DType::fp8_e4m3, b.view.shape(), strides);
    obj = std::move(as_i8);
    return b;
  }
  BorrowedTensor b = borrow_writable(obj, name, dtype == DType::bf16);
  if (dtype && b.view.dtype() != *dtype)
    throw Error(ErrorCode::unsupported_dtype,
                std::string(name) + ": dtype=\"" + std::string(dtype_name(*dtype)) +
                    "\" but the array holds " + std::string(dtype_name(b.view.dtype())));
  return b;
}

// A numpy array over one of the cache's host pools; `owner` (the PagedKVCache object) keeps it alive.
py::object pool_array(const TensorView& v, py::handle owner) {
  std::vector<py::ssize_t> shape, strides;
  const auto esize = static_cast<py::ssize_t>(dtype_size(v.dtype()));
  for (int i = 0; i < v.rank(); ++i) {
    shape.push_back(static_cast<py::ssize_t>(v.dim(i)));
    strides.push_back(static_cast<py::ssize_t>(v.stride(i)) * esize);
  }
  return py::array(py::dtype(numpy_format(v.dtype())), shape, strides, v.data(), owner);
}

py::dict spec_dict(const PagedKVSpec& s) {
  py::dict d;
  d["num_pages"] = s.num_pages;
  d["page_size"] = s.page_size;
  d["num_kv_heads"] = s.num_kv_heads;
  d["head_dim"] = s.head_dim;
  d["head_dim_v"] = s.dv();
  d["dtype"] = std::string(dtype_name(s.dtype));
  if (s.quantized()) d["scales"] = std::string(kv_scales_name(s.scales));
  return d;
}

KVScales scales_arg(const std::string& s) {
  if (s == "per_token") return KVScales::per_token;
  if (s == "per_tensor") return KVScales::per_tensor;
  throw Error(ErrorCode::invalid_argument,
              "scales: expected \"per_token\" or \"per_tensor\", got '" + s + "'");
}

PagedKVSpec make_spec(std::int64_t num_pages, std::int64_t page_size, std::int64_t num_kv_heads,
                      std::int64_t head_dim, std::int64_t head_dim_v, py::handle dtype,
                      const std::string& scales) {
  return PagedKVSpec{num_pages,         page_size, num_kv_heads, head_dim, head_dim_v, cache_dtype_arg(dtype),
                     scales_arg(scales)};
}

// host() / device()'s per-tensor scales: both or neither.
std::optional<KVTensorScales> tensor_scales_arg(const py::object& k, const py::object& v) {
  if (k.is_none() != v.is_none()) throw Error(ErrorCode::invalid_argument, "k_scale and v_scale go together");
  if (k.is_none()) return std::nullopt;
  return KVTensorScales{k.cast<float>(), v.cast<float>()};
}

PyPagedCache& cache_arg(py::handle obj) {
  try {
    return obj.cast<PyPagedCache&>();
  } catch (const py::cast_error&) {
    throw py::type_error("cache: expected an attnops.PagedKVCache, got " +
                         std::string(py::str(obj.get_type().attr("__name__"))));
  }
}

}  // namespace

PagedCallArgs parse_paged_args(const py::kwargs& kwargs) {
  PagedCallArgs a;
  py::kwargs rest;
  std::optional<std::int64_t> split;
  bool share = true;
  if (kwargs)
    for (auto [key, value] : kwargs) {
      const std::string k = py::str(key);
      if (k == "kv_split_tokens") {
        if (!value.is_none()) split = as_int(value, "kv_split_tokens");
      } else if (k == "share_prefixes") {
        share = as_bool(value, "share_prefixes");
      } else {
        rest[key] = value;
      }
    }
  a.base = parse_call_args(rest);
  const AttentionOptions& o = a.base.options;
  const char* no_ragged_form = o.segment_ids_q    ? "segment_ids_q"
                               : o.segment_ids_kv ? "segment_ids_kv"
                               : o.bias           ? "bias"
                               : o.mask           ? "mask"
                               : o.return_weights ? "return_weights"
                                                  : nullptr;
  if (no_ragged_form != nullptr)
    throw Error(ErrorCode::invalid_argument,
                std::string(no_ragged_form) +
                    ": paged calls have no ragged form of it (causal, sliding_window, "
                    "chunk_size, logits_soft_cap and sinks apply per sequence)");
  PagedAttentionOptions& p = a.options;
  p.causal = o.causal;
  p.sliding_window = o.sliding_window;
  p.chunk_size = o.chunk_size;
  p.logits_soft_cap = o.logits_soft_cap;
  p.sinks = o.sinks;
  p.return_lse = o.return_lse;
  p.kv_split_tokens = split;
  p.share_prefixes = share;
  p.softmax_scale = o.softmax_scale;
  p.backends = o.backends;
  p.num_threads = o.num_threads;
  p.runtime_dtype = o.runtime_dtype;
  return a;
}

namespace {

PagedAttentionOptions with_plan_options(PagedAttentionOptions planned, const PagedAttentionOptions& given) {
  const PagedAttentionOptions defaults;
  if (given.causal != defaults.causal) planned.causal = given.causal;
  if (given.sliding_window) planned.sliding_window = given.sliding_window;
  if (given.chunk_size) planned.chunk_size = given.chunk_size;
  if (given.logits_soft_cap) planned.logits_soft_cap = given.logits_soft_cap;
  if (given.sinks) planned.sinks = given.sinks;
  if (given.return_lse) planned.return_lse = true;
  if (given.kv_split_tokens) planned.kv_split_tokens = given.kv_split_tokens;
  if (given.softmax_scale) planned.softmax_scale = given.softmax_scale;
  if (given.backends) planned.backends = given.backends;
  if (given.num_threads) planned.num_threads = given.num_threads;
  if (given.runtime_dtype) planned.runtime_dtype = given.runtime_dtype;
  return planned;
}

}  // namespace

py::object paged_call(const Attention& attn, py::handle q, py::handle cache_obj, py::handle batch_or_plan,
                      PagedCallArgs& a, bool explain) {
  const PyPagedCache& cache = cache_arg(cache_obj);
  const BorrowedTensor bq = borrow(q, "q", a.base.uint16_is_bf16);
  const PyPagedPlan* plan = nullptr;
  const PyRaggedBatch* batch = nullptr;
  if (py::isinstance<PyPagedPlan>(batch_or_plan))
    plan = &batch_or_plan.cast<const PyPagedPlan&>();
  else if (py::isinstance<PyRaggedBatch>(batch_or_plan))
    batch = &batch_or_plan.cast<const PyRaggedBatch&>();
  else
    throw py::type_error("batch: expected an attnops.RaggedBatch or an attnops.PagedPlan");
  // With a plan, the run starts from the plan's options (as C++'s paged(q, cache, plan)); a keyword
  // given a value other than its default replaces the plan's (masks that differ: a typed error).
  const PagedAttentionOptions o =
      plan != nullptr ? with_plan_options(plan->plan.options(), a.options) : a.options;
  if (explain) {
    const DispatchDecision d = without_gil([&] {
      const PagedPlan p = plan != nullptr ? plan->plan
                                          : plan_paged(batch->batch(), cache.cache.spec(), bq.view.dim(0),
                                                       bq.view.rank() > 1 ? bq.view.dim(1) : 0, o);
      return attn.explain(bq.view, cache.cache, p, o);
    });
    return decision_dict(d);
  }
  AttentionOutput out = without_gil([&] {
    return plan != nullptr ? attn.paged(bq.view, cache.cache, plan->plan, o)
                           : attn.paged(bq.view, cache.cache, batch->batch(), o);
  });
  const ArrayKind kind = bq.kind == ArrayKind::device ? ArrayKind::numpy : bq.kind;
  auto r = std::make_unique<Result>();
  if (bq.kind == ArrayKind::device)
    r->out = wrap_device_tensor(std::move(out.device_out));
  else
    r->out = to_python(std::move(out.out), kind);
  r->lse = to_python(std::move(out.lse), kind);
  r->weights = py::none();
  r->decision = std::move(out.decision);
  return py::cast(std::move(r));
}

void bind_paged(py::module_& m) {
  py::class_<PyPagedCache>(m, "PagedKVCache", R"(A paged KV cache: page pools k [P, page_size, Hkv, D] and
v [P, page_size, Hkv, Dv] (f32, f16 or bf16), on the host or the GPU. The caller owns page
allocation: attnops never frees, moves or allocates pages.

    cache = attnops.PagedKVCache.host(1024, 16, 8, 128, dtype="bf16")
    cache = attnops.PagedKVCache.wrap(k_pages, v_pages)   # the caller's arrays, no copy
    cache.write(k_new, v_new, slot_mapping)   # row t to slot slot_mapping[t]; < 0 skips the row)")
      .def_static(
          "host",
          [](std::int64_t num_pages, std::int64_t page_size, std::int64_t num_kv_heads, std::int64_t head_dim,
             std::int64_t head_dim_v, py::handle dtype, const std::string& scales, py::object k_scale,
             py::object v_scale) {
            auto c = std::make_unique<PyPagedCache>();
            c->cache = PagedKVCache::host(
                make_spec(num_pages, page_size, num_kv_heads, head_dim, head_dim_v, dtype, scales),
                tensor_scales_arg(k_scale, v_scale));
            return c;
          },
          py::arg("num_pages"), py::arg("page_size"), py::arg("num_kv_heads"), py::arg("head_dim"),
          py::kw_only(), py::arg("head_dim_v") = 0, py::arg("dtype") = "f32", py::arg("scales") = "per_token",
          py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none(),
          "Zero-filled host pools. dtype \"int8\" or \"fp8_e4m3\": an 8-bit cache whose write() quantizes, "
          "scales \"per_token\" (each row's, set by write) or \"per_tensor\" (k_scale, v_scale; default 1).")
      .def_static(
          "device",
          [](std::int64_t num_pages, std::int64_t page_size, std::int64_t num_kv_heads, std::int64_t head_dim,
             std::int64_t head_dim_v, py::handle dtype, bool allow_software, const std::string& device,
             const std::string& scales, py::object k_scale, py::object v_scale) {
            const PagedKVSpec spec =
                make_spec(num_pages, page_size, num_kv_heads, head_dim, head_dim_v, dtype, scales);
            const std::optional<KVTensorScales> ts = tensor_scales_arg(k_scale, v_scale);
            GpuSettings gpu;
            gpu.allow_software = allow_software;
            gpu.device = device;
            auto c = std::make_unique<PyPagedCache>();
            c->cache = without_gil([&] { return PagedKVCache::device(spec, gpu, ts); });
            return c;
          },
          py::arg("num_pages"), py::arg("page_size"), py::arg("num_kv_heads"), py::arg("head_dim"),
          py::kw_only(), py::arg("head_dim_v") = 0, py::arg("dtype") = "f32",
          py::arg("allow_software") = false, py::arg("device") = "", py::arg("scales") = "per_token",
          py::arg("k_scale") = py::none(), py::arg("v_scale") = py::none(),
          "Zero-filled pools on the GPU (device-resident; attnops.BackendUnavailable without one).")
      .def_static(
          "wrap",
          [](py::object k_pages, py::object v_pages, py::object dtype, py::object k_scales,
             py::object v_scales) {
            std::optional<DType> dt;
            if (!dtype.is_none()) dt = cache_dtype_arg(dtype);
            auto c = std::make_unique<PyPagedCache>();
            c->k_src.emplace(borrow_pool(k_pages, "k_pages", dt));
            c->v_src.emplace(borrow_pool(v_pages, "v_pages", dt));
            TensorView ks, vs;
            if (!k_scales.is_none())
              ks = c->ks_src.emplace(borrow_writable(k_scales, "k_scales", false)).view;
            if (!v_scales.is_none())
              vs = c->vs_src.emplace(borrow_writable(v_scales, "v_scales", false)).view;
            c->cache = PagedKVCache::wrap(c->k_src->view, c->v_src->view, ks, vs);
            c->k_obj = std::move(k_pages);
            c->v_obj = std::move(v_pages);
            c->ks_obj = std::move(k_scales);
            c->vs_obj = std::move(v_scales);
            return c;
          },
          py::arg("k_pages"), py::arg("v_pages"), py::kw_only(), py::arg("dtype") = py::none(),
          py::arg("k_scales") = py::none(), py::arg("v_scales") = py::none(),
          "A cache over the caller's arrays (numpy, torch CPU tensors; uint16 with dtype='bf16'), held and "
          "written in place; any outer strides, the innermost dimension contiguous. Read-only arrays (a "
          "read-only memory map, an array over bytes, a broadcast view) are refused (attnops.InvalidArgument "
          "naming k_pages / v_pages): write() would write into them. 8-bit caches: int8 "
          "arrays, or uint8 arrays of e4m3 bit patterns with dtype='fp8_e4m3', and their float32 scales "
          "k_scales / v_scales, [P, page_size, Hkv] (per token) or [1] (per tensor).")
      .def(
          "write",
          [](PyPagedCache& c, py::handle k_new, py::handle v_new, py::handle slots, py::object dtype) {
            const bool bf = !dtype.is_none() && parse_dtype_arg(dtype, "dtype") == DType::bf16;
            const BorrowedTensor k = borrow(k_new, "k_new", bf), v = borrow(v_new, "v_new", bf),
                                 s = borrow(slots, "slot_mapping", false);
            without_gil([&] { c.cache.write(k.view, v.view, s.view); });
          },
          py::arg("k_new"), py::arg("v_new"), py::arg("slot_mapping"), py::kw_only(),
          py::arg("dtype") = py::none(),
          "Puts row t of k_new [N, Hkv, D] / v_new [N, Hkv, Dv] at slot slot_mapping[t] (int32 or int64 [N]; "
          "page = slot // page_size); a negative slot skips the row. All or nothing: every check runs before "
          "anything is written.")
      .def(
          "gather",
          [](const PyPagedCache& c, py::handle page_row, std::int64_t kv_len) {
            const BorrowedTensor row = borrow(page_row, "page_row", false);
            PagedKVCache::Dense d = without_gil([&] { return c.cache.gather(row.view, kv_len); });
            return py::make_tuple(to_python(std::move(d.k), ArrayKind::numpy),
                                  to_python(std::move(d.v), ArrayKind::numpy));
          },
          py::arg("page_row"), py::arg("kv_len"),
          "One sequence's keys and values as dense arrays (k [1, kv_len, Hkv, D], v [1, kv_len, Hkv, Dv]; a "
          "copy).")
      .def_property_readonly(
          "k_pages",
          [](py::object self) -> py::object {
            const PyPagedCache& c = self.cast<const PyPagedCache&>();
            if (c.k_obj) return c.k_obj;
            return c.cache.on_device() ? py::none() : pool_array(c.cache.k_pages(), self);
          },
          "The K pool as an array over the cache's memory (the wrapped array; None on the device).")
      .def_property_readonly(
          "v_pages",
          [](py::object self) -> py::object {
            const PyPagedCache& c = self.cast<const PyPagedCache&>();
            if (c.v_obj) return c.v_obj;
            return c.cache.on_device() ? py::none() : pool_array(c.cache.v_pages(), self);
          },
          "The V pool as an array over the cache's memory (the wrapped array; None on the device).")
      .def_property_readonly(
          "k_scales",
          [](py::object self) -> py::object {
            const PyPagedCache& c = self.cast<const PyPagedCache&>();
            if (c.ks_obj && !c.ks_obj.is_none()) return c.ks_obj;
            const TensorView s = c.cache.k_scales();
            return s.empty() || s.on_device() ? py::none() : pool_array(s, self);
          },
          "An 8-bit cache's key scales (float32, [P, page_size, Hkv] or [1]); None for float caches or "
          "device pools.")
      .def_property_readonly(
          "v_scales",
          [](py::object self) -> py::object {
            const PyPagedCache& c = self.cast<const PyPagedCache&>();
            if (c.vs_obj && !c.vs_obj.is_none()) return c.vs_obj;
            const TensorView s = c.cache.v_scales();
            return s.empty() || s.on_device() ? py::none() : pool_array(s, self);
          },
          "An 8-bit cache's value scales, as k_scales.")
      .def_property_readonly("spec", [](const PyPagedCache& c) { return spec_dict(c.cache.spec()); })
      .def_property_readonly("on_device", [](const PyPagedCache& c) { return c.cache.on_device(); })
      .def("__repr__", [](const PyPagedCache& c) {
        return "attnops.PagedKVCache(" + std::string(py::repr(spec_dict(c.cache.spec()))) +
               (c.cache.on_device() ? ", on_device=True)" : ")");
      });

  py::class_<PyRaggedBatch>(m, "RaggedBatch", R"(One model step's batch: cu_seqlens_q [S + 1] (query rows of
sequence s are [cu[s], cu[s + 1]) of q), kv_lens [S] (keys including this step's tokens),
page_table [S, max_pages]; int32 or int64 arrays, held by the batch. num_seqs: -1 = all S.)")
      .def(py::init([](py::object cu, py::object kv, py::object pt, std::int64_t num_seqs) {
             auto b = std::make_unique<PyRaggedBatch>();
             b->cu = borrow(cu, "cu_seqlens_q", false);
             b->kv = borrow(kv, "kv_lens", false);
             b->pt = borrow(pt, "page_table", false);
             b->cu_obj = std::move(cu);
             b->kv_obj = std::move(kv);
             b->pt_obj = std::move(pt);
             b->num_seqs = num_seqs;
             return b;
           }),
           py::arg("cu_seqlens_q"), py::arg("kv_lens"), py::arg("page_table"), py::kw_only(),
           py::arg("num_seqs") = -1)
      .def_readonly("cu_seqlens_q", &PyRaggedBatch::cu_obj)
      .def_readonly("kv_lens", &PyRaggedBatch::kv_obj)
      .def_readonly("page_table", &PyRaggedBatch::pt_obj);

  py::class_<PyPagedPlan>(m, "PagedPlan",
                          "A validated batch and its work list (attnops.plan_paged), reused by every layer.")
      .def_property_readonly("num_seqs", [](const PyPagedPlan& p) { return p.plan.num_seqs(); })
      .def_property_readonly("num_tokens", [](const PyPagedPlan& p) { return p.plan.num_tokens(); })
      .def_property_readonly("num_q_heads", [](const PyPagedPlan& p) { return p.plan.num_q_heads(); })
      .def_property_readonly("kv_split_tokens", [](const PyPagedPlan& p) { return p.plan.kv_split_tokens(); })
      .def_property_readonly("num_work_items", [](const PyPagedPlan& p) { return p.plan.work().size(); })
      .def(
          "q_len", [](const PyPagedPlan& p, std::int64_t s) { return p.plan.q_len(s); }, py::arg("s"))
      .def(
          "kv_len", [](const PyPagedPlan& p, std::int64_t s) { return p.plan.kv_len(s); }, py::arg("s"));

  m.def(
      "plan_paged",
      [](const PyRaggedBatch& b, py::handle cache, std::int64_t num_tokens, std::int64_t num_q_heads,
         const py::kwargs& kw) {
        const PyPagedCache& c = cache_arg(cache);
        PagedCallArgs a = parse_paged_args(kw);
        auto p = std::make_unique<PyPagedPlan>();
        p->plan = without_gil(
            [&] { return plan_paged(b.batch(), c.cache.spec(), num_tokens, num_q_heads, a.options); });
        return p;
      },
      py::arg("batch"), py::arg("cache"), py::arg("num_tokens"), py::arg("num_q_heads"),
      "Validates the batch once per model step and builds its work list (keywords: causal, sliding_window, "
      "chunk_size, kv_split_tokens, share_prefixes, as the calls that reuse it). Typed errors name the "
      "argument.");

  m.def(
      "merge_states",
      [](py::handle out_a, py::handle lse_a, py::handle out_b, py::handle lse_b, py::object dtype) {
        const bool bf = !dtype.is_none() && parse_dtype_arg(dtype, "dtype") == DType::bf16;
        const BorrowedTensor oa = borrow(out_a, "out_a", bf), la = borrow(lse_a, "lse_a", false),
                             ob = borrow(out_b, "out_b", bf), lb = borrow(lse_b, "lse_b", false);
        MergedState s = without_gil([&] { return merge_states(oa.view, la.view, ob.view, lb.view); });
        const ArrayKind kind = oa.kind == ArrayKind::device ? ArrayKind::numpy : oa.kind;
        return py::make_tuple(to_python(std::move(s.out), kind), to_python(std::move(s.lse), kind));
      },
      py::arg("out_a"), py::arg("lse_a"), py::arg("out_b"), py::arg("lse_b"), py::kw_only(),
      py::arg("dtype") = py::none(),
      "Cascade attention: the states (out [N, H, Dv], lse [N, H], natural log) of one set of rows over two "
      "disjoint key sets merged into the state over their union: (out, lse).");
}

}  // namespace attnops::python
