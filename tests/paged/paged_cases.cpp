#include "tests/paged/paged_cases.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <sstream>
#include <utility>

#include "tests/support/testing.h"

namespace attnops::testing {

namespace {

using i64 = std::int64_t;

void set_index(Tensor& t, i64 i, i64 v) {
  if (t.dtype() == DType::i32)
    t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(v);
  else
    t.data_as<std::int64_t>()[i] = v;
}

// Element i as float, NaN kept.
double value(const Tensor& t, i64 i) {
  return load_as_float(t.data(), t.dtype(), static_cast<std::size_t>(i));
}

}  // namespace

std::string PagedCaseSpec::describe() const {
  std::ostringstream os;
  os << "S=" << q_lens.size() << " q_lens=[";
  for (std::size_t s = 0; s < q_lens.size(); ++s) os << (s ? "," : "") << q_lens[s];
  os << "] kv_lens=[";
  for (std::size_t s = 0; s < kv_lens.size(); ++s) os << (s ? "," : "") << kv_lens[s];
  os << "] Hq=" << Hq << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv << " page=" << page_size
     << " dtype=" << dtype_name(dtype) << " causal=" << causal;
  if (window) os << " window=(" << window->left << "," << window->right << ")";
  if (chunk) os << " chunk=" << *chunk;
  if (soft_cap) os << " soft_cap=" << *soft_cap;
  if (sinks) os << " sinks";
  if (split) os << " split=" << *split;
  if (!share_prefixes) os << " share_prefixes=off";
  if (kv_dtype) os << " kv=" << dtype_name(*kv_dtype) << "/" << kv_scales_name(scales);
  for (std::size_t x = 0; x < share_from.size(); ++x)
    if (share_from[x] >= 0) os << " seq" << x << "<-seq" << share_from[x] << ":" << share_tokens[x];
  if (pad_rows) os << " pad_rows=" << pad_rows;
  if (pad_seqs) os << " pad_seqs=" << pad_seqs;
  os << " seed=" << seed;
  return os.str();
}

i64 PagedCase::q_begin(std::size_t s) const {
  i64 b = 0;
  for (std::size_t x = 0; x < s; ++x) b += spec.q_lens[x];
  return b;
}

PagedCase make_paged_case(const PagedCaseSpec& spec) {
  PagedCase c;
  c.spec = spec;
  const std::size_t S = spec.q_lens.size();
  const i64 ps = spec.page_size;
  std::mt19937_64 rng(spec.seed);

  // Per-sequence data from per-sequence seeds.
  std::vector<Tensor> q_seq;
  for (std::size_t s = 0; s < S; ++s) {
    const std::uint64_t ss = s < spec.seq_seeds.size() ? spec.seq_seeds[s] : spec.seed * 1000 + s;
    c.k_seq.push_back(random_tensor(spec.dtype, {1, spec.kv_lens[s], spec.Hkv, spec.D}, ss * 3 + 1));
    c.v_seq.push_back(random_tensor(spec.dtype, {1, spec.kv_lens[s], spec.Hkv, spec.Dv}, ss * 3 + 2));
    q_seq.push_back(random_tensor(spec.dtype, {spec.q_lens[s], spec.Hq, spec.D}, ss * 3 + 3));
  }

  // Shared prefixes: the keys and values of the shared tokens are the other sequence's.
  const auto shared_of = [&](std::size_t s) -> std::pair<i64, i64> {
    if (s >= spec.share_from.size() || spec.share_from[s] < 0) return {-1, 0};
    return {spec.share_from[s], spec.share_tokens[s]};
  };
  for (std::size_t s = 0; s < S; ++s) {
    const auto [from, n] = shared_of(s);
    if (from < 0) continue;
    const auto f = static_cast<std::size_t>(from);
    const i64 es0 = static_cast<i64>(dtype_size(spec.dtype));
    std::memcpy(c.k_seq[s].data(), c.k_seq[f].data(), static_cast<std::size_t>(n * spec.Hkv * spec.D * es0));
    std::memcpy(c.v_seq[s].data(), c.v_seq[f].data(), static_cast<std::size_t>(n * spec.Hkv * spec.Dv * es0));
  }

  // Pages: every sequence's own, then spare ones, in a random permutation.
  std::vector<i64> need(S);
  i64 total = 0, width = 1;
  for (std::size_t s = 0; s < S; ++s) {
    need[s] = (spec.kv_lens[s] + ps - 1) / ps;
    total += need[s] - shared_of(s).second / ps;
    width = std::max(width, need[s] + 1);  // one spare column: ignored garbage
  }
  const i64 P = total + spec.spare_pages;
  std::vector<i64> ids(static_cast<std::size_t>(P));
  std::iota(ids.begin(), ids.end(), 0);
  if (spec.permute_pages) std::shuffle(ids.begin(), ids.end(), rng);
  const DType cache_dtype = spec.kv_dtype.value_or(spec.dtype);
  PagedKVSpec cache_spec{P, ps, spec.Hkv, spec.D, spec.Dv, cache_dtype, spec.scales};
  std::optional<KVTensorScales> ts;
  if (spec.kv_dtype && spec.scales == KVScales::per_tensor)
    ts = spec.tensor_scales.value_or(
        KVTensorScales{1.1f / kv_code_max(cache_dtype), 1.1f / kv_code_max(cache_dtype)});
  c.cache = PagedKVCache::host(cache_spec, ts);

  const i64 rows = static_cast<i64>(S) + spec.pad_seqs;
  c.cu = Tensor(spec.index_dtype, {rows + 1});
  c.kv = Tensor(spec.index_dtype, {rows});
  c.table = Tensor(spec.index_dtype, {rows, width});
  std::vector<std::vector<i64>> seq_pages(S);
  i64 next = 0, cu = 0;
  set_index(c.cu, 0, 0);
  for (i64 s = 0; s < rows; ++s) {
    const bool real = s < static_cast<i64>(S);
    const auto si = static_cast<std::size_t>(s);
    if (real) cu += spec.q_lens[si];
    set_index(c.cu, s + 1, real ? cu : cu + 1000);  // padding sequences: garbage, must be ignored
    set_index(c.kv, s, real ? spec.kv_lens[si] : 1 << 20);
    const i64 shared_pages = real ? shared_of(si).second / ps : 0;
    for (i64 j = 0; j < width; ++j) {
      i64 id = 1 << 30;  // far outside the pool: columns past the sequence's pages are ignored
      if (real && j < shared_pages)
        seq_pages[si].push_back(
            id = seq_pages[static_cast<std::size_t>(shared_of(si).first)][static_cast<std::size_t>(j)]);
      else if (real && j < need[si])
        seq_pages[si].push_back(id = ids[static_cast<std::size_t>(next++)]);
      set_index(c.table, s * width + j, id);
    }
  }
  c.N = cu + spec.pad_rows;

  // The cache, through write(): every token of every sequence in a shuffled order, plus padding
  // rows (slot -1) carrying NaN that must never land anywhere.
  struct Token {
    i64 s, j;
  };
  std::vector<Token> tokens;
  for (std::size_t s = 0; s < S; ++s)  // a shared prefix is written once, by its owner
    for (i64 j = shared_of(s).second; j < spec.kv_lens[s]; ++j) tokens.push_back({static_cast<i64>(s), j});
  for (int pad = 0; pad < 3; ++pad) tokens.push_back({-1, 0});
  std::shuffle(tokens.begin(), tokens.end(), rng);
  const i64 T = static_cast<i64>(tokens.size());
  Tensor kn(spec.dtype, {T, spec.Hkv, spec.D}), vn(spec.dtype, {T, spec.Hkv, spec.Dv});
  Tensor slots(rng() % 2 ? DType::i32 : DType::i64, {T});
  const i64 es = static_cast<i64>(dtype_size(spec.dtype));
  for (i64 t = 0; t < T; ++t) {
    const Token tk = tokens[static_cast<std::size_t>(t)];
    if (tk.s < 0) {
      for (i64 e = 0; e < spec.Hkv * spec.D; ++e)
        kn.set(static_cast<std::size_t>(t * spec.Hkv * spec.D + e), NAN);
      for (i64 e = 0; e < spec.Hkv * spec.Dv; ++e)
        vn.set(static_cast<std::size_t>(t * spec.Hkv * spec.Dv + e), NAN);
      set_index(slots, t, -1);
      continue;
    }
    const auto si = static_cast<std::size_t>(tk.s);
    std::memcpy(static_cast<char*>(kn.data()) + t * spec.Hkv * spec.D * es,
                static_cast<const char*>(c.k_seq[si].data()) + tk.j * spec.Hkv * spec.D * es,
                static_cast<std::size_t>(spec.Hkv * spec.D * es));
    std::memcpy(static_cast<char*>(vn.data()) + t * spec.Hkv * spec.Dv * es,
                static_cast<const char*>(c.v_seq[si].data()) + tk.j * spec.Hkv * spec.Dv * es,
                static_cast<std::size_t>(spec.Hkv * spec.Dv * es));
    set_index(slots, t, seq_pages[si][static_cast<std::size_t>(tk.j / ps)] * ps + tk.j % ps);
  }
  c.cache.write(kn, vn, slots);
  if (spec.kv_dtype)  // the sequences' keys and values are now the cache's: code x scale
    for (std::size_t s = 0; s < S; ++s) {
      const TensorView row(static_cast<const char*>(c.table.data()) +
                               static_cast<i64>(s) * width * static_cast<i64>(dtype_size(spec.index_dtype)),
                           spec.index_dtype, {width});
      PagedKVCache::Dense d = c.cache.gather(row, spec.kv_lens[s]);
      c.k_seq[s] = std::move(d.k), c.v_seq[s] = std::move(d.v);
    }

  // q: the sequences' rows, then padding rows of NaN (they must stay out of every result).
  c.q = Tensor(spec.dtype, {c.N, spec.Hq, spec.D});
  i64 row = 0;
  for (std::size_t s = 0; s < S; ++s) {
    const auto bytes = static_cast<std::size_t>(q_seq[s].numel() * es);
    if (bytes)
      std::memcpy(static_cast<char*>(c.q.data()) + row * spec.Hq * spec.D * es, q_seq[s].data(), bytes);
    row += spec.q_lens[s];
  }
  for (i64 e = row * spec.Hq * spec.D; e < c.N * spec.Hq * spec.D; ++e)
    c.q.set(static_cast<std::size_t>(e), NAN);

  c.batch = {c.cu, c.kv, c.table, spec.pad_seqs > 0 ? static_cast<i64>(S) : -1};
  c.options.causal = spec.causal;
  c.options.sliding_window = spec.window;
  c.options.chunk_size = spec.chunk;
  c.options.logits_soft_cap = spec.soft_cap;
  c.options.kv_split_tokens = spec.split;
  c.options.share_prefixes = spec.share_prefixes;
  c.options.return_lse = true;
  if (spec.sinks) {
    // Not from spec.seed: the invariance tests change the layout seed and keep the data.
    c.sinks = random_tensor(DType::f32, {spec.Hq}, 4242 + static_cast<std::uint64_t>(spec.Hq), -2.f, 2.f);
    c.options.sinks = c.sinks->view();
  }
  return c;
}

TensorView q_of(const PagedCase& c, std::size_t s) {
  const i64 es = static_cast<i64>(dtype_size(c.spec.dtype)), ql = c.spec.q_lens[s];
  return TensorView(static_cast<const char*>(c.q.data()) + c.q_begin(s) * c.spec.Hq * c.spec.D * es,
                    c.spec.dtype, {1, ql, c.spec.Hq, c.spec.D});
}

AttentionOptions dense_options(const PagedCase& c) {
  AttentionOptions o;
  o.causal = c.spec.causal;
  o.sliding_window = c.spec.window;
  o.chunk_size = c.spec.chunk;
  o.logits_soft_cap = c.spec.soft_cap;
  if (c.sinks) o.sinks = c.sinks->view();
  o.return_lse = true;
  return o;
}

AttentionOutput dense_oracle(const PagedCase& c, std::size_t s, const OperationMetadata& md) {
  OperationMetadata m = md;
  m.backends = {Backend::native};
  if (!c.spec.kv_dtype)
    return registry().get("vanilla", m)(q_of(c, s), c.k_seq[s], c.v_seq[s], dense_options(c));
  const Tensor q = Tensor::copy_of(q_of(c, s), DType::f32);
  AttentionOutput o = registry().get("vanilla", m)(q, c.k_seq[s], c.v_seq[s], dense_options(c));
  o.out = Tensor::copy_of(o.out, c.spec.dtype);
  return o;
}

SubBatch alone(const PagedCase& c, std::size_t s) {
  SubBatch b;
  const i64 width = c.table.dim(1);
  b.cu = Tensor(DType::i64, {2}), b.kv = Tensor(DType::i64, {1}), b.table = Tensor(DType::i64, {1, width});
  b.cu.data_as<i64>()[0] = 0;  // its rows are q_alone(c, s)
  b.cu.data_as<i64>()[1] = c.spec.q_lens[s];
  b.kv.data_as<i64>()[0] = c.spec.kv_lens[s];
  for (i64 j = 0; j < width; ++j)
    b.table.data_as<i64>()[j] = c.table.dtype() == DType::i32
                                    ? c.table.data_as<std::int32_t>()[static_cast<i64>(s) * width + j]
                                    : c.table.data_as<i64>()[static_cast<i64>(s) * width + j];
  b.batch = {b.cu, b.kv, b.table};
  return b;
}

AttentionOutput run_paged(const PagedCase& c, Backend b, OperationMetadata md) {
  md.backends.insert(md.backends.begin(), b);
  return registry().get("ragged_paged", md).paged(c.q, c.cache, c.batch, c.options);
}

::testing::AssertionResult rows_match(const PagedCase& c, std::size_t s, const AttentionOutput& paged,
                                      const AttentionOutput& dense, double tol_out, double tol_lse) {
  const i64 q0 = c.q_begin(s), ql = c.spec.q_lens[s], Hq = c.spec.Hq, Dv = c.spec.Dv;
  double worst = 0;
  std::string where;
  bool bad = false;
  const auto check = [&](double got, double want, double tol, const std::string& what) {
    const bool both_nan = std::isnan(got) && std::isnan(want);
    const bool same_inf = std::isinf(got) && got == want;
    if (both_nan || same_inf) return;
    const bool bitwise = tol == 0;
    const double err = std::fabs(got - want);
    if (std::isnan(err) || (bitwise ? got != want : err > tol)) {
      if (!bad || err > worst || std::isnan(err)) {
        worst = err;
        where = what + ": got " + std::to_string(got) + ", expected " + std::to_string(want);
      }
      bad = true;
    }
  };
  for (i64 i = 0; i < ql; ++i)
    for (i64 h = 0; h < Hq; ++h) {
      for (i64 e = 0; e < Dv; ++e)
        check(value(paged.out, ((q0 + i) * Hq + h) * Dv + e), value(dense.out, (i * Hq + h) * Dv + e),
              tol_out,
              "out[" + std::to_string(q0 + i) + "," + std::to_string(h) + "," + std::to_string(e) + "]");
      if (paged.lse && dense.lse)
        check(value(*paged.lse, (q0 + i) * Hq + h), value(*dense.lse, h * ql + i), tol_lse,
              "lse[" + std::to_string(q0 + i) + "," + std::to_string(h) + "]");
    }
  if (!bad) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "sequence " << s << " (" << c.spec.describe() << "): " << where;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
}

}  // namespace attnops::testing
