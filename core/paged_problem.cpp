// make_paged_problem: validation of one paged call against its plan, and its output buffers.
#include "attnops/ext/paged_problem.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <string_view>

#include "attnops/environment.h"
#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "core/sinks_option.h"

namespace attnops {

namespace {

using i64 = std::int64_t;

[[noreturn]] void fail(ErrorCode code, const std::string& msg) {
  throw Error(code, msg);
}

std::string short_number(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", x);
  return buf;
}

std::string window_text(const std::optional<Window>& w) {
  if (!w) return "none";
  std::string s = "(";  // piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "(" + string
  s += std::to_string(w->left);
  s += ", ";
  s += std::to_string(w->right);
  s += ")";
  return s;
}
std::string chunk_text(const std::optional<std::int64_t>& c) {
  return c ? std::to_string(*c) : std::string("none");
}

// The options that shaped the work list must be the plan's.
void check_against_plan(const PagedAttentionOptions& o, const PagedPlanData& d) {
  const bool same_window =
      o.sliding_window.has_value() == d.window.has_value() &&
      (!d.window || (o.sliding_window->left == d.window->left && o.sliding_window->right == d.window->right));
  if (o.causal != d.causal || !same_window || o.chunk_size != d.chunk)
    fail(ErrorCode::invalid_argument,
         "options: the plan was built for causal=" + std::string(d.causal ? "true" : "false") +
             ", sliding_window=" + window_text(d.window) + ", chunk_size=" + chunk_text(d.chunk) +
             ", the call asks for causal=" + std::string(o.causal ? "true" : "false") + ", sliding_window=" +
             window_text(o.sliding_window) + ", chunk_size=" + chunk_text(o.chunk_size) +
             " (the masks shape the work list: plan once per mask configuration; a plan carries its "
             "options, so run it as paged(q, cache, plan) without options)");
  if (o.kv_split_tokens && *o.kv_split_tokens != d.split_tokens)
    fail(ErrorCode::invalid_argument, "kv_split_tokens: the plan splits keys every " +
                                          std::to_string(d.split_tokens) + " tokens, the call asks for " +
                                          std::to_string(*o.kv_split_tokens) +
                                          " (a plan carries its options: run it as paged(q, cache, plan))");
}

void check_cache(PagedKVSpec c, PagedKVSpec planned) {
  for (PagedKVSpec* x : {&c, &planned})
    if (!x->quantized()) x->scales = KVScales::per_token;  // meaningless for float caches
  if (c == planned) return;
  const auto field = [](const char* name, i64 got, i64 want) {
    return got == want ? std::string()
                       : std::string(" ") + name + "=" + std::to_string(got) + " (planned " +
                             std::to_string(want) + ")";
  };
  std::string diff = field("num_pages", c.num_pages, planned.num_pages) +
                     field("page_size", c.page_size, planned.page_size) +
                     field("num_kv_heads", c.num_kv_heads, planned.num_kv_heads) +
                     field("head_dim", c.head_dim, planned.head_dim) +
                     field("head_dim_v", c.dv(), planned.dv());
  if (c.dtype != planned.dtype)
    diff += " dtype=" + std::string(dtype_name(c.dtype)) + " (planned " +
            std::string(dtype_name(planned.dtype)) + ")";
  if (c.scales != planned.scales)
    diff += " scales=" + std::string(kv_scales_name(c.scales)) + " (planned " +
            std::string(kv_scales_name(planned.scales)) + ")";
  fail(ErrorCode::shape_mismatch, "cache: differs from the cache the plan was built for:" + diff);
}

// Largest finite |x| of a float view of rank 3 (q) / of the rows [0, kv_len) of each sequence's
// pages (the keys the call reads).
double max_abs_q(const TensorView& q) {
  double m = 0;
  for (i64 a = 0; a < q.dim(0); ++a)
    for (i64 b = 0; b < q.dim(1); ++b)
      for (i64 c = 0; c < q.dim(2); ++c) {
        const double x = std::fabs(load_as_float(
            q.data(), q.dtype(), static_cast<std::size_t>(a * q.stride(0) + b * q.stride(1) + c)));
        if (x > m && std::isfinite(x)) m = x;
      }
  return m;
}
double max_abs_keys(const PagedProblem& p) {
  const PagedPlanData& d = *p.batch;
  double m = 0;
  for (i64 s = 0; s < d.S; ++s) {
    const std::int32_t* pages = d.page_ids.data() + d.page_begin[static_cast<std::size_t>(s)];
    for (i64 j = 0; j < d.kv_len[static_cast<std::size_t>(s)]; ++j)
      for (i64 h = 0; h < p.Hkv; ++h) {
        const i64 base = p.k_offset(pages[j / p.page_size], j % p.page_size, h);
        const float s =
            !p.quantized() ? 1.f
            : p.per_token_scales()
                ? p.k_scales.data_as<float>()[p.ks_offset(pages[j / p.page_size], j % p.page_size, h)]
                : p.k_scale;
        for (i64 e = 0; e < p.D; ++e) {
          const double x =
              std::fabs(load_as_float(p.k_pages.data(), p.kv_dtype, static_cast<std::size_t>(base + e)) * s);
          if (x > m && std::isfinite(x)) m = x;
        }
      }
  }
  return m;
}

}  // namespace

PagedProblem make_paged_problem(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                                const PagedAttentionOptions& o, const OperationMetadata& md) {
  // A per-call setting overrides the operator's metadata for this call.
  const std::optional<DType> runtime_dtype = o.runtime_dtype ? o.runtime_dtype : md.runtime_dtype;
  const std::optional<double> softmax_scale = o.softmax_scale ? o.softmax_scale : md.softmax_scale;
  const int num_threads = o.num_threads.value_or(md.num_threads);
  if (plan.empty()) fail(ErrorCode::invalid_argument, "plan: an empty plan (build one with plan_paged)");
  if (cache.empty())
    fail(ErrorCode::invalid_argument, "cache: an empty cache (build one with PagedKVCache::host, ...)");
  const PagedPlanData& d = plan_data(plan);
  const PagedKVSpec& spec = cache.spec();
  check_cache(spec, d.cache);
  check_against_plan(o, d);

  PagedProblem p;
  p.plan = plan;
  p.batch = &d;
  p.N = d.N, p.Hq = d.Hq, p.Hkv = spec.num_kv_heads, p.D = spec.head_dim, p.Dv = spec.dv();
  p.page_size = spec.page_size, p.num_pages = spec.num_pages;
  p.kv_dtype = spec.dtype;
  p.dtype = spec.quantized() ? q.dtype() : spec.dtype;

  if (q.rank() != 3 || q.dim(0) != d.N || q.dim(1) != d.Hq || q.dim(2) != p.D)
    fail(ErrorCode::shape_mismatch, "q: expected shape [N=" + std::to_string(d.N) +
                                        ", Hq=" + std::to_string(d.Hq) + ", D=" + std::to_string(p.D) +
                                        "] (N and Hq from the plan, D from the cache), got " +
                                        (q.empty() ? std::string("none") : shape_string(q.shape())));
  if (q.data() == nullptr && !q.on_device() && q.numel() != 0)
    fail(ErrorCode::invalid_argument, "q: null data pointer");
  if (spec.quantized()) {
    // An 8-bit cache runs in q's dtype: its codes are dequantized in the kernels, q never converted.
    if (!is_float(q.dtype()))
      fail(ErrorCode::unsupported_dtype,
           "q: dtype " + std::string(dtype_name(q.dtype())) + "; an " + std::string(dtype_name(spec.dtype)) +
               " cache takes f32, f16 or bf16 queries (the output has q's dtype)");
    if (runtime_dtype && *runtime_dtype != q.dtype())
      fail(ErrorCode::unsupported_dtype,
           "q: dtype " + std::string(dtype_name(q.dtype())) + " differs from the runtime_dtype " +
               std::string(dtype_name(*runtime_dtype)) + " (a call over an " +
               std::string(dtype_name(spec.dtype)) + " cache runs in q's dtype; q is never converted)");
  } else {
    if (q.dtype() != spec.dtype)
      fail(ErrorCode::unsupported_dtype,
           "q: dtype " + std::string(dtype_name(q.dtype())) + " differs from the cache's " +
               std::string(dtype_name(spec.dtype)) + " (a paged call runs in the cache's dtype)");
    if (runtime_dtype && *runtime_dtype != spec.dtype)
      fail(ErrorCode::unsupported_dtype,
           "runtime_dtype: " + std::string(dtype_name(*runtime_dtype)) + " differs from the cache's dtype " +
               std::string(dtype_name(spec.dtype)) +
               " (a paged call runs in the cache's dtype; the cache is never converted)");
  }
  if (md.runtime_softmax_dtype != DType::f32)
    fail(ErrorCode::unsupported_dtype, "runtime_softmax_dtype: only f32 is supported, got " +
                                           std::string(dtype_name(md.runtime_softmax_dtype)));
  p.owned.reserve(4);
  if (q.stride(2) != 1 && q.dim(2) > 1) {
    if (q.on_device())
      fail(ErrorCode::invalid_argument, "q: a device tensor whose last dimension is not contiguous (stride " +
                                            std::to_string(q.stride(2)) + "); make it contiguous");
    p.owned.push_back(Tensor::copy_of(q));
    p.q = p.owned.back().view();
  } else {
    p.q = q;
  }
  p.k_pages = cache.k_pages();
  p.v_pages = cache.v_pages();
  if (spec.quantized()) {
    p.scales = spec.scales;
    if (spec.scales == KVScales::per_token) p.k_scales = cache.k_scales(), p.v_scales = cache.v_scales();
    p.k_scale = cache.tensor_scales().k, p.v_scale = cache.tensor_scales().v;
  }

  // Soft cap and sinks, as make_problem.
  if (o.logits_soft_cap) {
    const double cap = *o.logits_soft_cap;
    if (!std::isfinite(cap) || cap < std::numeric_limits<float>::min() ||
        cap > std::numeric_limits<float>::max())
      fail(ErrorCode::invalid_argument, "logits_soft_cap: expected a number in the normal f32 range [" +
                                            short_number(std::numeric_limits<float>::min()) + ", " +
                                            short_number(std::numeric_limits<float>::max()) + "], got " +
                                            short_number(cap));
    p.soft_cap = cap;
  }
  if (const std::optional<TensorView>& sinks = sinks_option(o.sinks, o.softmax_aux)) {
    check_sinks(*sinks, p.Hq, /*host_only=*/true);
    p.owned.push_back(Tensor::copy_of(*sinks, DType::f32));
    p.sinks = p.owned.back().data_as<float>();
  }

  // Scale: the kernels compute in fp32, so a scale above 1 that could carry finite inputs past the
  // f32 range is refused, as for dense calls (checked over the keys this batch reads).
  if (softmax_scale) {
    if (!std::isfinite(*softmax_scale))
      fail(ErrorCode::invalid_argument,
           "softmax_scale: expected a finite number, got " + std::to_string(*softmax_scale));
    p.scale = *softmax_scale;
    if (std::fabs(p.scale) > 1.0 && !p.on_device()) {
      const double mq = max_abs_q(p.q), mk = max_abs_keys(p);
      const double bound = std::fabs(p.scale) * static_cast<double>(p.D) * mq * mk;
      if (bound > std::numeric_limits<float>::max())
        fail(ErrorCode::invalid_argument,
             "softmax_scale: " + short_number(p.scale) +
                 " can carry the logits out of the f32 range the kernels compute in: "
                 "|scale| * D * max|q| * max|k| = " +
                 short_number(bound) + "; use a smaller scale or rescale q and k");
    }
  } else {
    p.scale = 1.0 / std::sqrt(static_cast<double>(p.D));
  }

  p.want_lse = o.return_lse;
  if (environment().profile) p.profile = true;
  if (num_threads < 0)
    fail(ErrorCode::invalid_argument,
         "num_threads: expected >= 0 (0 = OpenMP default), got " + std::to_string(num_threads));
  p.num_threads = std::min(num_threads, max_worker_threads());
  const std::vector<Backend>& asked = o.backends ? *o.backends : md.backends;
  p.gpu_asked = std::find(asked.begin(), asked.end(), Backend::gpu) != asked.end();
  return p;
}

PagedBuffers allocate_paged_buffers(const PagedProblem& p) {
  PagedBuffers b;
  if (!p.q.on_device()) b.out = Tensor(p.dtype, {p.N, p.Hq, p.Dv});
  if (p.want_lse) {
    b.lse = Tensor(DType::f32, {p.N, p.Hq});
    float* l = b.lse->data_as<float>();
    for (i64 i = 0; i < p.N * p.Hq; ++i) l[i] = -std::numeric_limits<float>::infinity();
  }
  return b;
}

}  // namespace attnops
