// Ulysses (DeepSpeed's sequence parallelism): one all-to-all turns "my rows, every head" into
// "every row, my heads", the local operator runs unchanged on whole sequences, a second
// all-to-all turns the result back. Rank r owns q heads [r * Hq / P, (r + 1) * Hq / P) and the
// K/V heads they read; when P > Hkv several ranks read the same K/V head (replicated), and their
// dK/dV parts are summed on the way back. Rows are placed by global position, so the shards may
// be in any layout.
#include <cstring>

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "dist_impl.h"

namespace attnops::dist::detail {

namespace {

struct Heads {
  std::int64_t q_lo, q_hi, kv_lo, kv_hi;
};
Heads heads_of(int rank, int P, std::int64_t Hq, std::int64_t Hkv) {
  const std::int64_t per = Hq / P, G = Hq / Hkv;
  Heads h;
  h.q_lo = rank * per;
  h.q_hi = h.q_lo + per;
  h.kv_lo = h.q_lo / G;
  h.kv_hi = (h.q_hi - 1) / G + 1;
  return h;
}

// A strided 4-D view as raw bytes: innermost dimension contiguous.
struct Strided {
  char* data;
  std::int64_t s0, s1, s2;  // element strides of dims 0..2
};

// Copies a [n0, n1, n2, n3] block (innermost contiguous on both sides).
void copy4(const Strided& from, const Strided& to, std::int64_t n0, std::int64_t n1, std::int64_t n2,
           std::int64_t n3, std::size_t es) {
  for (std::int64_t a = 0; a < n0; ++a)
    for (std::int64_t b = 0; b < n1; ++b)
      for (std::int64_t c = 0; c < n2; ++c)
        std::memcpy(to.data + static_cast<std::size_t>(a * to.s0 + b * to.s1 + c * to.s2) * es,
                    from.data + static_cast<std::size_t>(a * from.s0 + b * from.s1 + c * from.s2) * es,
                    static_cast<std::size_t>(n3) * es);
}

Strided of(const TensorView& t) {
  return {const_cast<char*>(static_cast<const char*>(t.data())), t.stride(0), t.stride(1), t.stride(2)};
}
Strided of(Tensor& t) {
  return of(t.view());
}
// A contiguous [n0, n1, n2, n3] block at `p`.
Strided packed(char* p, std::int64_t n1, std::int64_t n2, std::int64_t n3) {
  return {p, n1 * n2 * n3, n2 * n3, n3};
}
Strided offset(Strided s, std::int64_t d0, std::int64_t d1, std::int64_t d2, std::size_t es) {
  s.data += static_cast<std::size_t>(d0 * s.s0 + d1 * s.s1 + d2 * s.s2) * es;
  return s;
}

// Builds the per-destination blocks of one all-to-all, each a list of parts appended in order.
struct Exchange {
  std::vector<std::size_t> send_bytes, send_off, recv_bytes, recv_off;
  std::vector<char> send, recv;
  explicit Exchange(int P) : send_bytes(P), send_off(P), recv_bytes(P), recv_off(P) {}
  void layout() {
    std::size_t a = 0, b = 0;
    for (std::size_t i = 0; i < send_bytes.size(); ++i) {
      send_off[i] = a, a += send_bytes[i];
      recv_off[i] = b, b += recv_bytes[i];
    }
    send.resize(a);
    recv.resize(b);
  }
  double run(Communicator& comm, StepStats& st) {
    Stopwatch w;
    comm.alltoallv(send.data(), send_bytes, send_off, recv.data(), recv_bytes, recv_off);
    const auto me = static_cast<std::size_t>(comm.rank());
    for (std::size_t i = 0; i < send_bytes.size(); ++i)
      if (i != me) st.bytes_sent += send_bytes[i], st.bytes_received += recv_bytes[i];
    return w.ms();
  }
};

// Per-head masks sliced to the heads [lo, hi) (the local problem's heads 0 .. hi - lo).
Mask slice_heads(const Mask& m, std::int64_t lo, std::int64_t hi) {
  if (!m.head_dependent()) return m;
  switch (m.kind()) {
    case Mask::Kind::per_head: {
      std::vector<Mask> v(m.children().begin() + lo, m.children().begin() + hi);
      return Mask::per_head(std::move(v));
    }
    case Mask::Kind::all_of:
    case Mask::Kind::any_of: {
      Mask r = slice_heads(m.children().front(), lo, hi);
      for (std::size_t i = 1; i < m.children().size(); ++i) {
        const Mask c = slice_heads(m.children()[i], lo, hi);
        r = m.kind() == Mask::Kind::all_of ? (r & c) : (r | c);
      }
      return r;
    }
    case Mask::Kind::offset:
      return slice_heads(m.children().front(), lo, hi)
          .at_offset(m.q_offset(), m.k_offset(), m.outer_tq(), m.outer_tk());
    default:
      return m;
  }
}

// Segment ids of the whole sequence [B, T] i32 from every rank's shard [B, n_r].
Tensor gather_segments(Communicator& comm, const std::int32_t* mine, std::int64_t B, const ShardLayout& l) {
  const int P = comm.size();
  const std::int64_t maxn = l.max_shard_length();
  std::vector<std::int32_t> send(static_cast<std::size_t>(B * maxn), 0),
      all(static_cast<std::size_t>(B * maxn * P));
  const std::int64_t n = l.shard_length(comm.rank());
  for (std::int64_t b = 0; b < B; ++b)
    std::memcpy(&send[static_cast<std::size_t>(b * maxn)], mine + b * n, static_cast<std::size_t>(n) * 4);
  comm.allgather(send.data(), send.size() * 4, all.data());
  Tensor full(DType::i32, {B, l.length()});
  for (int s = 0; s < P; ++s) {
    const std::int32_t* from = &all[static_cast<std::size_t>(s) * send.size()];
    for (std::int64_t b = 0; b < B; ++b) {
      std::int64_t at = 0;
      for (const Chunk& c : l.chunks(s)) {
        std::memcpy(full.data_as<std::int32_t>() + b * l.length() + c.begin, from + b * maxn + at,
                    static_cast<std::size_t>(c.size()) * 4);
        at += c.size();
      }
    }
  }
  return full;
}

// Calls fn(chunk, local row of its first position) for each chunk of rank s.
template <class Fn>
void for_chunks(const ShardLayout& l, int s, Fn&& fn) {
  std::int64_t at = 0;
  for (const Chunk& c : l.chunks(s)) {
    if (c.size() > 0) fn(c, at);
    at += c.size();
  }
}

// What both passes share: the head split and the exchanges of q / k / v (and out / dout / lse).
struct Split {
  int P, me;
  std::int64_t B, Hq, Hkv, D, Dv, Tq, Tk;
  std::size_t es;
  std::vector<Heads> heads;  // [rank]
  Heads mine() const { return heads[static_cast<std::size_t>(me)]; }
};

Split split_of(Communicator& comm, const AttentionProblem& p, const ShardLayout& ql, const ShardLayout& kl) {
  Split s;
  s.P = comm.size(), s.me = comm.rank();
  s.B = p.B, s.Hq = p.Hq, s.Hkv = p.Hkv, s.D = p.D, s.Dv = p.Dv, s.Tq = ql.length(), s.Tk = kl.length();
  s.es = dtype_size(p.dtype);
  for (int r = 0; r < s.P; ++r) s.heads.push_back(heads_of(r, s.P, p.Hq, p.Hkv));
  return s;
}

// Sequence -> heads: for each destination d, parts (view [B, n_me, H, X] sliced to d's heads,
// element size); received parts land in full tensors [B, T, h_me, X] at each source's positions.
struct Part {
  TensorView view;  // this rank's shard [B, n_me, H, X]
  bool kv;          // heads by kv range (else q range)
  Tensor* full;     // [B, T, h_me, X] output
  const ShardLayout* layout;
};

void seq_to_heads(Communicator& comm, const Split& s, std::vector<Part>& parts, StepStats& st) {
  Exchange ex(s.P);
  const auto hcount = [&](const Part& part, int r) {
    const Heads h = s.heads[static_cast<std::size_t>(r)];
    return part.kv ? h.kv_hi - h.kv_lo : h.q_hi - h.q_lo;
  };
  const auto hlo = [&](const Part& part, int r) {
    const Heads h = s.heads[static_cast<std::size_t>(r)];
    return part.kv ? h.kv_lo : h.q_lo;
  };
  for (int d = 0; d < s.P; ++d)
    for (const Part& part : parts) {
      const std::size_t es = dtype_size(part.view.dtype());
      const std::int64_t X = part.view.dim(3);
      ex.send_bytes[static_cast<std::size_t>(d)] +=
          static_cast<std::size_t>(s.B * part.layout->shard_length(s.me) * hcount(part, d) * X) * es;
      ex.recv_bytes[static_cast<std::size_t>(d)] +=
          static_cast<std::size_t>(s.B * part.layout->shard_length(d) * hcount(part, s.me) * X) * es;
    }
  ex.layout();
  Stopwatch pack;
  for (int d = 0; d < s.P; ++d) {
    char* at = ex.send.data() + ex.send_off[static_cast<std::size_t>(d)];
    for (const Part& part : parts) {
      const std::size_t es = dtype_size(part.view.dtype());
      const std::int64_t X = part.view.dim(3), n = part.layout->shard_length(s.me), h = hcount(part, d);
      copy4(offset(of(part.view), 0, 0, hlo(part, d), es), packed(at, n, h, X), s.B, n, h, X, es);
      at += static_cast<std::size_t>(s.B * n * h * X) * es;
    }
  }
  st.compute_ms += pack.ms();
  st.wait_ms += ex.run(comm, st);
  Stopwatch unpack;
  for (int src = 0; src < s.P; ++src) {
    char* at = ex.recv.data() + ex.recv_off[static_cast<std::size_t>(src)];
    for (const Part& part : parts) {
      const std::size_t es = dtype_size(part.view.dtype());
      const std::int64_t X = part.view.dim(3), n = part.layout->shard_length(src), h = hcount(part, s.me);
      const Strided block = packed(at, n, h, X);
      for_chunks(*part.layout, src, [&](const Chunk& c, std::int64_t local) {
        copy4(offset(block, 0, local, 0, es), offset(of(*part.full), 0, c.begin, 0, es), s.B, c.size(), h, X,
              es);
      });
      at += static_cast<std::size_t>(s.B * n * h * X) * es;
    }
  }
  st.compute_ms += unpack.ms();
}

// lse [B, H, n] f32 of the shard -> [B, h_me, T]: its heads of d to d, placed by position.
void lse_to_heads(Communicator& comm, const Split& s, const TensorView& lse, const ShardLayout& ql,
                  Tensor& full, StepStats& st) {
  Exchange ex(s.P);
  const std::int64_t n_me = ql.shard_length(s.me);
  for (int d = 0; d < s.P; ++d) {
    const Heads h = s.heads[static_cast<std::size_t>(d)];
    ex.send_bytes[static_cast<std::size_t>(d)] = static_cast<std::size_t>(s.B * (h.q_hi - h.q_lo) * n_me) * 4;
    ex.recv_bytes[static_cast<std::size_t>(d)] =
        static_cast<std::size_t>(s.B * (s.mine().q_hi - s.mine().q_lo) * ql.shard_length(d)) * 4;
  }
  ex.layout();
  const Tensor lse_c = Tensor::copy_of(lse, DType::f32);
  for (int d = 0; d < s.P; ++d) {
    const Heads h = s.heads[static_cast<std::size_t>(d)];
    auto* to = reinterpret_cast<float*>(ex.send.data() + ex.send_off[static_cast<std::size_t>(d)]);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t hh = h.q_lo; hh < h.q_hi; ++hh, to += n_me)
        std::memcpy(to, lse_c.data_as<float>() + (b * s.Hq + hh) * n_me, static_cast<std::size_t>(n_me) * 4);
  }
  st.wait_ms += ex.run(comm, st);
  const std::int64_t hm = s.mine().q_hi - s.mine().q_lo;
  for (int src = 0; src < s.P; ++src) {
    const std::int64_t n = ql.shard_length(src);
    const auto* from =
        reinterpret_cast<const float*>(ex.recv.data() + ex.recv_off[static_cast<std::size_t>(src)]);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t hh = 0; hh < hm; ++hh)
        for_chunks(ql, src, [&](const Chunk& c, std::int64_t local) {
          std::memcpy(full.data_as<float>() + (b * hm + hh) * s.Tq + c.begin,
                      from + (b * hm + hh) * n + local, static_cast<std::size_t>(c.size()) * 4);
        });
  }
}

// One block of the forward's way back: lse [B, h, n] f32 and out [B, n, h, Dv], rounded up to 8
// bytes so that every block (and its lse) starts aligned.
std::size_t out_block_bytes(const Split& s, std::int64_t n, std::int64_t h) {
  const std::size_t bytes =
      static_cast<std::size_t>(s.B * h * n) * (4 + static_cast<std::size_t>(s.Dv) * s.es);
  return (bytes + 7) & ~std::size_t{7};
}

AttentionOptions local_options(const AttentionOptions& user, const Split& s,
                               const std::optional<Tensor>& seg_q, const std::optional<Tensor>& seg_kv,
                               const float* sinks) {
  AttentionOptions o = user;
  const Heads h = s.mine();
  if (o.mask) o.mask = slice_heads(*o.mask, h.q_lo, h.q_hi);
  if (seg_q) o.segment_ids_q = seg_q->view(), o.segment_ids_kv = seg_kv->view();
  if (sinks) o.sinks = TensorView(sinks + h.q_lo, DType::f32, {h.q_hi - h.q_lo}), o.softmax_aux.reset();
  o.return_lse = true;
  o.return_weights = false;
  return o;
}

}  // namespace

DistOutput ulysses_forward(Communicator& comm, const Attention& local, Prepared& in,
                           const AttentionOptions& options) {
  Stopwatch total;
  const AttentionProblem& p = in.p;
  const Split s = split_of(comm, p, in.q_layout, in.kv_layout);
  const Heads mine = s.mine();
  const std::int64_t hq = mine.q_hi - mine.q_lo, hk = mine.kv_hi - mine.kv_lo;
  DistStats stats = start_stats("ulysses", "forward", comm, in.layout, s.Tq, s.Tk);

  StepStats in_st;
  in_st.name = "all-to-all in";
  Tensor q(p.dtype, {s.B, s.Tq, hq, s.D}), k(p.dtype, {s.B, s.Tk, hk, s.D}),
      v(p.dtype, {s.B, s.Tk, hk, s.Dv});
  std::vector<Part> parts = {
      {p.q, false, &q, &in.q_layout}, {p.k, true, &k, &in.kv_layout}, {p.v, true, &v, &in.kv_layout}};
  seq_to_heads(comm, s, parts, in_st);
  std::optional<Tensor> seg_q, seg_kv;
  if (p.has_segments()) {
    Stopwatch w;
    seg_q = gather_segments(comm, p.seg_q, s.B, in.q_layout);
    seg_kv = gather_segments(comm, p.seg_kv, s.B, in.kv_layout);
    in_st.wait_ms += w.ms();
  }
  stats.steps.push_back(in_st);

  StepStats loc;
  loc.name = "local";
  Stopwatch compute;
  const AttentionOutput r = local(q, k, v, local_options(options, s, seg_q, seg_kv, p.sinks));
  loc.compute_ms = compute.ms();
  loc.calls = 1;
  stats.steps.push_back(loc);

  // Heads -> sequence: out [B, T, hq, Dv] and lse [B, hq, T] back to the rows' owners.
  StepStats out_st;
  out_st.name = "all-to-all out";
  Exchange ex(s.P);
  const std::int64_t n_me = in.q_layout.shard_length(s.me);
  for (int d = 0; d < s.P; ++d) {
    const std::int64_t nd = in.q_layout.shard_length(d), hd = s.heads[static_cast<std::size_t>(d)].q_hi -
                                                              s.heads[static_cast<std::size_t>(d)].q_lo;
    ex.send_bytes[static_cast<std::size_t>(d)] = out_block_bytes(s, nd, hq);
    ex.recv_bytes[static_cast<std::size_t>(d)] = out_block_bytes(s, n_me, hd);
  }
  ex.layout();
  Stopwatch pack;
  const Tensor& o_h = r.out;
  for (int d = 0; d < s.P; ++d) {
    // Block for rank d: lse [B, hq, n_d] f32 first (4-byte aligned), then out [B, n_d, hq, Dv].
    char* at = ex.send.data() + ex.send_off[static_cast<std::size_t>(d)];
    const std::int64_t nd = in.q_layout.shard_length(d);
    auto* l = reinterpret_cast<float*>(at);
    for (std::int64_t b = 0; b < s.B; ++b)
      for (std::int64_t h = 0; h < hq; ++h)
        for_chunks(in.q_layout, d, [&](const Chunk& c, std::int64_t local_row) {
          std::memcpy(l + (b * hq + h) * nd + local_row,
                      r.lse->data_as<float>() + (b * hq + h) * s.Tq + c.begin,
                      static_cast<std::size_t>(c.size()) * 4);
        });
    char* o = at + static_cast<std::size_t>(s.B * hq * nd) * 4;
    for_chunks(in.q_layout, d, [&](const Chunk& c, std::int64_t local_row) {
      copy4(offset(of(o_h.view()), 0, c.begin, 0, s.es),
            offset(packed(o, nd, hq, s.Dv), 0, local_row, 0, s.es), s.B, c.size(), hq, s.Dv, s.es);
    });
  }
  out_st.compute_ms += pack.ms();
  out_st.wait_ms += ex.run(comm, out_st);
  Stopwatch unpack;
  Tensor out(p.dtype, {s.B, n_me, s.Hq, s.Dv}), lse(DType::f32, {s.B, s.Hq, n_me});
  for (int src = 0; src < s.P; ++src) {
    const Heads h = s.heads[static_cast<std::size_t>(src)];
    const std::int64_t hs = h.q_hi - h.q_lo;
    char* at = ex.recv.data() + ex.recv_off[static_cast<std::size_t>(src)];
    const auto* l = reinterpret_cast<const float*>(at);
    for (std::int64_t b = 0; b < s.B; ++b)
      std::memcpy(lse.data_as<float>() + (b * s.Hq + h.q_lo) * n_me, l + b * hs * n_me,
                  static_cast<std::size_t>(hs * n_me) * 4);
    char* o = at + static_cast<std::size_t>(s.B * hs * n_me) * 4;
    copy4(packed(o, n_me, hs, s.Dv), offset(of(out), 0, 0, h.q_lo, s.es), s.B, n_me, hs, s.Dv, s.es);
  }
  out_st.compute_ms += unpack.ms();
  stats.steps.push_back(out_st);

  DistOutput res;
  res.output.out = out;
  res.output.lse = lse;
  stats.total_ms = total.ms();
  finish_totals(stats);
  res.output.decision = distributed_decision("ulysses", stats, r.decision, Pass::forward);
  res.stats = std::move(stats);
  return res;
}

DistGradients ulysses_backward(Communicator& comm, const Attention& local, PreparedBackward& in,
                               const AttentionOptions& options) {
  Stopwatch total;
  const BackwardProblem& bp = in.bp;
  const AttentionProblem& p = bp.fwd;
  const Split s = split_of(comm, p, in.q_layout, in.kv_layout);
  const Heads mine = s.mine();
  const std::int64_t hq = mine.q_hi - mine.q_lo, hk = mine.kv_hi - mine.kv_lo;
  DistStats stats = start_stats("ulysses", "backward", comm, in.layout, s.Tq, s.Tk);

  StepStats in_st;
  in_st.name = "all-to-all in";
  Tensor q(p.dtype, {s.B, s.Tq, hq, s.D}), k(p.dtype, {s.B, s.Tk, hk, s.D}),
      v(p.dtype, {s.B, s.Tk, hk, s.Dv}), out(p.dtype, {s.B, s.Tq, hq, s.Dv}),
      dout(p.dtype, {s.B, s.Tq, hq, s.Dv}), lse(DType::f32, {s.B, hq, s.Tq});
  std::vector<Part> parts = {{p.q, false, &q, &in.q_layout},
                             {p.k, true, &k, &in.kv_layout},
                             {p.v, true, &v, &in.kv_layout},
                             {bp.out, false, &out, &in.q_layout},
                             {bp.dout, false, &dout, &in.q_layout}};
  seq_to_heads(comm, s, parts, in_st);
  lse_to_heads(comm, s, TensorView(bp.lse, DType::f32, {s.B, s.Hq, p.Tq}), in.q_layout, lse, in_st);
  std::optional<Tensor> seg_q, seg_kv;
  if (p.has_segments()) {
    Stopwatch w;
    seg_q = gather_segments(comm, p.seg_q, s.B, in.q_layout);
    seg_kv = gather_segments(comm, p.seg_kv, s.B, in.kv_layout);
    in_st.wait_ms += w.ms();
  }
  stats.steps.push_back(in_st);

  StepStats loc;
  loc.name = "local";
  Stopwatch compute;
  AttentionOptions o = local_options(options, s, seg_q, seg_kv, p.sinks);
  o.return_lse = false;
  const AttentionGradients g = local.backward(q, k, v, out, lse, dout, o);
  loc.compute_ms = compute.ms();
  loc.calls = 1;
  stats.steps.push_back(loc);

  // dq (my q heads) and dk / dv (my kv heads) back to the rows' owners; dK/dV of a replicated
  // head are summed (in rank order) over the ranks that read it.
  StepStats out_st;
  out_st.name = "all-to-all out";
  Exchange ex(s.P);
  const std::int64_t n_me = in.q_layout.shard_length(s.me), m_me = in.kv_layout.shard_length(s.me);
  const auto block_bytes = [&](std::int64_t n, std::int64_t m, std::int64_t h_q, std::int64_t h_k) {
    return static_cast<std::size_t>(s.B * (n * h_q * s.D + m * h_k * (s.D + s.Dv))) * s.es;
  };
  for (int d = 0; d < s.P; ++d) {
    const Heads hd = s.heads[static_cast<std::size_t>(d)];
    ex.send_bytes[static_cast<std::size_t>(d)] =
        block_bytes(in.q_layout.shard_length(d), in.kv_layout.shard_length(d), hq, hk);
    ex.recv_bytes[static_cast<std::size_t>(d)] =
        block_bytes(n_me, m_me, hd.q_hi - hd.q_lo, hd.kv_hi - hd.kv_lo);
  }
  ex.layout();
  Stopwatch pack;
  for (int d = 0; d < s.P; ++d) {
    char* at = ex.send.data() + ex.send_off[static_cast<std::size_t>(d)];
    const std::int64_t nd = in.q_layout.shard_length(d), md = in.kv_layout.shard_length(d);
    const auto put = [&](const Tensor& t, const ShardLayout& l, std::int64_t rows, std::int64_t h,
                         std::int64_t X) {
      for_chunks(l, d, [&](const Chunk& c, std::int64_t local_row) {
        copy4(offset(of(t.view()), 0, c.begin, 0, s.es),
              offset(packed(at, rows, h, X), 0, local_row, 0, s.es), s.B, c.size(), h, X, s.es);
      });
      at += static_cast<std::size_t>(s.B * rows * h * X) * s.es;
    };
    put(g.dq, in.q_layout, nd, hq, s.D);
    put(g.dk, in.kv_layout, md, hk, s.D);
    put(g.dv, in.kv_layout, md, hk, s.Dv);
  }
  out_st.compute_ms += pack.ms();
  out_st.wait_ms += ex.run(comm, out_st);
  Stopwatch unpack;
  Tensor dq(p.dtype, {s.B, n_me, s.Hq, s.D});
  Tensor dk32(DType::f32, {s.B, m_me, s.Hkv, s.D}), dv32(DType::f32, {s.B, m_me, s.Hkv, s.Dv});
  for (int src = 0; src < s.P; ++src) {
    const Heads h = s.heads[static_cast<std::size_t>(src)];
    const std::int64_t hs = h.q_hi - h.q_lo, ks = h.kv_hi - h.kv_lo;
    const char* at = ex.recv.data() + ex.recv_off[static_cast<std::size_t>(src)];
    copy4(packed(const_cast<char*>(at), n_me, hs, s.D), offset(of(dq), 0, 0, h.q_lo, s.es), s.B, n_me, hs,
          s.D, s.es);
    at += static_cast<std::size_t>(s.B * n_me * hs * s.D) * s.es;
    const auto add = [&](Tensor& acc, std::int64_t X) {
      for (std::int64_t b = 0; b < s.B; ++b)
        for (std::int64_t j = 0; j < m_me; ++j)
          for (std::int64_t kh = 0; kh < ks; ++kh) {
            float* t = acc.data_as<float>() + ((b * m_me + j) * s.Hkv + h.kv_lo + kh) * X;
            const std::size_t from = static_cast<std::size_t>(((b * m_me + j) * ks + kh) * X);
            if (p.dtype == DType::f32) {
              const float* f = reinterpret_cast<const float*>(at) + from;
              for (std::int64_t e = 0; e < X; ++e) t[e] += f[e];
            } else {
              for (std::int64_t e = 0; e < X; ++e)
                t[e] += load_as_float(at, p.dtype, from + static_cast<std::size_t>(e));
            }
          }
      at += static_cast<std::size_t>(s.B * m_me * ks * X) * s.es;
    };
    add(dk32, s.D);
    add(dv32, s.Dv);
  }
  out_st.compute_ms += unpack.ms();
  stats.steps.push_back(out_st);

  DistGradients res;
  res.gradients.dq = dq;
  res.gradients.dk = Tensor::copy_of(dk32, p.dtype);
  res.gradients.dv = Tensor::copy_of(dv32, p.dtype);
  if (p.sinks) {
    if (!g.dsinks) throw Error(ErrorCode::internal, "ulysses: the local backward returned no dsinks");
    // Each rank's heads, gathered in head order (rank r holds heads r * Hq / P ..).
    Tensor all(DType::f32, {s.Hq});
    comm.allgather(g.dsinks->data(), static_cast<std::size_t>(hq) * 4, all.data());
    res.gradients.dsinks = all;
  }
  stats.total_ms = total.ms();
  finish_totals(stats);
  res.gradients.decision = distributed_decision("ulysses", stats, g.decision, Pass::backward);
  res.stats = std::move(stats);
  return res;
}

}  // namespace attnops::dist::detail
