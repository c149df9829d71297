#include "benchkit/bench_serving.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <new>
#include <nlohmann/json.hpp>
#include <vector>

#include "attnops/attnops.h"
#include "benchkit/median_timer.h"
#include "benchkit/parse.h"
#include "benchkit/progress.h"
#include "benchkit/read_bandwidth.h"
#include "core/printable.h"

namespace attnops::benchkit {

namespace {

using i64 = std::int64_t;
using Clock = std::chrono::steady_clock;

std::uint64_t mix(std::uint64_t z) {  // splitmix64's finaliser: cheap, deterministic
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Fills n float elements of dtype dt at `data` with values in [-1, 1) from `seed`, in parallel
// (the pools reach gigabytes).
void fill(void* data, DType dt, i64 n, std::uint64_t seed) {
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < n; ++i) {
    const float u =
        static_cast<float>(mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i)) >> 40) *
            (2.0f / 16777216.0f) -
        1.0f;
    if (dt == DType::f32)
      static_cast<float*>(data)[i] = u;
    else
      static_cast<std::uint16_t*>(data)[i] =
          dt == DType::bf16 ? float_to_bf16_bits(u) : float_to_half_bits(u);
  }
}

// Fills n bytes of 8-bit codes: int8 in [-127, 127], e4m3 of any finite value (no NaN code).
void fill_codes(void* data, DType dt, i64 n, std::uint64_t seed) {
  auto* b = static_cast<std::uint8_t*>(data);
#pragma omp parallel for schedule(static)
  for (i64 i = 0; i < n; ++i) {
    const std::uint64_t r = mix(seed * 0x9e3779b97f4a7c15ull + static_cast<std::uint64_t>(i));
    if (dt == DType::i8) {
      b[i] = static_cast<std::uint8_t>(static_cast<std::int8_t>(static_cast<int>(r % 255) - 127));
    } else {
      std::uint8_t c = static_cast<std::uint8_t>(r);
      if ((c & 0x7fu) == 0x7fu) c ^= 1u;
      b[i] = c;
    }
  }
}

}  // namespace

ServingBatch make_serving_batch(const ServingRowSpec& r, i64 page_size, DType dt, std::uint64_t seed,
                                std::optional<DType> kv_dtype) {
  ServingBatch b;
  b.S = r.seqs;
  std::uint64_t state = seed;
  const auto next = [&] { return mix(state += 0x9e3779b97f4a7c15ull); };
  std::vector<i64> kv(static_cast<std::size_t>(b.S)), ql(kv.size()), need(kv.size());
  const i64 n_prefill = std::llround(r.prefill_fraction * static_cast<double>(b.S));
  const i64 prefix_pages = r.shared_prefix / page_size, prefix = prefix_pages * page_size;
  i64 pages = prefix_pages, width = 1;
  for (i64 s = 0; s < b.S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    kv[si] =
        prefix + r.kv_min + static_cast<i64>(next() % static_cast<std::uint64_t>(r.kv_max - r.kv_min + 1));
    ql[si] = std::min(kv[si], s < n_prefill ? r.prefill_q_len : r.q_len);
    need[si] = (kv[si] + page_size - 1) / page_size;
    pages += need[si] - prefix_pages, width = std::max(width, need[si]);
    b.N += ql[si], b.kv_tokens += kv[si];
    b.pairs += static_cast<double>(ql[si]) * static_cast<double>(kv[si]) -
               static_cast<double>(ql[si]) * static_cast<double>(ql[si] - 1) / 2;  // causal
  }
  // Checked before anything of the row's size is allocated (page ids are int32).
  if (static_cast<std::uint64_t>(pages) > kMaxServingPages)
    throw Error(ErrorCode::invalid_argument, "serving row '" + printable(r.label, 100) + "' page " +
                                                 std::to_string(page_size) + ": " + std::to_string(pages) +
                                                 " pages, more than the " + std::to_string(kMaxServingPages) +
                                                 " an int32 page table can index");
  // Pages handed out in a random order, as an engine's free list does after a while (the shared
  // prefix's first).
  std::vector<std::int32_t> ids(static_cast<std::size_t>(pages));
  for (i64 i = 0; i < pages; ++i) ids[static_cast<std::size_t>(i)] = static_cast<std::int32_t>(i);
  for (i64 i = pages - 1; i > 0; --i)
    std::swap(ids[static_cast<std::size_t>(i)],
              ids[static_cast<std::size_t>(next() % static_cast<std::uint64_t>(i + 1))]);
  b.cu = Tensor(DType::i32, {b.S + 1});
  b.kv = Tensor(DType::i32, {b.S});
  b.table = Tensor(DType::i32, {b.S, width});
  i64 at = prefix_pages, cu = 0;
  for (i64 s = 0; s < b.S; ++s) {
    const auto si = static_cast<std::size_t>(s);
    b.cu.data_as<std::int32_t>()[s] = static_cast<std::int32_t>(cu);
    cu += ql[si];
    b.kv.data_as<std::int32_t>()[s] = static_cast<std::int32_t>(kv[si]);
    for (i64 j = 0; j < need[si]; ++j)
      b.table.data_as<std::int32_t>()[s * width + j] =
          ids[static_cast<std::size_t>(j < prefix_pages ? j : at++)];
  }
  b.cu.data_as<std::int32_t>()[b.S] = static_cast<std::int32_t>(cu);
  const DType kt = kv_dtype.value_or(dt);
  const PagedKVSpec spec{std::max<i64>(pages, 1), page_size, r.Hkv, r.D, r.D, kt, r.scales};
  const float scale = is_kv8(kt) ? 1.f / kv_code_max(kt) : 1.f;
  std::optional<KVTensorScales> ts;
  if (is_kv8(kt) && r.scales == KVScales::per_tensor) ts = KVTensorScales{scale, scale};
  b.cache = PagedKVCache::host(spec, ts);
  b.q = Tensor(dt, {b.N, r.Hq, r.D});
  fill(b.q.data(), dt, b.q.numel(), seed + 1);
  // The pools: the cache's own (contiguous) tensors, filled in place.
  if (is_kv8(kt)) {
    fill_codes(const_cast<void*>(b.cache.k_pages().data()), kt, b.cache.k_pages().numel(), seed + 2);
    fill_codes(const_cast<void*>(b.cache.v_pages().data()), kt, b.cache.v_pages().numel(), seed + 3);
    if (r.scales == KVScales::per_token)
      for (const TensorView& sv : {b.cache.k_scales(), b.cache.v_scales()}) {
        auto* f = static_cast<float*>(const_cast<void*>(sv.data()));
        for (i64 i = 0; i < sv.numel(); ++i) f[i] = scale;
      }
  } else {
    fill(const_cast<void*>(b.cache.k_pages().data()), kt, b.cache.k_pages().numel(), seed + 2);
    fill(const_cast<void*>(b.cache.v_pages().data()), kt, b.cache.v_pages().numel(), seed + 3);
  }
  b.key_bytes = static_cast<double>(r.Hkv * 2 * r.D) * static_cast<double>(dtype_size(kt)) +
                (is_kv8(kt) && r.scales == KVScales::per_token ? static_cast<double>(r.Hkv * 2 * 4) : 0.0);
  b.batch = {b.cu, b.kv, b.table};
  return b;
}

namespace {

struct Result {
  std::string label, asked, backend, kernel, error;
  i64 page = 0, seqs = 0, tokens = 0, kv_tokens = 0, shared_keys = 0;
  DType dtype = DType::f32;
  std::optional<DType> kv_dtype;  // nullopt: dtype
  bool share = true;
  double median_ms = NAN, plan_us = NAN, tokens_per_s = NAN, kv_gbps = NAN, vs_bw = NAN, gflops = NAN;
  double dense_ms = NAN, vs_dense = NAN, max_err = NAN;
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  double m = 0;
  for (i64 i = 0; i < a.numel(); ++i) {
    const double d =
        std::fabs(static_cast<double>(a.at(static_cast<std::size_t>(i))) - b.at(static_cast<std::size_t>(i)));
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

// One row, ready to time: its batch, plan, cache (device copies for gpu_resident), the paged call
// and, with compare: dense, the dense call over the same tokens. Rows are prepared first and then
// timed in rounds (each round samples every row once), so that the rows of a run, whose ratios
// are the figures, see the same machine even when its load drifts.
struct Prepared {
  Result* res = nullptr;
  const ServingRowSpec* r = nullptr;
  Config config;
  std::optional<Attention> attn, dense;
  PagedAttentionOptions opts;
  AttentionOptions dense_opts;  // the row's backend and threads, for the dense comparison
  ServingBatch b;
  PagedPlan plan;
  PagedKVCache cache;
  DeviceTensor dq, dk, dv, dqd;
  Tensor k, v;
  TensorView q;
  double keys_read = 0;
  bool resident = false;
  std::vector<double> ms, plan_us, dense_ms;

  AttentionOutput call() const {
    return resident ? attn->paged(dq, cache, plan, opts) : attn->paged(b.q, cache, plan, opts);
  }
  void dense_call() const {
    if (resident)
      (void)(*dense)(dqd, dk, dv, dense_opts);
    else
      (void)(*dense)(q, k, v, dense_opts);
  }
  double plan_sample() {
    const auto t0 = Clock::now();
    int calls = 0;
    double total = 0;
    do {
      plan = plan_paged(b.batch, b.cache.spec(), b.N, r->Hq, opts);
      ++calls;
      total = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    } while (total < 20000 && calls < 2000);
    return total / calls;
  }
};

void prepare_row(Prepared& x, const Config& base, const CallSettings& threads) {
  Result& res = *x.res;
  const ServingRowSpec& r = *x.r;
  x.config = base;
  CallSettings settings = threads;
  // gpu_resident: the page pools and q live on the device during the timing (the serving case: a
  // device-resident cache); gpu: a host cache, its pools uploaded whole every call.
  x.resident = res.asked == "gpu_resident";
  settings.backends = parse_backend_list(x.resident ? "gpu" : res.asked);
  x.attn = registry().get("ragged_paged", x.config);
  set_call_settings(x.opts, settings);
  set_call_settings(x.dense_opts, settings);
  x.opts.kv_split_tokens = r.kv_split_tokens;
  x.opts.return_lse = false;
  x.opts.share_prefixes = res.share;

  x.b = make_serving_batch(r, res.page, res.dtype, 7, res.kv_dtype);
  const ServingBatch& b = x.b;
  res.seqs = b.S, res.tokens = b.N, res.kv_tokens = b.kv_tokens;
  x.plan = plan_paged(b.batch, b.cache.spec(), b.N, r.Hq, x.opts);
  x.cache = b.cache;
  if (x.resident) {
    const GpuSettings& gpu = x.attn->metadata().gpu;
    const bool token = b.cache.spec().quantized() && b.cache.spec().scales == KVScales::per_token;
    x.cache = PagedKVCache::from_device(to_device(b.cache.k_pages(), gpu), to_device(b.cache.v_pages(), gpu),
                                        token ? to_device(b.cache.k_scales(), gpu) : DeviceTensor(),
                                        token ? to_device(b.cache.v_scales(), gpu) : DeviceTensor());
    if (!token && b.cache.spec().quantized())  // per tensor: the scales stay host values
      x.cache =
          PagedKVCache::wrap(x.cache.k_pages(), x.cache.v_pages(), b.cache.k_scales(), b.cache.v_scales());
    x.dq = to_device(b.q, gpu);
  }
  // Keys read: every sequence's, a shared item's keys once for its members.
  x.keys_read = static_cast<double>(b.kv_tokens);
  for (const PagedWorkItem& it : x.plan.work())
    if (it.kind == PagedWorkKind::shared)
      x.keys_read -= static_cast<double>((it.member_count - 1) * (it.kv_end - it.kv_begin));
  res.shared_keys = x.plan.shared_keys();
  const AttentionOutput out = x.call();  // warm-up
  res.backend = std::string(backend_name(out.decision.backend));
  res.kernel = out.decision.run.kernel;

  if (r.compare_dense && !b.cache.spec().quantized()) {  // the same tokens as one dense call
    // Every sequence has kv_min keys and N / S queries: k, v [S, kv, Hkv, D], q [S, N / S, Hq, D].
    const i64 S = b.S, T = r.kv_min, Tq = b.N / S;
    x.k = Tensor(res.dtype, {S, T, r.Hkv, r.D}), x.v = Tensor(res.dtype, {S, T, r.Hkv, r.D});
    const auto bytes = static_cast<std::size_t>(T * r.Hkv * r.D) * dtype_size(res.dtype);
    for (i64 s = 0; s < S; ++s) {
      const TensorView row(b.table.data_as<std::int32_t>() + s * b.table.dim(1), DType::i32,
                           {b.table.dim(1)});
      const PagedKVCache::Dense kv = b.cache.gather(row, T);
      std::memcpy(static_cast<char*>(x.k.data()) + static_cast<std::size_t>(s) * bytes, kv.k.data(), bytes);
      std::memcpy(static_cast<char*>(x.v.data()) + static_cast<std::size_t>(s) * bytes, kv.v.data(), bytes);
    }
    x.q = TensorView(b.q.data(), res.dtype, {S, Tq, r.Hq, r.D});
    x.dense = registry().get("flash_attn2", x.config);
    if (x.resident) {
      const GpuSettings& gpu = x.attn->metadata().gpu;
      x.dk = to_device(x.k, gpu), x.dv = to_device(x.v, gpu), x.dqd = to_device(x.q, gpu);
    }
    x.dense_call();  // warm-up
  }
}

// Medians of the samples, the rates from them, and the accuracy on a cut-down batch.
void finish_row(Prepared& x, double read_gbps) {
  Result& res = *x.res;
  const ServingRowSpec& r = *x.r;
  res.median_ms = median_of(x.ms);
  res.plan_us = median_of(x.plan_us);
  const double sec = res.median_ms * 1e-3;
  res.tokens_per_s = static_cast<double>(x.b.N) / sec;
  res.kv_gbps = x.keys_read * x.b.key_bytes * 1e-9 / sec;
  if (read_gbps > 0) res.vs_bw = res.kv_gbps / read_gbps;
  res.gflops = x.b.pairs * static_cast<double>(r.Hq) * 4.0 * static_cast<double>(r.D) * 1e-9 / sec;
  if (!x.dense_ms.empty()) {
    res.dense_ms = median_of(x.dense_ms);
    res.vs_dense = res.dense_ms / res.median_ms;
  }
  // Accuracy on a cut-down batch of the same kind, against the native backend (the fp64 oracle).
  ServingRowSpec small = r;
  small.seqs = std::min<i64>(r.seqs, 4);
  small.kv_max = std::min<i64>(r.kv_max, 512), small.kv_min = std::min(r.kv_min, small.kv_max);
  small.prefill_q_len = std::min<i64>(r.prefill_q_len, 64);
  if (small.prefill_fraction > 0 && small.seqs > 1)
    small.prefill_fraction = std::max(small.prefill_fraction, 0.5);
  small.shared_prefix = std::min<i64>(r.shared_prefix, 256);
  const ServingBatch v = make_serving_batch(small, res.page, res.dtype, 11, res.kv_dtype);
  PagedAttentionOptions native = x.opts;
  native.backends = {{Backend::native}};
  const AttentionOutput got = x.attn->paged(v.q, v.cache, v.batch, x.opts);
  const AttentionOutput want = x.attn->paged(v.q, v.cache, v.batch, native);
  res.max_err = max_abs_diff(got.out, want.out);
}

std::string fmt(const char* f, double v) {
  if (std::isnan(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof b, f, v);
  return b;
}

}  // namespace

std::string run_serving_bench(const BenchSpec& spec, const Config& config, int threads, std::ostream& out,
                              bool want_json, bool progress) {
  std::vector<Result> rows;
  std::vector<const ServingRowSpec*> specs;
  for (const ServingRowSpec& r : spec.serving)
    for (i64 page : r.page_sizes)
      for (DType dt : spec.dtypes)
        for (const std::optional<DType>& kv : r.kv_dtypes)
          for (const bool share : r.share)
            for (const std::string& backend : spec.backends) {
              Result x;
              x.label = r.label, x.asked = backend, x.page = page, x.dtype = dt;
              x.kv_dtype = kv, x.share = share;
              rows.push_back(x);
              specs.push_back(&r);
            }
  ProgressBar bar(rows.size() + 1, progress);
  bar.update(0, "read bandwidth");
  const ReadBandwidth bw =
      measure_read_bandwidth(threads, std::max(spec.repeats, 3), spec.read_bandwidth_mib);
  CallSettings over;
  if (threads > 0) over.num_threads = threads;
  // Prepare every row, then time them in rounds, then the medians and the accuracy checks (one
  // failing row must not lose the rest).
  std::vector<Prepared> prep(rows.size());
  const auto guarded = [&](std::size_t i, auto&& f) {
    if (!rows[i].error.empty()) return;
    try {
      f();
    } catch (const Error& e) {
      rows[i].error = std::string(error_code_name(e.code())) + ": " + e.what();
    } catch (const std::bad_alloc&) {  // a std::vector of the row's size past what the process may have
      rows[i].error = "out_of_memory: the row's host allocations failed";
    }
  };
  for (std::size_t i = 0; i < rows.size(); ++i) {
    bar.update(i + 1, "preparing " + rows[i].label + " page " + std::to_string(rows[i].page) + " " +
                          std::string(dtype_name(rows[i].dtype)) + " kv " +
                          std::string(dtype_name(rows[i].kv_dtype.value_or(rows[i].dtype))));
    prep[i].res = &rows[i], prep[i].r = specs[i];
    guarded(i, [&] { prepare_row(prep[i], config, over); });
  }
  for (int round = 0; round < std::max(spec.repeats, 1); ++round) {
    bar.update(rows.size(), "round " + std::to_string(round + 1) + " of " + std::to_string(spec.repeats));
    for (std::size_t i = 0; i < rows.size(); ++i)
      guarded(i, [&] {
        Prepared& x = prep[i];
        x.ms.push_back(mean_call_ms([&] { (void)x.call(); }));
        x.plan_us.push_back(x.plan_sample());
        if (x.dense) x.dense_ms.push_back(mean_call_ms([&] { x.dense_call(); }));
      });
  }
  for (std::size_t i = 0; i < rows.size(); ++i) guarded(i, [&] { finish_row(prep[i], bw.gbps); });
  bar.finish();

  char line[512];
  std::snprintf(
      line, sizeof line,
      "# serving rows (ragged_paged); read bandwidth %.1f GB/s (best of %d passes over %.0f MiB, %d "
      "threads, %s loop, same run)\n",
      bw.gbps, std::max(spec.repeats, 3), bw.mib, bw.threads, bw.isa.c_str());
  out << line;
  std::snprintf(line, sizeof line,
                "%-14s %-6s %-7s %-11s %5s %6s %9s %5s %-5s %-8s %-5s %7s %10s %8s %11s %8s %7s %8s %9s %8s "
                "%9s  %s\n",
                "label", "asked", "backend", "kernel", "seqs", "tokens", "kv_tokens", "page", "dtype", "kv",
                "share", "shared", "median_ms", "plan_us", "tokens/s", "KV_GB/s", "vs_bw", "GFLOP/s",
                "dense_ms", "vs_dense", "max_err", "error");
  out << line;
  for (const Result& r : rows) {
    std::snprintf(line, sizeof line,
                  "%-14s %-6s %-7s %-11s %5lld %6lld %9lld %5lld %-5s %-8s %-5s %7lld %10s %8s %11s %8s %7s "
                  "%8s %9s %8s "
                  "%9s  %s\n",
                  r.label.c_str(), r.asked.c_str(), r.backend.empty() ? "-" : r.backend.c_str(),
                  r.kernel.empty() ? "-" : r.kernel.c_str(), static_cast<long long>(r.seqs),
                  static_cast<long long>(r.tokens), static_cast<long long>(r.kv_tokens),
                  static_cast<long long>(r.page), std::string(dtype_name(r.dtype)).c_str(),
                  std::string(dtype_name(r.kv_dtype.value_or(r.dtype))).c_str(), r.share ? "on" : "off",
                  static_cast<long long>(r.shared_keys), fmt("%.3f", r.median_ms).c_str(),
                  fmt("%.1f", r.plan_us).c_str(), fmt("%.0f", r.tokens_per_s).c_str(),
                  fmt("%.2f", r.kv_gbps).c_str(), fmt("%.2f", r.vs_bw).c_str(), fmt("%.1f", r.gflops).c_str(),
                  fmt("%.3f", r.dense_ms).c_str(), fmt("%.2f", r.vs_dense).c_str(),
                  fmt("%.2e", r.max_err).c_str(), r.error.c_str());
    out << line;
  }
  if (!want_json) return {};
  nlohmann::json j;
  j["read_bandwidth"] = {{"gbps", bw.gbps},
                         {"gbps_per_cpu_second", bw.gbps_per_cpu_second},
                         {"mib", bw.mib},
                         {"threads", bw.threads},
                         {"isa", bw.isa}};
  j["rows"] = nlohmann::json::array();
  auto num = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const Result& r : rows)
    j["rows"].push_back({{"label", r.label},
                         {"backend_requested", r.asked},
                         {"backend", r.backend},
                         {"kernel", r.kernel},
                         {"seqs", r.seqs},
                         {"tokens", r.tokens},
                         {"kv_tokens", r.kv_tokens},
                         {"page_size", r.page},
                         {"dtype", std::string(dtype_name(r.dtype))},
                         {"kv_dtype", std::string(dtype_name(r.kv_dtype.value_or(r.dtype)))},
                         {"share_prefixes", r.share},
                         {"shared_keys", r.shared_keys},
                         {"median_ms", num(r.median_ms)},
                         {"plan_us", num(r.plan_us)},
                         {"tokens_per_s", num(r.tokens_per_s)},
                         {"kv_gbps", num(r.kv_gbps)},
                         {"vs_read_bandwidth", num(r.vs_bw)},
                         {"gflops", num(r.gflops)},
                         {"dense_ms", num(r.dense_ms)},
                         {"vs_dense", num(r.vs_dense)},
                         {"max_err", num(r.max_err)},
                         {"error", r.error}});
  return j.dump(2) + "\n";
}

}  // namespace attnops::benchkit
