// Validation and agreement of one distributed call, shared by ring and ulysses.
#include <omp.h>

#include <algorithm>
#include <cstring>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "dist_impl.h"

namespace attnops::dist::detail {

namespace {

// What every rank must have in common, and what it holds.
struct ShapeRecord {
  std::int64_t B = 0, nq = 0, nkv = 0, Hq = 0, Hkv = 0, D = 0, Dv = 0;
  std::int32_t dtype = 0, flags = 0;  // flags: 1 segments, 2 sinks, 4 zigzag layout
  std::uint64_t options_hash = 0;     // the static mask, soft cap, scale, sinks
};

std::uint64_t fnv(std::uint64_t h, const void* data, std::size_t n) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (std::size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

ShapeRecord record_of(const AttentionProblem& p, Layout layout) {
  ShapeRecord r;
  r.B = p.B, r.nq = p.Tq, r.nkv = p.Tk, r.Hq = p.Hq, r.Hkv = p.Hkv, r.D = p.D, r.Dv = p.Dv;
  r.dtype = static_cast<std::int32_t>(p.dtype);
  r.flags = (p.has_segments() ? 1 : 0) | (p.sinks ? 2 : 0) | (layout == Layout::zigzag ? 4 : 0);
  std::uint64_t h = 1469598103934665603ull;
  h = fnv(h, p.mask.key().data(), p.mask.key().size());
  const double cap = p.soft_cap ? *p.soft_cap : 0.0;
  h = fnv(h, &cap, sizeof cap);
  h = fnv(h, &p.scale, sizeof p.scale);
  if (p.sinks) h = fnv(h, p.sinks, static_cast<std::size_t>(p.Hq) * sizeof(float));
  r.options_hash = h;
  return r;
}

CheckResult failure(const Error& e) {
  return {false, static_cast<int>(e.code()), e.what()};
}

// Every rank runs this on the same records, so every rank throws the same (agreed) error.
void check_records(const std::string& what, const std::vector<ShapeRecord>& all, const ShardLayout& ql,
                   const ShardLayout& kl) {
  const ShapeRecord& a = all[0];
  for (std::size_t r = 1; r < all.size(); ++r) {
    const ShapeRecord& b = all[r];
    const auto differs = [&](const char* field, std::int64_t x, std::int64_t y) {
      if (x != y)
        throw AgreedError(ErrorCode::shape_mismatch, what + ": rank " + std::to_string(r) + " has " + field +
                                                         "=" + std::to_string(y) + ", rank 0 has " +
                                                         std::to_string(x) +
                                                         " (every rank holds a shard of the same problem)");
    };
    differs("B", a.B, b.B);
    differs("Hq", a.Hq, b.Hq);
    differs("Hkv", a.Hkv, b.Hkv);
    differs("D", a.D, b.D);
    differs("Dv", a.Dv, b.Dv);
    if (a.dtype != b.dtype)
      throw AgreedError(ErrorCode::unsupported_dtype,
                        what + ": rank " + std::to_string(r) +
                            " runs another dtype than rank 0 (one runtime dtype for all)");
    if (a.flags != b.flags || a.options_hash != b.options_hash)
      throw AgreedError(
          ErrorCode::invalid_argument,
          what + ": rank " + std::to_string(r) +
              " has other options than rank 0 (mask, window, chunk, soft cap, scale, sinks, the layout "
              "and whether segment ids are given must be the same on every rank)");
  }
  for (std::size_t r = 0; r < all.size(); ++r) {
    const int ri = static_cast<int>(r);
    if (all[r].nq != ql.shard_length(ri) || all[r].nkv != kl.shard_length(ri))
      throw AgreedError(
          ErrorCode::shape_mismatch,
          what + ": rank " + std::to_string(r) + " holds " + std::to_string(all[r].nq) + " query and " +
              std::to_string(all[r].nkv) + " key rows; the " + std::string(layout_name(ql.layout())) +
              " layout of Tq=" + std::to_string(ql.length()) + ", Tk=" + std::to_string(kl.length()) +
              " over " + std::to_string(all.size()) + " ranks gives it " +
              std::to_string(ql.shard_length(ri)) + " and " + std::to_string(kl.shard_length(ri)) +
              " (shard with dist::shard and the operator's layout_for)");
  }
}

void check_supported(const std::string& what, const AttentionOptions& o, const TensorView& q,
                     const TensorView& k, const TensorView& v) {
  if (o.bias)
    throw Error(ErrorCode::not_implemented,
                what +
                    ": an additive bias is not supported by distributed attention (it is O(T^2) per rank); "
                    "use a mask, segment ids or a single process");
  if (o.return_weights)
    throw Error(ErrorCode::not_implemented,
                what + ": return_weights is not supported by distributed attention");
  if (q.on_device() || k.on_device() || v.on_device())
    throw Error(ErrorCode::invalid_argument,
                what + ": q, k and v must be host tensors (the messages are host buffers)");
}

int merge_threads(const Attention& local) {
  const int n = local.metadata().num_threads;
  return std::clamp(n > 0 ? n : omp_get_max_threads(), 1, max_worker_threads());
}

// The steps every prepare shares once the rank's own checks are done.
template <class P>
void finish(Communicator& comm, const std::string& what, Layout layout, const AttentionProblem& p, P& out) {
  std::vector<ShapeRecord> all(static_cast<std::size_t>(comm.size()));
  const ShapeRecord mine = record_of(p, layout);
  comm.allgather(&mine, sizeof mine, all.data());
  std::int64_t Tq = 0, Tk = 0;
  for (const ShapeRecord& r : all) Tq += r.nq, Tk += r.nkv;
  out.q_layout = ShardLayout(layout, Tq, comm.size());
  out.kv_layout = ShardLayout(layout, Tk, comm.size());
  out.layout = layout;
  check_records(what, all, out.q_layout, out.kv_layout);
}

}  // namespace

AttentionOptions local_call_options(const AttentionOptions& user) {
  AttentionOptions o;
  o.causal = false;
  o.logits_soft_cap = user.logits_soft_cap;
  o.return_lse = true;
  return o;
}

Prepared prepare(Communicator& comm, const std::string& what, const Attention& local, Layout layout,
                 const TensorView& q, const TensorView& k, const TensorView& v,
                 const AttentionOptions& options, const std::string& extra_error, int extra_code) {
  Prepared out;
  CheckResult mine;
  try {
    if (!extra_error.empty()) throw Error(static_cast<ErrorCode>(extra_code), extra_error);
    check_supported(what, options, q, k, v);
    AttentionOptions o = options;
    o.return_lse = true;
    out.p = make_problem(q, k, v, o, local.metadata());
  } catch (const Error& e) {
    mine = failure(e);
  }
  agree(comm, mine, what.c_str());
  out.threads = merge_threads(local);
  finish(comm, what, layout, out.p, out);
  return out;
}

PreparedBackward prepare_backward(Communicator& comm, const std::string& what, const Attention& local,
                                  Layout layout, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const TensorView& out_t, const TensorView& lse,
                                  const TensorView& dout, const AttentionOptions& options,
                                  const std::string& extra_error, int extra_code) {
  PreparedBackward out;
  CheckResult mine;
  try {
    if (!extra_error.empty()) throw Error(static_cast<ErrorCode>(extra_code), extra_error);
    check_supported(what, options, q, k, v);
    out.bp = make_backward_problem(q, k, v, out_t, lse, dout, options, local.metadata());
  } catch (const Error& e) {
    mine = failure(e);
  }
  agree(comm, mine, what.c_str());
  out.threads = merge_threads(local);
  finish(comm, what, layout, out.bp.fwd, out);
  return out;
}

DistStats start_stats(const char* algorithm, const char* pass, Communicator& comm, Layout layout,
                      std::int64_t Tq, std::int64_t Tk) {
  DistStats stats;
  stats.algorithm = algorithm;
  stats.pass = pass;
  stats.layout = layout;
  stats.ranks = comm.size();
  stats.Tq = Tq;
  stats.Tk = Tk;
  stats.transport = comm.describe();
  return stats;
}

void finish_totals(DistStats& s) {
  s.compute_ms = s.wait_ms = 0;
  s.bytes_sent = s.bytes_received = 0;
  for (const StepStats& t : s.steps) {
    s.compute_ms += t.compute_ms;
    s.wait_ms += t.wait_ms;
    s.bytes_sent += t.bytes_sent;
    s.bytes_received += t.bytes_received;
  }
}

}  // namespace attnops::dist::detail
