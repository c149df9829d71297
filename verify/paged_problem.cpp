#include "verify/paged_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "attnops/kv_quant.h"
#include "verify/edges.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;

i64 pages_of(i64 kv_len, i64 page_size) {
  return (kv_len + page_size - 1) / page_size;
}

Tensor index_tensor(const std::vector<i64>& v, const std::vector<i64>& shape, bool i64_ids) {
  Tensor t(i64_ids ? DType::i64 : DType::i32, shape);
  for (std::size_t i = 0; i < v.size(); ++i) {
    if (i64_ids)
      t.data_as<std::int64_t>()[i] = v[i];
    else
      t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(v[i]);
  }
  return t;
}

i64 frac_index(double f, i64 n) {
  return std::min<i64>(n - 1, static_cast<i64>(f * static_cast<double>(n)));
}

constexpr float kMinScale = std::numeric_limits<float>::min();  // the smallest valid scale
// The largest value drawn: past f16's range (65504), where the cpu's tile items must read an
// 8-bit cache in f32 under an f16 q.
constexpr float kMaxValue = 1e6f;

// The 8-bit part of a case: the cache's dtype, its scales, and sharing (kStreamPagedKv8).
void draw_kv8(Rng& r, PagedSpec& s, const Limits& limits) {
  if (r.chance(1.0 / 3)) {
    const DType t = r.chance(0.5) ? DType::i8 : DType::fp8_e4m3;
    s.kv8 = t;
    s.kv_scales = r.chance(0.6) ? KVScales::per_token : KVScales::per_tensor;
    const float cmax = kv_code_max(t);
    // Values of about 1 mostly; then the smallest valid scale (values down to e4m3's subnormal
    // codes x 2^-126, subnormal in f32), tiny and large ones, and powers of two.
    const auto scale = [&] {
      const double m = r.real();
      if (m < 0.55) return static_cast<float>(r.real(0.5, 2.0)) / cmax;
      if (m < 0.65) return kMinScale;
      if (m < 0.75) return 1e-30f;
      if (m < 0.85) return 30.f / cmax;
      return std::ldexp(1.f, static_cast<int>(r.uniform(-12, 2)));
    };
    s.k_scale = scale();
    s.v_scale = scale();
    s.scale_edges = s.kv_scales == KVScales::per_token && r.chance(0.5);
    // e4m3's NaN code is the only non-finite value an 8-bit pool holds; int8 has none.
    for (Injection& j : s.nonfinite)
      if (j.tensor == 'k' || j.tensor == 'v') {
        if (t == DType::i8)
          j.tensor = 'q';
        else
          j.value = std::numeric_limits<float>::quiet_NaN();
      }
    // The 8-bit kernels' own sizes (a vector of 16 codes, two dot chains, a NaN scan of 32
    // bytes, four codes a gpu word) for D, Dv and the keys of one decode, within the work cap.
    const ShapeContext ctx{s.Hq / s.Hkv, s.Hq, s.Hkv, s.D, s.Dv, 1, 1};
    const PagedSpec before = s;
    if (limits.head_dims.empty() && r.chance(0.4)) {
      s.D = draw_size(r, kKv8, ctx, 1, 256);
      s.Dv = r.chance(0.6) ? s.D : draw_size(r, kKv8, ctx, 1, 256);
    }
    if (r.chance(0.3))
      for (PagedSeq& q : s.seqs)
        if (q.q_len == 1) {
          q.kv_len = draw_size(r, kKv8, ctx, 1, limits.max_seq);
          break;
        }
    if (s.work() > limits.max_work) s.D = before.D, s.Dv = before.Dv, s.seqs = before.seqs;
    if (t == DType::fp8_e4m3 && limits.nonfinite && s.nonfinite.empty() && r.chance(0.12)) {
      Injection j;
      j.tensor = r.chance(0.5) ? 'k' : 'v';
      j.value = std::numeric_limits<float>::quiet_NaN();
      for (double& f : j.at) f = r.real();
      s.nonfinite.push_back(j);
    }
    // A NaN code with values of about 1 only (as non-finite values and large values are never
    // drawn together): a NaN in v reaches a row unless its weight is 0, and a weight the fp32
    // kernels underflow to 0 (a logit 104 below the row's maximum) is not 0 in the fp64 oracle.
    const bool nan_code = std::any_of(s.nonfinite.begin(), s.nonfinite.end(),
                                      [](const Injection& j) { return j.tensor == 'k' || j.tensor == 'v'; });
    if (nan_code) {
      s.q_amp = 1;
      s.scale_edges = false;
      s.k_scale = static_cast<float>(r.real(0.5, 2.0)) / cmax;
      s.v_scale = static_cast<float>(r.real(0.5, 2.0)) / cmax;
    }
  }
  // Shared prefixes: how many pages, and splits that fit in them (only whole splits are shared).
  i64 shortest = -1;
  for (const PagedSeq& q : s.seqs)
    if (q.kv_len > 0) {
      const i64 n = pages_of(q.kv_len, s.page_size);
      shortest = shortest < 0 ? n : std::min(shortest, n);
    }
  if (s.shared_prefix && shortest > 0) {
    if (r.chance(0.5)) s.shared_pages = r.uniform(1, shortest);
    const i64 shared = (s.shared_pages > 0 ? s.shared_pages : shortest / 2 + 1) * s.page_size;
    if (r.chance(0.6))
      s.kv_split_tokens =
          r.chance(0.5) ? s.page_size * r.uniform(1, 4) : r.uniform(1, std::max<i64>(1, shared));
  }
  s.share_prefixes = r.chance(0.7);
  s.both_ways = r.chance(s.shared_prefix ? 0.8 : 0.15);
}

// Codes over the whole range: mostly rounded from uniform values (as write() makes them), a
// quarter any byte (int8's -128, e4m3's subnormals and -0), never the NaN code.
std::vector<std::uint8_t> draw_codes(Rng& r, DType t, i64 n) {
  std::vector<std::uint8_t> c(static_cast<std::size_t>(n));
  for (std::uint8_t& x : c) {
    if (r.chance(0.75))
      x = t == DType::i8 ? static_cast<std::uint8_t>(static_cast<std::int8_t>(r.uniform(-127, 127)))
                         : fp8_e4m3_from_float(static_cast<float>(r.real(-448, 448)));
    else
      x = static_cast<std::uint8_t>(r.uniform(0, 255));
    if (t == DType::fp8_e4m3 && (x & 0x7fu) == 0x7fu) x ^= 1u;
  }
  return c;
}

// Per-token scales [P, page_size, Hkv] around `base`; with edges, some tokens at the smallest
// valid scale, tiny or large, and some rows of zero codes (scale 1, as write() gives them).
std::vector<float> draw_scales(Rng& r, float base, bool edges, i64 tokens, i64 Dh, DType t,
                               std::vector<std::uint8_t>& codes) {
  std::vector<float> sc(static_cast<std::size_t>(tokens));
  for (i64 i = 0; i < tokens; ++i) {
    float x = std::max(kMinScale, base * static_cast<float>(std::exp2(r.real(-2, 2))));
    if (edges) {
      const double m = r.real();
      if (m < 0.05) {
        x = kMinScale;
      } else if (m < 0.1) {
        x = 1e-30f;
      } else if (m < 0.15) {
        x = std::min(base * 64, kMaxValue / kv_code_max(t));
      } else if (m < 0.2) {
        x = 1;
        for (i64 e = 0; e < Dh; ++e)
          codes[static_cast<std::size_t>(i * Dh + e)] = t == DType::fp8_e4m3 && r.chance(0.5) ? 0x80 : 0;
      }
    }
    sc[static_cast<std::size_t>(i)] = x;
  }
  return sc;
}

// Writes codes (logical order) into a placed 8-bit view, byte for byte (Tensor::set would clamp
// int8's -128).
void put_codes(const TensorView& v, const std::vector<std::uint8_t>& codes) {
  auto* base = static_cast<std::uint8_t*>(const_cast<void*>(v.data()));
  std::size_t i = 0;
  for (i64 a = 0; a < v.dim(0); ++a)
    for (i64 b = 0; b < v.dim(1); ++b)
      for (i64 c = 0; c < v.dim(2); ++c)
        for (i64 d = 0; d < v.dim(3); ++d, ++i) base[v.offset({a, b, c, d})] = codes[i];
}

}  // namespace

i64 PagedSpec::rows() const {
  i64 n = pad_rows;
  for (const PagedSeq& q : seqs) n += q.q_len;
  return n;
}

i64 PagedSpec::work() const {
  i64 w = 0;
  for (const PagedSeq& q : seqs) w += q.q_len * q.kv_len * Hq * (D + Dv);
  return w;
}

std::string PagedSpec::describe() const {
  std::ostringstream os;
  os << "paged S=" << seqs.size() << " (q_len/kv_len";
  for (const PagedSeq& q : seqs) os << " " << q.q_len << "/" << q.kv_len;
  os << ") Hq=" << Hq << " Hkv=" << Hkv << " D=" << D << " Dv=" << Dv << " " << dtype_name(dtype)
     << " page_size=" << page_size << " extra_pages=" << extra_pages;
  if (num_seqs >= 0) os << " num_seqs=" << num_seqs;
  if (pad_rows) os << " pad_rows=" << pad_rows;
  if (shared_prefix) os << " shared_prefix";
  if (index_i64) os << " i64_index";
  if (strided_pool) os << " strided_pool";
  os << (causal ? " causal" : " non-causal");
  if (window) os << " window=(" << window->left << "," << window->right << ")";
  if (chunk) os << " chunk=" << *chunk;
  if (soft_cap) os << " soft_cap=" << *soft_cap;
  if (sinks) os << " sinks";
  if (scale) os << " scale=" << *scale;
  if (kv_split_tokens) os << " kv_split_tokens=" << *kv_split_tokens;
  if (q_amp != 1) os << " q_amp=" << q_amp;
  for (const Injection& j : nonfinite)
    os << " " << (std::isnan(j.value) ? "nan" : j.value > 0 ? "+inf" : "-inf") << "@" << j.tensor;
  if (!return_lse) os << " no_lse";
  if (kv8) {
    os << " kv=" << dtype_name(*kv8) << "/" << kv_scales_name(kv_scales) << " k_scale=" << k_scale
       << " v_scale=" << v_scale;
    if (scale_edges) os << " scale_edges";
  }
  if (shared_pages >= 0) os << " shared_pages=" << shared_pages;
  if (!share_prefixes) os << " share_prefixes=off";
  if (both_ways) os << " both_ways";
  return os.str();
}

PagedSpec draw_paged(std::uint64_t seed, std::uint64_t index, const Limits& limits) {
  Rng rng = Rng::for_case(seed, index, kStreamPaged);
  PagedSpec s;
  s.seed = seed, s.index = index;
  const double dt = rng.real();
  s.dtype = dt < 0.5 ? DType::f32 : dt < 0.75 ? DType::f16 : DType::bf16;
  s.Hq = rng.uniform(1, 8);
  std::vector<i64> divisors;
  for (i64 d = 1; d <= s.Hq; ++d)
    if (s.Hq % d == 0) divisors.push_back(d);
  s.Hkv = rng.pick(divisors);
  ShapeContext ctx{s.Hq / s.Hkv, s.Hq, s.Hkv, 64, 64, 1, static_cast<i64>(dtype_size(s.dtype))};
  s.D = draw_size(rng, kHeadDim, ctx, 1, 256);
  s.Dv = rng.chance(0.7) ? s.D : draw_size(rng, kHeadDim, ctx, 1, 256);
  if (!limits.head_dims.empty()) {
    s.D = rng.pick(limits.head_dims);
    s.Dv = rng.chance(0.7) ? s.D : rng.pick(limits.head_dims);
  }
  ctx.D = s.D, ctx.Dv = s.Dv;
  s.page_size = draw_size(rng, kPage, ctx, 1, 128);
  const i64 S = rng.chance(0.2) ? 1 : rng.uniform(1, 8);
  const i64 cap = rng.log_uniform(std::max<i64>(1, limits.max_work >> 7), limits.max_work);
  for (i64 i = 0; i < S; ++i) {
    PagedSeq q;
    q.kv_len = draw_size(rng, kSeqK, ctx, 0, limits.max_seq);
    const double kind = rng.real();
    if (kind < 0.35)
      q.q_len = std::min<i64>(1, q.kv_len);  // decode
    else if (kind < 0.5)
      q.q_len = std::min<i64>(rng.uniform(2, 4), q.kv_len);  // speculative tokens
    else if (kind < 0.75)
      q.q_len = draw_size(rng, kSeqQ, ctx, 0, q.kv_len);  // chunked prefill
    else
      q.q_len = q.kv_len;  // prefill
    // This sequence's share of the work cap: shorten its keys (a prefill keeps q_len = kv_len).
    while (q.q_len * q.kv_len * s.Hq * (s.D + s.Dv) > cap / S && q.kv_len > 1) {
      const bool prefill = q.q_len == q.kv_len;
      q.kv_len = std::max<i64>(1, q.kv_len / 2);
      q.q_len = prefill ? q.kv_len : std::min(q.q_len, q.kv_len);
    }
    s.seqs.push_back(q);
  }
  if (S > 1 && rng.chance(0.15)) s.num_seqs = rng.uniform(0, S - 1);
  if (rng.chance(0.2)) s.pad_rows = rng.uniform(1, 5);
  s.shared_prefix = S > 1 && rng.chance(0.3);
  s.index_i64 = rng.chance(0.3);
  s.strided_pool = rng.chance(0.2);
  s.extra_pages = rng.chance(0.5) ? 0 : rng.uniform(1, 8);
  s.table_extra = rng.chance(0.5) ? 0 : rng.uniform(1, 3);
  s.causal = rng.chance(0.8);
  if (rng.chance(0.25)) {
    s.window = Window{draw_size(rng, kSeqK, ctx, 0, limits.max_seq), 0};
    if (rng.chance(0.3)) s.window->right = draw_size(rng, kSeqK, ctx, 0, 64);
  }
  if (rng.chance(0.15)) s.chunk = draw_size(rng, kSeqK, ctx, 1, limits.max_seq);
  if (rng.chance(0.15)) s.soft_cap = rng.pick(std::vector<double>{0.5, 5.0, 30.0});
  s.sinks = rng.chance(0.2);
  if (rng.chance(0.15)) s.scale = rng.pick(std::vector<double>{0.01, 0.3, 1.0});
  if (rng.chance(0.5)) s.kv_split_tokens = draw_size(rng, kSplit, ctx, 1, 2048);
  const double mode = rng.real();
  if (mode < 0.1) {
    s.q_amp = rng.pick(std::vector<float>{8.f, 30.f});
  } else if (mode < 0.2 && limits.nonfinite) {
    Injection j;
    j.tensor = rng.pick(std::vector<char>{'q', 'k', 'v', 's'});
    j.value = rng.pick(std::vector<float>{std::numeric_limits<float>::quiet_NaN(),
                                          std::numeric_limits<float>::infinity(),
                                          -std::numeric_limits<float>::infinity()});
    for (double& f : j.at) f = rng.real();
    s.nonfinite.push_back(j);
  }
  if (!s.nonfinite.empty() && s.soft_cap && *s.soft_cap < 5) s.soft_cap = 5.0;  // as draw_dense
  s.return_lse = rng.chance(0.8);
  Rng r8 = Rng::for_case(seed, index, kStreamPagedKv8);
  draw_kv8(r8, s, limits);
  return s;
}

float code_value(DType kv8, std::uint8_t c) {
  if (kv8 == DType::i8) return static_cast<float>(static_cast<std::int8_t>(c));
  const int e = (c >> 3) & 15, m = c & 7;
  if (e == 15 && m == 7) return std::numeric_limits<float>::quiet_NaN();
  const double v = e == 0 ? m * std::ldexp(1.0, -9) : std::ldexp(1.0 + m / 8.0, e - 7);
  return static_cast<float>((c & 0x80) ? -v : v);
}

PagedInputs materialize(const PagedSpec& s) {
  Rng rng = Rng::for_case(s.seed, s.index, kStreamPagedValues);
  PagedInputs in;
  const i64 S = static_cast<i64>(s.seqs.size()), N = s.rows();
  // Pages: each sequence's own, permuted through the pool, then the shared prefix.
  i64 needed = 0;
  for (const PagedSeq& q : s.seqs) needed += pages_of(q.kv_len, s.page_size);
  const i64 P = std::max<i64>(1, needed + s.extra_pages);
  std::vector<i64> perm(static_cast<std::size_t>(P));
  std::iota(perm.begin(), perm.end(), 0);
  for (i64 i = P - 1; i > 0; --i)
    std::swap(perm[static_cast<std::size_t>(i)], perm[static_cast<std::size_t>(rng.uniform(0, i))]);
  i64 next = 0, widest = 0;
  for (const PagedSeq& q : s.seqs) {
    std::vector<i64> pages;
    for (i64 j = 0; j < pages_of(q.kv_len, s.page_size); ++j)
      pages.push_back(perm[static_cast<std::size_t>(next++)]);
    widest = std::max<i64>(widest, static_cast<i64>(pages.size()));
    in.pages.push_back(pages);
  }
  if (s.shared_prefix)
    for (i64 i = 1; i < S; ++i) {
      const std::size_t m =
          s.shared_pages >= 0
              ? static_cast<std::size_t>(s.shared_pages)
              : std::min(in.pages[0].size(), in.pages[static_cast<std::size_t>(i)].size()) / 2 + 1;
      for (std::size_t j = 0;
           j < m && j < in.pages[static_cast<std::size_t>(i)].size() && j < in.pages[0].size(); ++j)
        in.pages[static_cast<std::size_t>(i)][j] = in.pages[0][j];
    }
  const i64 W = std::max<i64>(1, widest + s.table_extra);
  std::vector<i64> table(static_cast<std::size_t>(S * W)), cu(static_cast<std::size_t>(S + 1)),
      kv(static_cast<std::size_t>(S));
  for (i64 i = 0; i < S; ++i) {
    for (i64 j = 0; j < W; ++j) {
      const auto& pg = in.pages[static_cast<std::size_t>(i)];
      // Columns past the sequence's pages: garbage, out of the pool's range too.
      table[static_cast<std::size_t>(i * W + j)] =
          j < static_cast<i64>(pg.size()) ? pg[static_cast<std::size_t>(j)] : rng.uniform(-3, P + 1000);
    }
    cu[static_cast<std::size_t>(i + 1)] =
        cu[static_cast<std::size_t>(i)] + s.seqs[static_cast<std::size_t>(i)].q_len;
    kv[static_cast<std::size_t>(i)] = s.seqs[static_cast<std::size_t>(i)].kv_len;
  }
  in.cu = index_tensor(cu, {S + 1}, s.index_i64);
  in.kv_lens = index_tensor(kv, {S}, s.index_i64);
  in.page_table = index_tensor(table, {S, W}, s.index_i64);
  in.batch = RaggedBatch{in.cu, in.kv_lens, in.page_table, s.num_seqs};

  const auto values = [&](i64 n, float amp) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (float& x : v) x = static_cast<float>(rng.real(-amp, amp));
    return v;
  };
  std::vector<float> qv = values(N * s.Hq * s.D, s.q_amp), kvals = values(P * s.page_size * s.Hkv * s.D, 1),
                     vvals = values(P * s.page_size * s.Hkv * s.Dv, 1);
  if (s.sinks) {
    in.sinks = Tensor(DType::f32, {s.Hq});
    for (i64 h = 0; h < s.Hq; ++h)
      in.sinks->set(static_cast<std::size_t>(h), static_cast<float>(rng.real(-2, 2)));
    in.options.sinks = in.sinks->view();
  }
  for (const Injection& j : s.nonfinite) {
    std::vector<float>* target = j.tensor == 'q'   ? &qv
                                 : s.kv8           ? nullptr  // the codes, below
                                 : j.tensor == 'k' ? &kvals
                                 : j.tensor == 'v' ? &vvals
                                                   : nullptr;
    if (target && !target->empty())
      (*target)[static_cast<std::size_t>(frac_index(j.at[0], static_cast<i64>(target->size())))] = j.value;
    if (j.tensor == 's' && in.sinks)
      in.sinks->set(static_cast<std::size_t>(frac_index(j.at[0], s.Hq)), j.value);
  }
  in.q = Tensor(s.dtype, {N, s.Hq, s.D});
  for (std::size_t i = 0; i < qv.size(); ++i) in.q.set(i, qv[i]);
  StorageLayout l;
  if (s.strided_pool) {
    l.strided = true;
    l.pad = {1, 0, 1};
    l.offset = 3;
  }
  if (!s.kv8) {
    in.pools.push_back(place(s.dtype, {P, s.page_size, s.Hkv, s.D}, l, kvals));
    in.pools.push_back(place(s.dtype, {P, s.page_size, s.Hkv, s.Dv}, l, vvals));
    in.cache = PagedKVCache::wrap(in.pools[0].view, in.pools[1].view);
  } else {
    // Codes and scales from a stream of their own; the pools' storage around the views holds
    // zeros (int8) or NaN codes (e4m3), the scales' NaN.
    const DType t = *s.kv8;
    Rng r = Rng::for_case(s.seed, s.index, kStreamPagedKv8Values);
    const i64 tokens = P * s.page_size * s.Hkv;
    in.k_codes = draw_codes(r, t, tokens * s.D);
    in.v_codes = draw_codes(r, t, tokens * s.Dv);
    if (s.kv_scales == KVScales::per_token) {
      in.k_scales = draw_scales(r, s.k_scale, s.scale_edges, tokens, s.D, t, in.k_codes);
      in.v_scales = draw_scales(r, s.v_scale, s.scale_edges, tokens, s.Dv, t, in.v_codes);
    } else {
      in.k_scales = {s.k_scale};
      in.v_scales = {s.v_scale};
    }
    for (const Injection& j : s.nonfinite) {
      std::vector<std::uint8_t>* codes = j.tensor == 'k'   ? &in.k_codes
                                         : j.tensor == 'v' ? &in.v_codes
                                                           : nullptr;
      if (codes && !codes->empty() && t == DType::fp8_e4m3)
        (*codes)[static_cast<std::size_t>(frac_index(j.at[0], static_cast<i64>(codes->size())))] =
            j.at[1] < 0.5 ? 0x7f : 0xff;
    }
    in.pools.push_back(place(t, {P, s.page_size, s.Hkv, s.D}, l, std::vector<float>(in.k_codes.size())));
    in.pools.push_back(place(t, {P, s.page_size, s.Hkv, s.Dv}, l, std::vector<float>(in.v_codes.size())));
    put_codes(in.pools[0].view, in.k_codes);
    put_codes(in.pools[1].view, in.v_codes);
    for (const std::vector<float>* sc : {&in.k_scales, &in.v_scales}) {
      if (s.kv_scales == KVScales::per_tensor) {
        Tensor one(DType::f32, {1});
        one.set(0, sc->front());
        in.pools.push_back({one, one.view()});
        continue;
      }
      // [P, page_size, Hkv] as a [P, page_size, Hkv, 1] placement (padded apart when the pools are).
      Placed p = place(DType::f32, {P, s.page_size, s.Hkv, 1}, l, *sc);
      p.view = TensorView(p.view.data(), DType::f32, {P, s.page_size, s.Hkv},
                          {p.view.stride(0), p.view.stride(1), p.view.stride(2)});
      in.pools.push_back(p);
    }
    in.cache = PagedKVCache::wrap(in.pools[0].view, in.pools[1].view, in.pools[2].view, in.pools[3].view);
  }

  PagedAttentionOptions& o = in.options;
  o.causal = s.causal;
  o.sliding_window = s.window;
  o.chunk_size = s.chunk;
  o.logits_soft_cap = s.soft_cap;
  o.return_lse = s.return_lse;
  o.kv_split_tokens = s.kv_split_tokens;
  o.share_prefixes = s.share_prefixes;
  return in;
}

}  // namespace attnops::verify
