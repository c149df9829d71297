// The ring backward (FlashAttention-2's, distributed as ring-flash-attention's): every rank
// keeps its dq; the keys travel the ring again (the forward's plan); at step t the rank adds
// its contribution to the dK/dV of the visiting source, and those accumulators travel one step
// behind the keys: the first rank after the owner starts one, each next rank adds its part, the
// last rank that sees the source sends it home, where the owner adds its own step-0 part.
// Probabilities come from the global lse (with the sinks folded in) and the global out: each
// local backward call is the FlashAttention-2 backward of a block, exact for the whole row.
// The native backward recomputes its block's own softmax instead of reading lse, so the local
// calls never run on native (DistributedAttention::backward checks ATTNOPS_FORCE_NATIVE).
#include <cmath>
#include <deque>
#include <limits>

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "dist_impl.h"
#include "kv_ring.h"
#include "lse_merge.h"
#include "ring_calls.h"

namespace attnops::dist::detail {

namespace {

// f32 dK and dV over the columns `ranges` of one source: dk [B, ncols, Hkv, D], dv [B, ncols, Hkv, Dv].
struct Accumulator {
  float* dk = nullptr;
  float* dv = nullptr;
  std::int64_t ncols = 0;
  std::vector<Range> ranges;
  std::size_t floats(const KvShape& s) const {
    return static_cast<std::size_t>(s.B * ncols * s.Hkv * (s.D + s.Dv));
  }
};

Accumulator accumulator_over(const KvShape& s, float* data, const std::vector<Range>& ranges) {
  Accumulator a;
  a.ncols = total_columns(ranges);
  a.ranges = ranges;
  a.dk = data;
  a.dv = data + s.B * a.ncols * s.Hkv * s.D;
  return a;
}

std::int64_t column_in(const std::vector<Range>& ranges, std::size_t b, std::int64_t g) {
  std::int64_t at = 0;
  for (std::size_t c = 0; c < b; ++c) at += ranges[c].size();
  return at + (g - ranges[b].lo);
}

// A gradient as f32 (a view of it when it is f32 already: the common case costs no copy).
Tensor as_f32(const Tensor& t) {
  return t.dtype() == DType::f32 ? t : Tensor::copy_of(t, DType::f32);
}

// Adds the gradients of block columns [c0, c1) (dk [B, c1 - c0, Hkv, D], dv likewise) into
// `acc`, mapping block columns to global positions to accumulator columns.
void add_kv_gradients(const KvShape& s, const KvBlock& kv, std::int64_t c0, std::int64_t c1,
                      const Tensor& dk_in, const Tensor& dv_in, Accumulator& acc) {
  const Tensor dk = as_f32(dk_in), dv = as_f32(dv_in);
  const float* gk = dk.data_as<float>();
  const float* gv = dv.data_as<float>();
  const std::int64_t n = c1 - c0, kr = s.Hkv * s.D, vr = s.Hkv * s.Dv;
  std::int64_t block_at = 0;
  for (std::size_t b = 0; b < kv.ranges.size(); ++b) {
    const Range r = kv.ranges[b];
    const std::int64_t lo = std::max(c0, block_at), hi = std::min(c1, block_at + r.size());
    if (lo < hi) {
      const std::int64_t t0 = column_in(acc.ranges, b, r.lo + (lo - block_at)), m = hi - lo;
      for (std::int64_t bi = 0; bi < s.B; ++bi) {
        // Columns are adjacent on both sides: one run of m * row floats each.
        const float* sk = gk + (bi * n + (lo - c0)) * kr;
        const float* sv = gv + (bi * n + (lo - c0)) * vr;
        float* tk = acc.dk + (bi * acc.ncols + t0) * kr;
        float* tv = acc.dv + (bi * acc.ncols + t0) * vr;
        for (std::int64_t e = 0; e < m * kr; ++e) tk[e] += sk[e];
        for (std::int64_t e = 0; e < m * vr; ++e) tv[e] += sv[e];
      }
    }
    block_at += r.size();
  }
}

void add_rows(float* dq, std::int64_t Tq, std::int64_t r0, const Tensor& g_in, std::int64_t B,
              std::int64_t row) {
  const Tensor g = as_f32(g_in);
  const float* src = g.data_as<float>();
  const std::int64_t n = g.dim(1);
  for (std::int64_t bi = 0; bi < B; ++bi) {
    float* t = dq + (bi * Tq + r0) * row;
    const float* f = src + bi * n * row;
    for (std::int64_t e = 0; e < n * row; ++e) t[e] += f[e];
  }
}

// dsinks_h = -sum over this rank's rows of p_sink * (dout . out), p_sink = exp(sink_h - lse_f);
// then summed over the ranks in rank order (the same on every rank).
Tensor sink_gradients(Communicator& comm, const BackwardProblem& bp, const Tensor& lse_f) {
  const AttentionProblem& p = bp.fwd;
  std::vector<double> ds(static_cast<std::size_t>(p.Hq), 0.0);
  const float* l = lse_f.data_as<float>();
  // f32 [B, Tq, Hq, Dv] views of out and dout (copies only when they are another dtype or strided).
  std::vector<Tensor> copies;
  const auto f32 = [&](const TensorView& t) {
    if (t.dtype() == DType::f32 && t.is_contiguous()) return t.data_as<float>();
    copies.push_back(Tensor::copy_of(t, DType::f32));
    return static_cast<const float*>(copies.back().data_as<float>());
  };
  const float* o = f32(bp.out);
  const float* g = f32(bp.dout);
  for (std::int64_t b = 0; b < p.B; ++b)
    for (std::int64_t i = 0; i < p.Tq; ++i)
      for (std::int64_t h = 0; h < p.Hq; ++h) {
        // A fully masked row (the keys' own lse -inf) contributes nothing, even when its dout
        // holds a NaN or an infinity (out 0 x dout NaN would be NaN).
        if (bp.lse[(b * p.Hq + h) * p.Tq + i] == -std::numeric_limits<float>::infinity()) continue;
        // Nor does a row whose +inf sink takes all the mass (its output is 0 whatever q, k, v).
        if (p.sinks[h] == std::numeric_limits<float>::infinity()) continue;
        const std::int64_t at = ((b * p.Tq + i) * p.Hq + h) * p.Dv;
        double di = 0;
        for (std::int64_t e = 0; e < p.Dv; ++e)
          di += static_cast<double>(o[at + e]) * static_cast<double>(g[at + e]);
        if (di == 0.0) continue;
        const double ps =
            std::exp(static_cast<double>(p.sinks[h]) - static_cast<double>(l[(b * p.Hq + h) * p.Tq + i]));
        ds[static_cast<std::size_t>(h)] -= ps * di;
      }
  comm.allreduce_sum(ds.data(), ds.size());
  Tensor r(DType::f32, {p.Hq});
  for (std::int64_t h = 0; h < p.Hq; ++h)
    r.data_as<float>()[h] = static_cast<float>(ds[static_cast<std::size_t>(h)]);
  return r;
}

}  // namespace

DistGradients ring_backward(Communicator& comm, const Attention& local, const DistSettings& settings,
                            PreparedBackward& in, const AttentionOptions& options) {
  Stopwatch total;
  const BackwardProblem& bp = in.bp;
  const AttentionProblem& p = bp.fwd;
  const int me = comm.rank(), P = comm.size();
  DistStats stats =
      start_stats("ring", "backward", comm, in.layout, in.q_layout.length(), in.kv_layout.length());

  const RingPlan plan(comm, p.mask, p.Hq, in.q_layout, in.kv_layout);
  const KvShape shape{p.B, p.Hkv, p.D, p.Dv, p.dtype, p.has_segments()};
  std::vector<Range> own_ranges;
  for (const Chunk& c : in.kv_layout.chunks(me)) own_ranges.push_back({c.begin, c.end});
  std::vector<Tensor> own_storage;
  KvRing ring(comm, plan, shape, own_block(p, own_ranges, own_storage));

  const Tensor lse_f = lse_with_sinks(TensorView(bp.lse, DType::f32, {p.B, p.Hq, p.Tq}), p.sinks);
  std::optional<Tensor> dsinks;
  if (p.sinks) dsinks = sink_gradients(comm, bp, lse_f);

  // This rank's gradients (f32) and the accumulators that travel.
  Tensor dq(DType::f32, {p.B, p.Tq, p.Hq, p.D});
  Tensor own_dk(DType::f32, {p.B, p.Tk, p.Hkv, p.D}), own_dv(DType::f32, {p.B, p.Tk, p.Hkv, p.Dv});
  Accumulator own_acc;
  own_acc.dk = own_dk.data_as<float>();
  own_acc.dv = own_dv.data_as<float>();
  own_acc.ncols = p.Tk;
  own_acc.ranges = own_ranges;
  const auto acc_floats = [&](int s) {
    return static_cast<std::size_t>(p.B * total_columns(plan.message(s, 1)) * p.Hkv * (p.D + p.Dv));
  };
  std::size_t max_floats = 1;
  for (int s = 0; s < P; ++s)
    if (plan.steps_of(s) >= 2) max_floats = std::max(max_floats, acc_floats(s));
  // The accumulators' buffers belong to the thread (one per rank), kept for its next call.
  thread_local std::vector<float> travel[3], contrib, home;
  std::deque<std::pair<int, RequestPtr>> pending_sends;  // (step, request)
  RequestPtr acc_recv[2];                                // step t's incoming accumulator at [t % 2]
  RequestPtr home_recv;
  if (plan.steps_of(me) >= 2) {  // my keys' accumulator comes home from the last rank that saw them
    home.resize(acc_floats(me));
    const int from = (me + plan.steps_of(me) - 1) % P;
    home_recv = comm.irecv(home.data(), home.size() * sizeof(float), from, kTagDkvHome);
  }
  const AttentionOptions base = local_call_options(options);
  DispatchDecision first_local;
  bool have_local = false;

  for (int t = 0; t < plan.steps(); ++t) {
    const int s = plan.source(me, t);
    const bool travels = t >= 1 && t < plan.steps_of(s);  // s's accumulator passes through me now
    StepStats st;
    st.name = "step " + std::to_string(t);
    st.source = s;
    // Sends of two steps ago are done with their buffer before it receives again.
    while (!pending_sends.empty() && pending_sends.front().first <= t - 2) {
      pending_sends.front().second->wait();
      pending_sends.pop_front();
    }
    ring.start_step(t);
    // Post the receive of the accumulator I continue at step t + 1 (sent at the end of my left
    // neighbour's step t), one step ahead as the keys are.
    const int s_next = plan.source(me, t + 1);
    if (t + 1 >= 2 && t + 1 < plan.steps_of(s_next)) {
      auto& buf = travel[(t + 1) % 3];
      buf.resize(acc_floats(s_next));  // a receive buffer: no need to clear
      acc_recv[(t + 1) % 2] = comm.irecv(buf.data(), buf.size() * sizeof(float), (me - 1 + P) % P, kTagDkv);
      st.bytes_received += buf.size() * sizeof(float);
    }
    Stopwatch compute;
    Accumulator target = own_acc;
    if (travels) {
      // Step 1 starts the accumulator in its travel buffer; later steps add into `contrib`, then
      // onto the received accumulator.
      auto& buf = t == 1 ? travel[1] : contrib;
      buf.assign(acc_floats(s), 0.f);
      target = accumulator_over(shape, buf.data(), plan.message(s, 1));
    }
    if (ring.has_current()) {
      const KvBlock& kv = ring.current();
      for (const LocalCall& c : step_calls(plan.pairs(s), in.q_layout.chunks(me), kv)) {
        for (auto [r0, r1] : pieces(c.r0, c.r1, settings.progress_rows)) {
          ring.progress();
          for (auto& r : acc_recv)
            if (r) r->test();
          if (p.has_segments() && segments_disjoint(p.seg_q, p.Tq, r0, r1, kv.seg, kv.ncols, c.c0, c.c1, p.B))
            continue;
          AttentionOptions o = base;
          o.return_lse = false;
          if (c.masked) o.mask = c.mask_at(p.mask, r0 - c.r0, stats.Tq, stats.Tk);
          if (p.has_segments()) {
            o.segment_ids_q = TensorView(p.seg_q + r0, DType::i32, {p.B, r1 - r0}, {p.Tq, 1});
            o.segment_ids_kv = kv.seg_view(shape, c.c0, c.c1);
          }
          const TensorView lse_rows(lse_f.data_as<float>() + r0, DType::f32, {p.B, p.Hq, r1 - r0},
                                    {p.Hq * p.Tq, p.Tq, 1});
          const AttentionGradients g =
              local.backward(p.q.slice(1, r0, r1), kv.k_view(shape, c.c0, c.c1), kv.v_view(shape, c.c0, c.c1),
                             bp.out.slice(1, r0, r1), lse_rows, bp.dout.slice(1, r0, r1), o);
          if (!have_local) first_local = g.decision, have_local = true;
          add_rows(dq.data_as<float>(), p.Tq, r0, g.dq, p.B, p.Hq * p.D);
          add_kv_gradients(shape, kv, c.c0, c.c1, g.dk, g.dv, target);
          ++st.calls;
        }
      }
      st.visible_pairs = plan.visible_pairs(s);
    }
    ring.progress();
    st.compute_ms = compute.ms();
    Stopwatch wait;
    st.wait_ms = ring.finish_step();
    if (travels) {
      auto& acc = travel[t % 3];
      if (t >= 2) {  // the accumulator from my left neighbour, plus my part
        acc_recv[t % 2]->wait();
        acc_recv[t % 2].reset();
        for (std::size_t i = 0; i < acc.size(); ++i) acc[i] += contrib[i];
      }
      const bool last = t == plan.steps_of(s) - 1;
      const int dest = last ? s : (me + 1) % P;
      pending_sends.emplace_back(
          t, comm.isend(acc.data(), acc.size() * sizeof(float), dest, last ? kTagDkvHome : kTagDkv));
      st.bytes_sent += acc.size() * sizeof(float);
    }
    st.wait_ms = wait.ms();
    st.bytes_sent += ring.step_bytes_sent();
    st.bytes_received += ring.step_bytes_received();
    stats.steps.push_back(st);
  }
  {
    Stopwatch wait;
    while (!pending_sends.empty()) {
      pending_sends.front().second->wait();
      pending_sends.pop_front();
    }
    if (home_recv) {
      home_recv->wait();
      Accumulator h = accumulator_over(shape, home.data(), plan.message(me, 1));
      // Add the travelled accumulator into my own columns.
      const std::int64_t kr = p.Hkv * p.D, vr = p.Hkv * p.Dv;
      for (std::size_t b = 0; b < h.ranges.size(); ++b) {
        const Range r = h.ranges[b];
        if (r.empty()) continue;
        const std::int64_t from = column_in(h.ranges, b, r.lo), to = column_in(own_acc.ranges, b, r.lo);
        for (std::int64_t bi = 0; bi < p.B; ++bi)
          for (std::int64_t c = 0; c < r.size(); ++c) {
            const float* sk = h.dk + (bi * h.ncols + from + c) * kr;
            const float* sv = h.dv + (bi * h.ncols + from + c) * vr;
            float* tk = own_acc.dk + (bi * own_acc.ncols + to + c) * kr;
            float* tv = own_acc.dv + (bi * own_acc.ncols + to + c) * vr;
            for (std::int64_t e = 0; e < kr; ++e) tk[e] += sk[e];
            for (std::int64_t e = 0; e < vr; ++e) tv[e] += sv[e];
          }
      }
    }
    if (!stats.steps.empty()) stats.steps.back().wait_ms += wait.ms();
  }

  DistGradients r;
  const auto in_dtype = [&](const Tensor& t) {
    return p.dtype == DType::f32 ? t : Tensor::copy_of(t, p.dtype);
  };
  r.gradients.dq = in_dtype(dq);
  r.gradients.dk = in_dtype(own_dk);
  r.gradients.dv = in_dtype(own_dv);
  r.gradients.dsinks = dsinks;
  stats.total_ms = total.ms();
  finish_totals(stats);
  if (!have_local) first_local = local.explain(p.q, p.k, p.v, base);  // this rank's rows see no key at all
  r.gradients.decision = distributed_decision("ring", stats, first_local, Pass::backward);
  r.stats = std::move(stats);
  return r;
}

}  // namespace attnops::dist::detail
