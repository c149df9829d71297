// The ring forward (sequence_parallel.h): the plan, then one step per source; in each step the
// next keys travel while the local calls run on the current ones and their results merge into
// the rank's rows by log-sum-exp. Sinks are folded in once at the end.
#include "attnops/error.h"
#include "attnops/ext/problem.h"
#include "dist_impl.h"
#include "kv_ring.h"
#include "lse_merge.h"
#include "ring_calls.h"

namespace attnops::dist::detail {

DistOutput ring_forward(Communicator& comm, const Attention& local, const DistSettings& settings,
                        Prepared& in, const AttentionOptions& options) {
  Stopwatch total;
  const AttentionProblem& p = in.p;
  const int me = comm.rank();
  DistStats stats =
      start_stats("ring", "forward", comm, in.layout, in.q_layout.length(), in.kv_layout.length());

  const RingPlan plan(comm, p.mask, p.Hq, in.q_layout, in.kv_layout);
  const KvShape shape{p.B, p.Hkv, p.D, p.Dv, p.dtype, p.has_segments()};
  std::vector<Range> own_ranges;
  for (const Chunk& c : in.kv_layout.chunks(me)) own_ranges.push_back({c.begin, c.end});
  std::vector<Tensor> own_storage;
  KvRing ring(comm, plan, shape, own_block(p, own_ranges, own_storage));
  RowState state(p.B, p.Tq, p.Hq, p.Dv);
  const AttentionOptions base = local_call_options(options);
  DispatchDecision first_local;
  bool have_local = false;

  for (int t = 0; t < plan.steps(); ++t) {
    const int s = plan.source(me, t);
    StepStats st;
    st.name = "step " + std::to_string(t);
    st.source = s;
    ring.start_step(t);
    Stopwatch compute;
    if (ring.has_current()) {
      const KvBlock& kv = ring.current();
      for (const LocalCall& c : step_calls(plan.pairs(s), in.q_layout.chunks(me), kv)) {
        for (auto [r0, r1] : pieces(c.r0, c.r1, settings.progress_rows)) {
          ring.progress();
          if (p.has_segments() && segments_disjoint(p.seg_q, p.Tq, r0, r1, kv.seg, kv.ncols, c.c0, c.c1, p.B))
            continue;
          AttentionOptions o = base;
          if (c.masked) o.mask = c.mask_at(p.mask, r0 - c.r0, stats.Tq, stats.Tk);
          if (p.has_segments()) {
            o.segment_ids_q = TensorView(p.seg_q + r0, DType::i32, {p.B, r1 - r0}, {p.Tq, 1});
            o.segment_ids_kv = kv.seg_view(shape, c.c0, c.c1);
          }
          const AttentionOutput r =
              local(p.q.slice(1, r0, r1), kv.k_view(shape, c.c0, c.c1), kv.v_view(shape, c.c0, c.c1), o);
          if (!have_local) first_local = r.decision, have_local = true;
          if (!r.lse) throw Error(ErrorCode::internal, "ring: the local operator returned no lse");
          state.merge(r0, r.out, *r.lse, in.threads);
          ++st.calls;
        }
      }
      st.visible_pairs = plan.visible_pairs(s);
    }
    ring.progress();
    st.compute_ms = compute.ms();
    st.wait_ms = ring.finish_step();
    st.bytes_sent = ring.step_bytes_sent();
    st.bytes_received = ring.step_bytes_received();
    stats.steps.push_back(st);
  }
  state.fold_sinks(p.sinks);

  DistOutput r;
  r.output.out = state.out(p.dtype);
  r.output.lse = state.lse();
  stats.total_ms = total.ms();
  finish_totals(stats);
  if (!have_local) first_local = local.explain(p.q, p.k, p.v, base);  // this rank's rows see no key at all
  r.output.decision = distributed_decision("ring", stats, first_local, Pass::forward);
  r.stats = std::move(stats);
  return r;
}

}  // namespace attnops::dist::detail
