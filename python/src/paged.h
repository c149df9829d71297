// Serving from Python: attnops.PagedKVCache, attnops.RaggedBatch, attnops.PagedPlan,
// attnops.plan_paged, attnops.merge_states and Operator.paged / Operator.explain_paged, over the
// C++ serving API (attnops/paged.h; layouts there and in the README's serving section).
//
//   cache = attnops.PagedKVCache.host(num_pages, page_size, num_kv_heads, head_dim, dtype="bf16")
//   cache.write(k_new, v_new, slot_mapping)           # [N, Hkv, D], [N, Hkv, Dv], i32|i64 [N]
//   batch = attnops.RaggedBatch(cu_seqlens_q, kv_lens, page_table)
//   plan = attnops.plan_paged(batch, cache, num_tokens=N, num_q_heads=Hq)   # once per step
//   res = attnops.registry().get("paged").paged(q, cache, plan, return_lse=True)  # every layer
//
// Arrays are viewed as for dense calls (arrays.h): no copies. A cache made by wrap() views the
// caller's arrays (which it holds) and writes into them; host() / device() own their pools.
#pragma once

#include <pybind11/pybind11.h>

#include <optional>

#include "arrays.h"
#include "attnops/paged.h"
#include "attnops/registry.h"
#include "call.h"

namespace py = pybind11;

namespace attnops::python {

// A paged call's keywords: causal, sliding_window, chunk_size, logits_soft_cap, sinks,
// return_lse, kv_split_tokens, and the per-call settings (backend, softmax_scale, num_threads,
// runtime_dtype, dtype) as for dense calls. segment_ids_*, bias, mask and return_weights have no
// ragged form: attnops.InvalidArgument naming them.
struct PagedCallArgs {
  CallArgs base;  // dtype= and the sinks array held for the call
  PagedAttentionOptions options;
};
PagedCallArgs parse_paged_args(const py::kwargs& kwargs);

// op.paged(q, cache, batch_or_plan, **kw) -> Result; explain: the decision dict, not run.
py::object paged_call(const Attention& attn, py::handle q, py::handle cache, py::handle batch_or_plan,
                      PagedCallArgs& args, bool explain);

void bind_paged(py::module_& m);

}  // namespace attnops::python
