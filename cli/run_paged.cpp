#include "cli/run_paged.h"

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
}

namespace {

Tensor read_as(const std::string& path, std::optional<DType> dtype) {
  Tensor t = read_npy(path);
  if (dtype && is_float(t.dtype()) && t.dtype() != *dtype) return Tensor::copy_of(t, *dtype);
  return t;
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
  const PagedKVCache cache =
      PagedKVCache::from_tensors(read_as(a.k_pages, r.dtype), read_as(a.v_pages, r.dtype));
  const Tensor table = read_npy(a.page_table), cu = read_npy(a.cu_seqlens_q), kv = read_npy(a.kv_lens);
  PagedAttentionOptions opts = r.options;
  std::optional<Tensor> sinks;
  if (!r.sinks.empty()) opts.softmax_aux = (sinks = read_npy(r.sinks))->view();
  if (a.kv_split_opt && a.kv_split_opt->count()) opts.kv_split_tokens = a.kv_split_tokens;
  opts.return_lse = lse_file >= 0;
  if (q.rank() != 3)
    throw Error(ErrorCode::shape_mismatch, "--q: a paged run takes q [N, Hq, D] (rank 3), got " +
                                               shape_string(q.shape()) + " in " + r.q);
  const RaggedBatch batch{cu, kv, table, a.num_seqs};
  const AttentionOutput o = attn.paged(q, cache, batch, opts);

  write_npy(outs.fd(out_file), outs.name(out_file), o.attention_outputs);
  if (lse_file >= 0) {
    if (!o.lse) throw Error(ErrorCode::internal, "the operator returned no lse although it was asked for");
    write_npy(outs.fd(lse_file), outs.name(lse_file), *o.lse);
  }
  outs.commit();
  if (r.explain) std::cerr << o.decision.to_json() << std::endl;
  return 0;
}

}  // namespace attnops::cli
