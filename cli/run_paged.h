// The paged part of `attnops run`: one ragged_paged call on a paged KV cache read from .npy files.
//
//   attnops run --op ragged_paged --q q.npy --k-pages kp.npy --v-pages vp.npy --page-table pt.npy
//               --cu-seqlens-q cu.npy --kv-lens kl.npy --out o.npy [--lse-out l.npy] [--num-seqs S]
//               [--kv-split-tokens T] [--no-share-prefixes] [--kv-dtype int8|fp8_e4m3]
//               [--k-scales ks.npy --v-scales vs.npy] [--kv-scales per_token|per_tensor]
//               [the dense run's option flags: --causal/--no-causal, --window, --chunk, --soft-cap,
//               --sinks, --scale, --backend, --threads, --dtype, --config, --explain]
//
// q [N, Hq, D], pages [P, page_size, Hkv, D | Dv] (f32 or f16; --dtype converts q and the pools),
// index arrays i32 or i64; out [N, Hq, Dv] (bf16 written as f32), lse [N, Hq] f32. Flags a ragged
// batch has no form for (--k, --v, --bias, --segment-ids-*, --weights-out, --dout and the gradient
// outputs) and missing paged inputs exit 2 with "error:" before anything is read or written.
//
// 8-bit caches (paged.h, kv_quant.h): page files of codes, int8 ('|i1') or e4m3 bit patterns
// ('|u1', with --kv-dtype fp8_e4m3), with their f32 scales --k-scales / --v-scales ([P, page_size,
// Hkv] per token or [1] per tensor); or float page files quantized on load with --kv-dtype
// (per-token scales from each row, or --kv-scales per_tensor: the scales given, else each pool's
// absolute maximum over the largest code). q stays in its float dtype.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"

namespace attnops::cli {

struct PagedArgs {
  std::string k_pages, v_pages, page_table, cu_seqlens_q, kv_lens;
  std::string kv_dtype, k_scales, v_scales, kv_scales = "per_token";
  long long num_seqs = -1, kv_split_tokens = 0;
  bool no_share_prefixes = false;
  CLI::Option* kv_split_opt = nullptr;
  // Any paged input given: the run is a paged one.
  bool requested() const {
    return !k_pages.empty() || !v_pages.empty() || !page_table.empty() || !cu_seqlens_q.empty() ||
           !kv_lens.empty();
  }
};

void add_paged_options(CLI::App* app, PagedArgs& a);

// What the rest of `attnops run` hands the paged run.
struct PagedRun {
  Config config;  // the --config file (or the defaults); the flags are per-call settings in `options`
  std::string op, q, out, lse_out;
  std::optional<DType> dtype;  // --dtype
  PagedAttentionOptions options;
  std::string sinks;  // --sinks file
  bool explain = false;
  // Dense-only flags that were given (name, e.g. "--bias"): each is an error for a paged run.
  std::vector<std::string> dense_only;
};

// Runs it; returns the exit status. Typed errors (attnops::Error) propagate to main.
int run_paged(const PagedArgs& a, const PagedRun& r);

}  // namespace attnops::cli
