// The cpu backend's paged entry point (baseline code); see paged_cpu.h.
#include "backends/cpu/paged_cpu.h"

#include <algorithm>
#include <atomic>
#include <new>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "attnops/error.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/kv_quant.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/paged_gather.h"
#include "backends/common/parallel_errors.h"
#include "backends/common/threads.h"
#include "backends/common/work_pool.h"
#include "backends/cpu/tier_kernels.h"
#include "backends/cpu/tiled_cpu.h"

namespace attnops::cpu {

namespace {

using i64 = std::int64_t;

// Whether sequence s's output rows are all finite.
bool rows_finite(const PagedProblem& p, const PagedBuffers& b, i64 s) {
  const PagedPlanData& d = *p.batch;
  const auto si = static_cast<std::size_t>(s);
  const i64 es = static_cast<i64>(dtype_size(p.dtype));
  const TensorView rows(static_cast<const char*>(b.out.data()) + d.q_begin[si] * p.Hq * p.Dv * es, p.dtype,
                        {d.q_len[si], p.Hq, p.Dv});
  return all_finite(rows);
}

// Whether the values of keys [lo, hi) of sequence s are all finite (one view per page run; int8
// codes always are, e4m3 ones unless S.1111.111; the scales are checked when the cache is made).
bool values_finite(const PagedProblem& p, i64 s, i64 lo, i64 hi) {
  if (p.kv_dtype == DType::i8) return true;
  const PagedPlanData& d = *p.batch;
  const std::int32_t* pages = d.page_ids.data() + d.page_begin[static_cast<std::size_t>(s)];
  const i64 es = static_cast<i64>(dtype_size(p.kv_dtype)), ps = p.page_size;
  for (i64 j = lo; j < hi; ++j) {
    const auto* row = static_cast<const char*>(p.v_pages.data()) + p.v_offset(pages[j / ps], j % ps, 0) * es;
    if (p.kv_dtype == DType::fp8_e4m3) {
      for (i64 h = 0; h < p.Hkv; ++h)
        for (i64 e = 0; e < p.Dv; ++e)
          if ((static_cast<std::uint8_t>(row[(h * p.v_pages.stride(2) + e)]) & 0x7fu) == 0x7fu) return false;
      continue;
    }
    const TensorView r(row, p.kv_dtype, {p.Hkv, p.Dv}, {p.v_pages.stride(2), 1});
    if (!all_finite(r)) return false;
  }
  return true;
}

// The one parallel loop of the paged cpu path: fn(slot, task) for task < n, handed out one at a
// time on the work pool (backends/common/work_pool.h: the caller takes tasks too, and a worker
// descheduled by a busy machine is never waited for unless it holds a task), on at most `threads`
// threads; slot < threads indexes the per-thread scratch. Which thread runs a task never changes
// its result (each writes its own rows or partials; merges run in split order). An exception is
// caught per task (the pool's tasks must not throw), the remaining tasks are skipped, and the
// first one is rethrown after the loop (parallel_errors.h).
template <class Fn>
void for_each_task(int threads, i64 n, Fn& fn) {
  if (n <= 0) return;
  struct Job {
    Fn* fn = nullptr;
    ParallelErrors errors;
  } job;
  job.fn = &fn;
  run_tasks(
      static_cast<int>(std::clamp<i64>(n, 1, threads)), n,
      [](void* ctx, std::int64_t task, int slot) {
        Job& j = *static_cast<Job*>(ctx);
        if (j.errors.any()) return;
        try {
          (*j.fn)(slot, task);
        } catch (...) {
          j.errors.capture();
        }
      },
      &job);
  job.errors.rethrow("cpu paged_attention");
}

// rows(lo, hi) over [0, n) in pieces of `step` rows on `threads` threads (one piece at a time
// when threads == 1): the tile items' copies in and out, which on one thread took a tenth of a
// 2048-token f32 prefill's time at 16 threads.
template <class Rows>
void for_row_pieces(int threads, i64 n, i64 step, Rows&& rows) {
  auto piece = [&](int, i64 i) { rows(i * step, std::min(n, (i + 1) * step)); };
  for_each_task(threads, (n + step - 1) / step, piece);
}

// The dtype a tile item gathers an 8-bit cache in: q's, except an f16 q whose keys or values can
// reach past f16's range (largest code x largest scale of the keys it reads), which would turn
// the dequantized values into inf: then f32 (the tile runs in f32, q converted).
std::optional<DType> tile_gather_dtype(const PagedProblem& p, i64 s, i64 first) {
  if (!p.quantized() || p.dtype != DType::f16) return std::nullopt;
  constexpr float kF16Max = 65504.f;
  // An int8 pool a caller filled may hold -128 (write() never stores it).
  const float code_max = p.kv_dtype == DType::i8 ? 128.f : kv_code_max(p.kv_dtype);
  float scale_max = std::max(p.k_scale, p.v_scale);
  if (p.per_token_scales()) {
    const PagedPlanData& d = *p.batch;
    const auto si = static_cast<std::size_t>(s);
    const std::int32_t* pages = d.page_ids.data() + d.page_begin[si];
    const auto* ks = static_cast<const float*>(p.k_scales.data());
    const auto* vs = static_cast<const float*>(p.v_scales.data());
    scale_max = 0.f;
    for (i64 j = first; j < d.kv_len[si]; ++j) {
      const i64 page = pages[j / p.page_size], row = j % p.page_size;
      for (i64 h = 0; h < p.Hkv; ++h)
        scale_max = std::max({scale_max, ks[p.ks_offset(page, row, h)], vs[p.vs_offset(page, row, h)]});
    }
  }
  if (code_max * scale_max <= kF16Max) return std::nullopt;
  return DType::f32;
}

// One tile item on `threads` threads: the sequence's keys gathered, the tiled kernel on them (and
// its guarded re-run when the output came out non-finite and the values hold NaN / inf), the rows
// scattered back. The tiled kernel's result does not depend on its thread count; the copies and
// the finiteness checks run in pieces on the same threads.
void run_tile(const PagedProblem& p, const PagedWorkItem& it, PagedBuffers& buffers, const ForcedTier& tier,
              int threads) {
  // Every key from the lowest one a row sees (rounded down to a chunk start, so chunks stay
  // aligned) to kv_len: bottom-right alignment keeps every query's position relative to its keys.
  const i64 first = p.batch->chunk ? it.kv_begin / *p.batch->chunk * *p.batch->chunk : it.kv_begin;
  paged::DenseSequence x =
      paged::dense_sequence(p, it.seq, first, /*gather=*/false, tile_gather_dtype(p, it.seq, first));
  constexpr i64 kRowsPerPiece = 64;
  const i64 T = x.k.dim(1);
  for_row_pieces(threads, T, kRowsPerPiece,
                 [&](i64 lo, i64 hi) { paged::gather_rows(p, it.seq, x, lo, hi); });
  x.metadata.num_threads = threads;
  AttentionProblem dp = make_problem(x.q, x.k, x.v, x.options, x.metadata);
  const auto map = get_block_map(dp.mask, dp.Hq, dp.Tq, dp.Tk, dp.blocksize_q, dp.blocksize_k);
  AttentionBuffers ab = allocate_buffers(dp);
  tiled_attention(dp, *map, ab, tier);
  // Whether rows [lo, hi) of a [1, rows, H, Dh] tensor are all finite, checked in pieces.
  auto finite = [&](const Tensor& t) {
    const i64 rows = t.dim(1), row = t.dim(2) * t.dim(3), es = static_cast<i64>(dtype_size(t.dtype()));
    std::atomic<bool> ok{true};
    for_row_pieces(threads, rows, 4 * kRowsPerPiece, [&](i64 lo, i64 hi) {
      const TensorView v(static_cast<const char*>(t.data()) + lo * row * es, t.dtype(), {(hi - lo) * row});
      if (!all_finite(v)) ok.store(false, std::memory_order_relaxed);
    });
    return ok.load();
  };
  if (!finite(ab.out) && !finite(x.v)) {
    dp.guard_nonfinite_v = true;
    ab = allocate_buffers(dp);
    tiled_attention(dp, *map, ab, tier);
  }
  for_row_pieces(threads, dp.Tq, kRowsPerPiece,
                 [&](i64 lo, i64 hi) { paged::scatter_rows(p, it.seq, ab, buffers, lo, hi); });
}

// A tile item this small (query x key pairs, all q heads) runs on one thread, next to the other
// small ones and the stream items, instead of in a parallel region of its own.
constexpr double kSmallTilePairs = double{1 << 22};

// The stream and shared items `items` (or, guard: the stream sequences `items`, split by split)
// with the small tile items `tiles` beside them, then the merges.
void run_stream_and_small_tiles(const PagedProblem& p, PagedBuffers& buffers, const TierKernels& k,
                                const ForcedTier& tier, int threads, const std::vector<std::int32_t>& items,
                                bool guard, const std::vector<std::int32_t>& tiles) {
  const i64 nt = static_cast<i64>(tiles.size());
  if (items.empty() && nt == 0) return;
  void* job = !items.empty() ? k.paged_stream_begin(p, buffers, threads, items.data(),
                                                    static_cast<i64>(items.size()), guard)
                             : nullptr;
  const i64 n = job ? k.paged_stream_tasks(job) : 0;
  struct End {
    const TierKernels& k;
    void* job;
    ~End() {
      if (job) k.paged_stream_end(job);
    }
  } end{k, job};
  const std::vector<PagedWorkItem>& work = p.batch->work;
  auto item = [&](int slot, i64 t) {
    if (t < n)
      k.paged_stream_item(job, slot, t);
    else
      run_tile(p, work[static_cast<std::size_t>(tiles[static_cast<std::size_t>(t - n)])], buffers, tier, 1);
  };
  for_each_task(threads, n + nt, item);
  if (job) {
    auto merge = [&](int slot, i64 m) { k.paged_stream_merge(job, slot, m); };
    for_each_task(threads, k.paged_stream_merges(job), merge);
  }
}

void run_paged(const PagedProblem& p, PagedBuffers& buffers, std::optional<ForcedTier> forced) {
  if (p.on_device())
    throw Error(ErrorCode::invalid_argument,
                "cpu paged_attention: the cache or q is device-resident; the cpu "
                "backend reads host memory only");
  if (!is_float(p.dtype))
    throw Error(
        ErrorCode::unsupported_dtype,
        "cpu paged_attention: dtype " + std::string(dtype_name(p.dtype)) + ", expected f32, f16 or bf16");
  IsaChoice forced_choice;
  const IsaChoice& c = forced ? (forced_choice = choose_forced_tier(*forced)) : current_isa_choice();
  const PagedPlanData& d = *p.batch;
  const int threads = worker_threads(p.num_threads);
  // The tile items run the tiled kernel on the same tier (a forced one's table included).
  const ForcedTier tier = forced ? *forced : ForcedTier(c.tier);
  const TierKernels& k = tier.table ? *tier.table : tier_kernels(c.tier);

  std::vector<std::int32_t> stream(static_cast<std::size_t>(d.num_stream_items)), small, large;
  std::iota(stream.begin(), stream.end(), 0);
  for (i64 i = d.num_stream_items; i < static_cast<i64>(d.work.size()); ++i) {
    const PagedWorkItem& it = d.work[static_cast<std::size_t>(i)];
    const double pairs = static_cast<double>(it.q_end - it.q_begin) *
                         static_cast<double>(it.kv_end - it.kv_begin) * static_cast<double>(p.Hq);
    (pairs <= kSmallTilePairs ? small : large).push_back(static_cast<std::int32_t>(i));
  }
  try {
    run_stream_and_small_tiles(p, buffers, k, tier, threads, stream, false, small);
    // The non-finite policy per sequence: a stream sequence whose rows came out non-finite while
    // its values are not all finite is re-run, split by split, with weight-0 keys skipped.
    std::vector<std::int32_t> guarded;
    for (i64 s = 0; s < d.S; ++s) {
      const auto si = static_cast<std::size_t>(s);
      if (!d.is_stream[si] || d.unions[si].hi <= d.unions[si].lo) continue;
      if (!rows_finite(p, buffers, s) && !values_finite(p, s, d.unions[si].lo, d.unions[si].hi))
        guarded.push_back(static_cast<std::int32_t>(s));
    }
    if (!guarded.empty()) run_stream_and_small_tiles(p, buffers, k, tier, threads, guarded, true, {});
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, "cpu paged_attention: cannot allocate the stream kernel's scratch");
  }
  for (std::int32_t i : large) run_tile(p, d.work[static_cast<std::size_t>(i)], buffers, tier, threads);

  buffers.run.kernel = std::string(isa_name(c.tier));
  std::string shared;
  if (d.num_shared_items > 0)
    shared = std::to_string(d.num_shared_items) + " shared items (" + std::to_string(d.shared_keys) +
             " keys read once for the rows of " + std::to_string(d.members.size()) +
             " sequence splits in the same pages), ";
  buffers.run.kernel_detail =
      shared + std::to_string(d.num_stream_items - d.num_shared_items) +
      " stream items (K/V pages read in place" +
      (p.quantized() ? std::string(", ") + std::string(dtype_name(p.kv_dtype)) + " codes x " +
                           std::string(kv_scales_name(p.scales)) + " scales dequantized in registers"
                     : std::string()) +
      ", once per step for every q head of a kv head; split every " + std::to_string(d.split_tokens) +
      " keys, merged in split order), " + std::to_string(small.size() + large.size()) +
      " tile items (keys gathered, the tiled kernel; " + std::to_string(small.size()) +
      " on one thread each); " + c.detail;
  buffers.run.batch_invariant = true;
  buffers.run.shared_keys = d.shared_keys;
}

}  // namespace

void paged_attention(const PagedProblem& p, PagedBuffers& buffers) {
  run_paged(p, buffers, std::nullopt);
}
void paged_attention(const PagedProblem& p, PagedBuffers& buffers, ForcedTier tier) {
  run_paged(p, buffers, tier);
}

}  // namespace attnops::cpu
