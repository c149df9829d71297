#include "cli/run_paged.h"

#include <algorithm>
#include <cmath>
#include <iostream>

#include "cli/npy.h"
#include "cli/output_set.h"

namespace attnops::cli {

void add_paged_options(CLI::App* app, PagedArgs& a) {
  app->add_option("--k-pages", a.k_pages,
                  "Paged run (--op ragged_paged): key pages [P, page_size, Hkv, D] (.npy)");
  app->add_option("--v-pages", a.v_pages, "Paged run: value pages [P, page_size, Hkv, Dv] (.npy)");
  app->add_option("--page-table", a.page_table, "Paged run: page table [S, max_pages] i32|i64 (.npy)");
  app->add_option(
      "--cu-seqlens-q", a.cu_seqlens_q,
      "Paged run: query rows of sequence s are [cu[s], cu[s+1]) of q [N, Hq, D]; [S+1] i32|i64 (.npy)");
  app->add_option("--kv-lens", a.kv_lens,
                  "Paged run: keys per sequence, this step's included; [S] i32|i64 (.npy)");
  app->add_option("--num-seqs", a.num_seqs,
                  "Paged run: only the first S >= 0 sequences of the index arrays (default -1: all)");
  a.kv_split_opt =
      app->add_option("--kv-split-tokens", a.kv_split_tokens,
                      "Paged run: split each sequence's keys every T tokens (batch invariant; default 512)");
  app->add_flag("--no-share-prefixes", a.no_share_prefixes,
                "Paged run: read shared prefix pages once per sequence (the results are the same bits)");
  app->add_option("--kv-dtype", a.kv_dtype,
                  "Paged run: an 8-bit cache, int8 or fp8_e4m3: float page files are quantized on load, "
                  "uint8 page files are e4m3 codes")
      ->check(CLI::IsMember({"int8", "fp8_e4m3"}));
  app->add_option("--k-scales", a.k_scales,
                  "Paged run, 8-bit pages: f32 scales [P, page_size, Hkv] (per token) or [1] (.npy)");
  app->add_option("--v-scales", a.v_scales, "Paged run, 8-bit pages: the values' scales, as --k-scales");
  app->add_option("--kv-scales", a.kv_scales,
                  "Paged run, quantizing on load: per_token (each row's, default) or per_tensor")
      ->check(CLI::IsMember({"per_token", "per_tensor"}));
}

namespace {

Tensor read_as(const std::string& path, std::optional<DType> dtype) {
  Tensor t = read_npy(path);
  if (dtype && is_float(t.dtype()) && t.dtype() != *dtype) return Tensor::copy_of(t, *dtype);
  return t;
}

// A '|u1' page file (read as i32 values 0..255) as e4m3 codes.
Tensor as_fp8(const Tensor& t) {
  Tensor c(DType::fp8_e4m3, t.shape());
  auto* dst = static_cast<std::uint8_t*>(c.data());
  for (std::int64_t i = 0; i < t.numel(); ++i)
    dst[i] = static_cast<std::uint8_t>(t.data_as<std::int32_t>()[i]);
  return c;
}

// The largest |x| of a float pool, over the largest code: a per-tensor scale that saturates nothing.
float tensor_scale(const Tensor& pool, DType t) {
  float m = 0.f;
  for (std::int64_t i = 0; i < pool.numel(); ++i)
    m = std::max(m, std::fabs(load_as_float(pool.data(), pool.dtype(), static_cast<std::size_t>(i))));
  return kv_row_scale(t, m);
}

// The cache of a run: float pools as they are; 8-bit page files with their scales; float pools
// quantized on load into an 8-bit cache (every slot written through PagedKVCache::write).
PagedKVCache load_cache(const PagedArgs& a, std::optional<DType> dtype) {
  // (--kv-dtype is checked by CLI11 to be int8 or fp8_e4m3; a plain value keeps GCC's
  // -Wmaybe-uninitialized quiet about the optional.)
  const DType kv8 = a.kv_dtype == "fp8_e4m3" ? DType::fp8_e4m3 : DType::i8;
  std::optional<DType> kv;
  if (!a.kv_dtype.empty()) kv = kv8;
  Tensor k = read_npy(a.k_pages), v = read_npy(a.v_pages);
  const auto scales = [&]() -> std::pair<Tensor, Tensor> {
    if (a.k_scales.empty() != a.v_scales.empty())
      throw Error(ErrorCode::invalid_argument, "--k-scales and --v-scales go together");
    if (a.k_scales.empty()) return {};
    return {read_npy(a.k_scales), read_npy(a.v_scales)};
  };
  if (k.dtype() == DType::i32 && v.dtype() == DType::i32 && kv == DType::fp8_e4m3)
    k = as_fp8(k), v = as_fp8(v);
  if (k.dtype() == DType::i32 || v.dtype() == DType::i32)
    throw Error(ErrorCode::unsupported_dtype,
                std::string(k.dtype() == DType::i32 ? "--k-pages" : "--v-pages") +
                    ": integer pages other than int8 ('|i1'); uint8 ('|u1') pages are e4m3 codes with "
                    "--kv-dtype fp8_e4m3");
  if (is_kv8(k.dtype()) || is_kv8(v.dtype())) {  // 8-bit page files, with their scales
    if (kv && kv8 != k.dtype())
      throw Error(ErrorCode::unsupported_dtype, "--kv-dtype " + a.kv_dtype + ": the page files hold " +
                                                    std::string(dtype_name(k.dtype())) + " codes");
    auto [ks, vs] = scales();
    return PagedKVCache::from_tensors(std::move(k), std::move(v), std::move(ks), std::move(vs));
  }
  if (!kv) {
    if (!a.k_scales.empty() || !a.v_scales.empty())
      throw Error(ErrorCode::invalid_argument,
                  "--k-scales: scales belong to 8-bit pages (int8 page files, or --kv-dtype to quantize)");
    if (dtype && k.dtype() != *dtype) k = Tensor::copy_of(k, *dtype);
    if (dtype && v.dtype() != *dtype) v = Tensor::copy_of(v, *dtype);
    return PagedKVCache::from_tensors(std::move(k), std::move(v));
  }
  // Quantize on load: every slot of the float pools written into an 8-bit cache.
  if (k.rank() != 4 || v.rank() != 4 || !is_float(k.dtype()) || !is_float(v.dtype()))
    throw Error(ErrorCode::shape_mismatch,
                "--k-pages / --v-pages: float pools [P, page_size, Hkv, D | Dv] to "
                "quantize, got " +
                    shape_string(k.shape()) + " and " + shape_string(v.shape()));
  PagedKVSpec spec{k.dim(0),
                   k.dim(1),
                   k.dim(2),
                   k.dim(3),
                   v.dim(3),
                   *kv,
                   a.kv_scales == "per_tensor" ? KVScales::per_tensor : KVScales::per_token};
  std::optional<KVTensorScales> ts;
  if (spec.scales == KVScales::per_tensor) {
    auto [ks, vs] = scales();
    const auto given = [](const Tensor& t, const char* name) {
      if (t.data() == nullptr) return false;  // not given: from the pool
      if (t.numel() != 1 || t.dtype() != DType::f32)
        throw Error(ErrorCode::shape_mismatch,
                    std::string(name) + ": per-tensor scales are one f32 value, got " +
                        shape_string(t.shape()) + " " + std::string(dtype_name(t.dtype())));
      return true;
    };
    ts = KVTensorScales{given(ks, "--k-scales") ? ks.at(0) : tensor_scale(k, kv8),
                        given(vs, "--v-scales") ? vs.at(0) : tensor_scale(v, kv8)};
  } else if (!a.k_scales.empty()) {
    throw Error(
        ErrorCode::invalid_argument,
        "--k-scales: quantizing on load with per-token scales computes them (per_tensor takes [1] files)");
  }
  PagedKVCache cache = PagedKVCache::host(spec, ts);
  const std::int64_t n = spec.num_pages * spec.page_size;
  Tensor slots(DType::i64, {n});
  for (std::int64_t i = 0; i < n; ++i) slots.data_as<std::int64_t>()[i] = i;
  cache.write(TensorView(k.data(), k.dtype(), {n, spec.num_kv_heads, spec.head_dim}),
              TensorView(v.data(), v.dtype(), {n, spec.num_kv_heads, spec.dv()}), slots);
  return cache;
}

}  // namespace

int run_paged(const PagedArgs& a, const PagedRun& r) {
  // Everything that cannot make a paged call fails before any file is read or written.
  for (const std::string& flag : r.dense_only)
    throw Error(ErrorCode::invalid_argument,
                flag +
                    " has no form in a paged run (--k-pages ...): ragged batches take q, the pages, the page "
                    "table, cu_seqlens_q and kv_lens");
  const std::pair<const std::string*, const char*> required[] = {{&a.k_pages, "--k-pages"},
                                                                 {&a.v_pages, "--v-pages"},
                                                                 {&a.page_table, "--page-table"},
                                                                 {&a.cu_seqlens_q, "--cu-seqlens-q"},
                                                                 {&a.kv_lens, "--kv-lens"}};
  for (const auto& [value, flag] : required)
    if (value->empty())
      throw Error(ErrorCode::invalid_argument,
                  std::string(flag) +
                      " is required for a paged run (--k-pages, --v-pages, --page-table, "
                      "--cu-seqlens-q and --kv-lens go together)");
  if (a.num_seqs < -1)
    throw Error(ErrorCode::invalid_argument,
                "--num-seqs: expected -1 (all sequences, the default) or a count >= 0, got " +
                    std::to_string(a.num_seqs));
  const Attention attn = registry().get(r.op, r.config);

  OutputSet outs;  // all or nothing (output_set.h)
  const int out_file = outs.add(r.out, "--out");
  const int lse_file = r.lse_out.empty() ? -1 : outs.add(r.lse_out, "--lse-out");

  const Tensor q = read_as(r.q, r.dtype);
  const PagedKVCache cache = load_cache(a, r.dtype);
  const Tensor table = read_npy(a.page_table), cu = read_npy(a.cu_seqlens_q), kv = read_npy(a.kv_lens);
  PagedAttentionOptions opts = r.options;
  std::optional<Tensor> sinks;
  if (!r.sinks.empty()) opts.sinks = (sinks = read_npy(r.sinks))->view();
  if (a.kv_split_opt && a.kv_split_opt->count()) opts.kv_split_tokens = a.kv_split_tokens;
  opts.share_prefixes = !a.no_share_prefixes;
  opts.return_lse = lse_file >= 0;
  if (q.rank() != 3)
    throw Error(ErrorCode::shape_mismatch, "--q: a paged run takes q [N, Hq, D] (rank 3), got " +
                                               shape_string(q.shape()) + " in " + r.q);
  const RaggedBatch batch{cu, kv, table, a.num_seqs};
  const AttentionOutput o = attn.paged(q, cache, batch, opts);

  write_npy(outs.fd(out_file), outs.name(out_file), o.out);
  if (lse_file >= 0) {
    if (!o.lse) throw Error(ErrorCode::internal, "the operator returned no lse although it was asked for");
    write_npy(outs.fd(lse_file), outs.name(lse_file), *o.lse);
  }
  outs.commit();
  if (r.explain) std::cerr << o.decision.to_json() << std::endl;
  return 0;
}

}  // namespace attnops::cli
