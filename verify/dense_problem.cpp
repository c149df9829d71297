#include "verify/dense_problem.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "verify/edges.h"
#include "verify/target.h"

namespace attnops::verify {

namespace {

using i64 = std::int64_t;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

const char* bias_name(BiasShape b) {
  switch (b) {
    case BiasShape::full:
      return "[B,Hq]";
    case BiasShape::batch1:
      return "[1,Hq]";
    case BiasShape::head1:
      return "[B,1]";
    case BiasShape::both1:
      return "[1,1]";
    default:
      return "none";
  }
}

std::string value_name(float v) {
  return std::isnan(v) ? "nan" : v > 0 ? "+inf" : "-inf";
}

// Lowers the problem until its work fits `cap`: wide heads, the batch and many heads go first
// (down to D + Dv = 48, B = 1, Hq = 2), then the longer sequence (redrawn near an edge below half
// its length), then the rest. Sequence lengths carry most of the kernels' edges (tiles, key
// blocks, q chunks, splits), so they are kept longest.
void fit_work(Rng& rng, DenseSpec& s, i64 cap) {
  for (int guard = 0; guard < 96 && s.work() > cap; ++guard) {
    const ShapeContext ctx{s.Hq / s.Hkv, s.Hq, s.Hkv, s.D, s.Dv, s.B, 4};
    const i64 G = s.Hq / s.Hkv;
    const double u = rng.real();
    if (s.D + s.Dv > 48 && u < 0.5) {
      (s.D >= s.Dv ? s.D : s.Dv) /= 2;
    } else if (s.B > 1 && u < 0.7) {
      s.B = std::max<i64>(1, s.B / 2);
    } else if (s.Hq > 2 && u < 0.9) {
      if (s.Hkv > 1)
        s.Hkv = std::max<i64>(1, s.Hkv / 2), s.Hq = s.Hkv * G;
      else
        s.Hq = std::max<i64>(1, s.Hq / 2);
    } else if (s.Tq * s.Tk > 64 * 64) {
      if (s.Tq >= s.Tk || (s.Tk > 1 && rng.chance(0.3)))
        s.Tq = draw_size(rng, kSeqQ, ctx, 0, std::max<i64>(1, s.Tq / 2));
      else
        s.Tk = draw_size(rng, kSeqK, ctx, 0, std::max<i64>(1, s.Tk / 2));
    } else if (s.Hq > 1 && u < 0.95) {
      s.Hq = std::max<i64>(1, s.Hq / 2), s.Hkv = std::min(s.Hkv, s.Hq);
      while (s.Hq % s.Hkv) --s.Hkv;
    } else {
      s.D = std::max<i64>(1, s.D / 2), s.Dv = std::max<i64>(1, s.Dv / 2);
    }
  }
}

std::vector<float> uniform_values(Rng& rng, i64 n, float amp) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (float& x : v) x = static_cast<float>(rng.real(-amp, amp));
  return v;
}

// Segment ids [B, T]: runs of random lengths with increasing ids (runs shorter than a block or
// two so that blocks see several segments).
std::vector<i64> segment_runs(Rng& rng, i64 B, i64 T, i64 max_run) {
  std::vector<i64> ids(static_cast<std::size_t>(B * T));
  for (i64 b = 0; b < B; ++b) {
    i64 id = rng.uniform(0, 2);
    for (i64 i = 0; i < T;) {
      const i64 n = rng.uniform(1, max_run);
      for (i64 k = 0; k < n && i < T; ++k, ++i) ids[static_cast<std::size_t>(b * T + i)] = id;
      id += rng.uniform(1, 2);
    }
  }
  return ids;
}

Tensor ids_tensor(const std::vector<i64>& ids, i64 B, i64 T, bool i64_ids) {
  Tensor t(i64_ids ? DType::i64 : DType::i32, {B, T});
  for (std::size_t i = 0; i < ids.size(); ++i) {
    if (i64_ids)
      t.data_as<std::int64_t>()[i] = ids[i];
    else
      t.data_as<std::int32_t>()[i] = static_cast<std::int32_t>(ids[i]);
  }
  return t;
}

i64 frac_index(double f, i64 n) {
  return std::min<i64>(n - 1, static_cast<i64>(f * static_cast<double>(n)));
}

}  // namespace

std::string DenseSpec::describe() const {
  std::ostringstream os;
  os << "B=" << B << " Tq=" << Tq << " Tk=" << Tk << " Hq=" << Hq << " Hkv=" << Hkv << " D=" << D
     << " Dv=" << Dv << " " << dtype_name(dtype) << (causal ? " causal" : " non-causal");
  if (window) os << " window=(" << window->left << "," << window->right << ")";
  if (chunk) os << " chunk=" << *chunk;
  if (mask) os << " mask=" << mask->build(Hq, Tq, Tk).key();
  if (segments)
    os << " segments=" << (segments == 1 ? "runs" : "packed+unmatched_row") << (segments_i64 ? "(i64)" : "");
  if (bias != BiasShape::none) {
    os << " bias" << bias_name(bias) << (bias_f16 ? "f16" : "");
    if (bias_inf_row) os << "+inf_row";
    if (bias_inf_entries) os << "+inf_entries";
  }
  if (soft_cap) os << " soft_cap=" << *soft_cap;
  if (sinks) os << " sinks";
  if (scale) os << " scale=" << *scale;
  if (q_amp != 1 || k_amp != 1 || v_amp != 1)
    os << " amp(q,k,v)=(" << q_amp << "," << k_amp << "," << v_amp << ")";
  for (const Injection& j : nonfinite)
    os << " " << value_name(j.value) << "@" << j.tensor << "(" << j.at[0] << "," << j.at[1] << "," << j.at[2]
       << "," << j.at[3] << ")";
  for (int t = 0; t < 3; ++t)
    if (layout[static_cast<std::size_t>(t)].strided)
      os << " "
         << "qkv"[t] << ":" << layout[static_cast<std::size_t>(t)].text();
  if (bq || bk) os << " blocks=" << bq.value_or(0) << "x" << bk.value_or(0);
  if (fallbacks_off) os << " fallbacks_off";
  if (!return_lse) os << " no_lse";
  if (return_weights) os << " weights";
  return os.str();
}

DenseSpec draw_dense(std::uint64_t seed, std::uint64_t index, const Limits& limits) {
  Rng rng = Rng::for_case(seed, index, kStreamDense);
  DenseSpec s;
  s.seed = seed, s.index = index;
  const double dt = rng.real();
  s.dtype = dt < 0.5 ? DType::f32 : dt < 0.75 ? DType::f16 : DType::bf16;
  // A quarter of the problems are ordinary model shapes (a few heads of 16 to 128, a few hundred
  // positions, self-attention or a prefill over a cache), whose task splits put tasks of
  // different widths on one thread; the rest are drawn dimension by dimension near the edges.
  const bool ordinary = rng.chance(0.25);
  s.Hq = ordinary ? rng.pick(std::vector<i64>{1, 2, 4, 8}) : rng.chance(0.3) ? 1 : rng.uniform(1, 8);
  std::vector<i64> divisors;
  for (i64 d = 1; d <= s.Hq; ++d)
    if (s.Hq % d == 0) divisors.push_back(d);
  s.Hkv = rng.chance(0.25) ? 1 : rng.pick(divisors);
  s.B = ordinary ? rng.uniform(1, 2) : rng.chance(0.4) ? 1 : rng.uniform(1, 4);
  ShapeContext ctx{s.Hq / s.Hkv, s.Hq, s.Hkv, 64, 64, s.B, static_cast<i64>(dtype_size(s.dtype))};
  if (ordinary) {
    s.D = s.Dv = rng.pick(std::vector<i64>{16, 32, 48, 64, 80, 96, 128});
    s.Tk = rng.uniform(std::min<i64>(100, limits.max_seq), std::min<i64>(1000, limits.max_seq));
    s.Tq = rng.chance(0.5) ? s.Tk : rng.uniform(1, s.Tk);
  } else {
    s.D = draw_size(rng, kHeadDim, ctx, 1, 256);
    s.Dv = rng.chance(0.6) ? s.D : draw_size(rng, kHeadDim, ctx, 1, 256);
  }
  if (!limits.head_dims.empty()) {
    s.D = rng.pick(limits.head_dims);
    s.Dv = rng.chance(0.6) ? s.D : rng.pick(limits.head_dims);
  }
  ctx.D = s.D, ctx.Dv = s.Dv;
  // Sequence lengths: half short (the small edges: lanes, micro-tiles, decode blocks), half from
  // 128 up (key blocks, q chunks, splits: where tasks of different widths meet).
  const i64 long_from = std::min<i64>(128, limits.max_seq);
  if (!ordinary) {
    s.Tk = rng.chance(0.5) ? draw_size(rng, kSeqK, ctx, 0, long_from)
                           : draw_size(rng, kSeqK, ctx, long_from, limits.max_seq);
    const double tq = rng.real();
    s.Tq = tq < 0.3    ? s.Tk
           : tq < 0.45 ? rng.uniform(1, 4)
           : tq < 0.6
               ? std::max<i64>(0, s.Tk - draw_size(rng, kSeqQ, ctx, 0, s.Tk))  // a prefill after a cache
           : rng.chance(0.5) ? draw_size(rng, kSeqQ, ctx, 0, long_from)
                             : draw_size(rng, kSeqQ, ctx, long_from, limits.max_seq);
  }
  // The budget itself is log-uniform over the top 5 octaves below the cap: most problems cheap,
  // some at the cap, and many large enough for a second thread (2 MFLOP per thread,
  // backends/cpu/call_threads.h) and for more tasks than threads.
  // Ordinary shapes get the whole cap: fitted, they keep a few hundred positions.
  fit_work(
      rng, s,
      ordinary ? limits.max_work : rng.log_uniform(std::max<i64>(1, limits.max_work >> 5), limits.max_work));

  s.causal = rng.chance(0.6);
  const i64 Tk = s.Tk;
  if (rng.chance(0.25)) {
    const i64 l = draw_size(rng, kSeqK, ctx, 0, Tk + 2);
    s.window = Window{l, rng.chance(0.5) ? 0 : draw_size(rng, kSeqK, ctx, 0, Tk + 2)};
  }
  if (rng.chance(0.15)) s.chunk = draw_size(rng, kSeqK, ctx, 1, std::max<i64>(1, Tk + 2));
  if (rng.chance(0.2)) s.mask = draw_mask(rng, s.Tq, s.Tk);
  if (rng.chance(0.15)) s.segments = rng.chance(0.5) ? 1 : 2, s.segments_i64 = rng.chance(0.3);
  if (rng.chance(0.2)) {
    static const std::vector<BiasShape> kShapes = {BiasShape::full, BiasShape::batch1, BiasShape::head1,
                                                   BiasShape::both1};
    s.bias = rng.pick(kShapes);
    s.bias_f16 = rng.chance(0.2);
    s.bias_inf_row = rng.chance(0.2);
    s.bias_inf_entries = rng.chance(0.2);
  }
  if (rng.chance(0.15)) s.soft_cap = rng.pick(std::vector<double>{0.5, 5.0, 30.0, 50.0});
  s.sinks = rng.chance(0.2);
  if (rng.chance(0.15)) s.scale = rng.pick(std::vector<double>{0.01, 0.1, 0.3, 1.0});
  const double mode = rng.real();
  if (mode < 0.1) {  // large logits: the online softmax's rescaling and exp range
    s.q_amp = rng.pick(std::vector<float>{8.f, 30.f, 100.f});
  } else if (mode < 0.2 && limits.nonfinite) {
    // Non-finite values with moderate logits (no weight underflows to 0 in fp32 while it is
    // non-zero in the fp64 oracle, which would change where a NaN in v lands).
    const i64 n = rng.uniform(1, 3);
    for (i64 i = 0; i < n; ++i) {
      Injection j;
      static const std::vector<char> kTensors = {'q', 'k', 'v', 'v', 'b', 's', 'g'};
      j.tensor = rng.pick(kTensors);
      j.value = rng.pick(std::vector<float>{kNaN, kInf, -kInf});
      for (double& f : j.at) f = rng.real();
      s.nonfinite.push_back(j);
    }
  }
  // A soft cap saturates where |logit / cap| passes ~9: 1 - tanh^2 is then 0 in fp32 and tiny in
  // the fp64 oracle, and an infinite dS times it is NaN in one and inf in the other. With
  // non-finite inputs the cap stays where it does not saturate (no draw is spent on this).
  if (!s.nonfinite.empty() && s.soft_cap && *s.soft_cap < 5) s.soft_cap = 5.0;
  if (rng.chance(0.1)) s.v_amp = rng.pick(std::vector<float>{0.01f, 4.f});
  for (auto& l : s.layout)
    if (rng.chance(0.15)) l = draw_layout(rng);
  if (rng.chance(0.25)) {
    s.bq = draw_size(rng, kBlock, ctx, 1, 256);
    s.bk = rng.chance(0.5) ? *s.bq : draw_size(rng, kBlock, ctx, 1, 256);
  }
  s.fallbacks_off = rng.chance(0.2);
  s.return_lse = rng.chance(0.8);
  s.return_weights = rng.chance(0.15);
  return s;
}

DenseSpec with_shape(DenseSpec s, i64 B, i64 Tq, i64 Tk, i64 Hq, i64 Hkv, i64 D, i64 Dv) {
  s.B = std::max<i64>(1, B), s.Tq = std::max<i64>(0, Tq), s.Tk = std::max<i64>(0, Tk);
  s.Hq = std::max<i64>(1, Hq), s.D = std::max<i64>(1, D), s.Dv = std::max<i64>(1, Dv);
  s.Hkv = std::clamp<i64>(Hkv, 1, s.Hq);
  while (s.Hq % s.Hkv != 0) --s.Hkv;
  return s;
}

DenseInputs materialize(const DenseSpec& s) {
  Rng rng = Rng::for_case(s.seed, s.index, kStreamDenseValues);
  DenseInputs in;
  const std::vector<std::vector<i64>> shapes = {
      {s.B, s.Tq, s.Hq, s.D}, {s.B, s.Tk, s.Hkv, s.D}, {s.B, s.Tk, s.Hkv, s.Dv}};
  const float amps[3] = {s.q_amp, s.k_amp, s.v_amp};
  std::vector<std::vector<float>> values(3);
  for (int t = 0; t < 3; ++t) {
    const auto& sh = shapes[static_cast<std::size_t>(t)];
    values[static_cast<std::size_t>(t)] = uniform_values(rng, sh[0] * sh[1] * sh[2] * sh[3], amps[t]);
  }
  in.dout = Tensor(s.dtype, {s.B, s.Tq, s.Hq, s.Dv});
  for (std::int64_t i = 0; i < in.dout.numel(); ++i)
    in.dout.set(static_cast<std::size_t>(i), static_cast<float>(rng.real(-1, 1)));

  AttentionOptions& o = in.options;
  o.causal = s.causal;
  o.sliding_window = s.window;
  o.chunk_size = s.chunk;
  o.logits_soft_cap = s.soft_cap;
  o.return_lse = s.return_lse;
  o.return_weights = s.return_weights;
  if (s.mask) o.mask = s.mask->build(s.Hq, s.Tq, s.Tk);
  if (s.segments) {
    const i64 run = rng.uniform(1, 96);
    std::vector<i64> kv = segment_runs(rng, s.B, s.Tk, run), q;
    if (s.segments == 1) {
      q = segment_runs(rng, s.B, s.Tq, run);
    } else {  // packed sequences: q rows take the ids of the keys at their positions
      q.resize(static_cast<std::size_t>(s.B * s.Tq));
      for (i64 b = 0; b < s.B; ++b)
        for (i64 i = 0; i < s.Tq; ++i) {
          const i64 p = std::clamp<i64>(i + s.Tk - s.Tq, 0, std::max<i64>(0, s.Tk - 1));
          q[static_cast<std::size_t>(b * s.Tq + i)] =
              s.Tk > 0 ? kv[static_cast<std::size_t>(b * s.Tk + p)] : 0;
        }
      if (s.Tq > 0) q[static_cast<std::size_t>(rng.uniform(0, s.B * s.Tq - 1))] = 1 << 30;  // no key has it
    }
    in.seg_q = ids_tensor(q, s.B, s.Tq, s.segments_i64);
    in.seg_kv = ids_tensor(kv, s.B, s.Tk, s.segments_i64);
    o.segment_ids_q = in.seg_q->view();
    o.segment_ids_kv = in.seg_kv->view();
  }
  if (s.bias != BiasShape::none) {
    const i64 bb = (s.bias == BiasShape::full || s.bias == BiasShape::head1) ? s.B : 1;
    const i64 bh = (s.bias == BiasShape::full || s.bias == BiasShape::batch1) ? s.Hq : 1;
    in.bias = Tensor(s.bias_f16 ? DType::f16 : DType::f32, {bb, bh, s.Tq, s.Tk});
    for (i64 i = 0; i < in.bias->numel(); ++i) {
      float x = static_cast<float>(rng.real(-2, 2));
      if (s.bias_inf_entries && rng.chance(0.1)) x = -kInf;
      in.bias->set(static_cast<std::size_t>(i), x);
    }
    if (s.bias_inf_row && s.Tq > 0) {
      const i64 row = rng.uniform(0, bb * bh * s.Tq - 1);
      for (i64 j = 0; j < s.Tk; ++j) in.bias->set(static_cast<std::size_t>(row * s.Tk + j), -kInf);
    }
    o.bias = in.bias->view();
  }
  if (s.sinks) {
    in.sinks = Tensor(DType::f32, {s.Hq});
    for (i64 h = 0; h < s.Hq; ++h)
      in.sinks->set(static_cast<std::size_t>(h), static_cast<float>(rng.real(-2, 2)));
    o.sinks = in.sinks->view();
  }
  // Non-finite values, planted after everything else was drawn (and into the logical values,
  // before q / k / v are placed in their storage).
  for (const Injection& j : s.nonfinite) {
    const auto put = [&](std::vector<float>& vals, const std::vector<i64>& sh) {
      if (vals.empty()) return;
      i64 flat = 0;
      for (int d = 0; d < 4; ++d)
        flat = flat * sh[static_cast<std::size_t>(d)] +
               frac_index(j.at[static_cast<std::size_t>(d)], sh[static_cast<std::size_t>(d)]);
      vals[static_cast<std::size_t>(flat)] = j.value;
    };
    switch (j.tensor) {
      case 'q':
        put(values[0], shapes[0]);
        break;
      case 'k':
        put(values[1], shapes[1]);
        break;
      case 'v':
        put(values[2], shapes[2]);
        break;
      case 'g':
        if (in.dout.numel() > 0) {
          i64 flat = 0;
          for (int d = 0; d < 4; ++d)
            flat = flat * in.dout.dim(d) + frac_index(j.at[static_cast<std::size_t>(d)], in.dout.dim(d));
          in.dout.set(static_cast<std::size_t>(flat), j.value);
        }
        break;
      case 'b':
        if (in.bias && in.bias->numel() > 0) {
          i64 flat = 0;
          for (int d = 0; d < 4; ++d)
            flat = flat * in.bias->dim(d) + frac_index(j.at[static_cast<std::size_t>(d)], in.bias->dim(d));
          in.bias->set(static_cast<std::size_t>(flat), j.value);
        }
        break;
      case 's':
        if (in.sinks) in.sinks->set(static_cast<std::size_t>(frac_index(j.at[0], s.Hq)), j.value);
        break;
      default:
        break;
    }
  }
  for (int t = 0; t < 3; ++t)
    in.qkv.push_back(place(s.dtype, shapes[static_cast<std::size_t>(t)],
                           s.layout[static_cast<std::size_t>(t)], values[static_cast<std::size_t>(t)]));
  in.q = in.qkv[0].view, in.k = in.qkv[1].view, in.v = in.qkv[2].view;
  return in;
}

Config config_for(const DenseSpec& s, Backend backend, int threads) {
  Config c = forced_config(backend, threads, s.scale);
  c.blocksize_q = s.bq;
  c.blocksize_k = s.bk;
  if (s.fallbacks_off) {
    for (const char* op : {"blocksparse", "flash_attn2"}) {
      OperatorConfig oc;
      oc.fallbacks.decode = false;
      oc.fallbacks.non_causal = false;
      oc.fallbacks.seq_multiple = false;
      c.operators[op] = oc;
    }
  }
  return c;
}

}  // namespace attnops::verify
