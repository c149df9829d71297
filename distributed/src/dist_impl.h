// What ring and ulysses share inside the distributed layer: validation and agreement of a
// call's shards, and the pieces of a decision.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include "attnops/dist/sequence_parallel.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"

namespace attnops::dist::detail {

// Message tags of the algorithms (below Communicator::kReservedTags).
enum Tag : int { kTagKv = 101, kTagDkv = 102, kTagDkvHome = 103 };

// One rank's validated call: its shard normalised by make_problem (runtime dtype, innermost
// stride 1, segment ids i32, sinks f32; p.mask is the static mask on global positions) and the
// layouts of the whole sequence.
struct Prepared {
  AttentionProblem p;
  ShardLayout q_layout, kv_layout;
  Layout layout = Layout::contiguous;
  int threads = 1;  // for the merges
};

// Validates this rank's shard (make_problem, plus what distributed attention refuses), agrees
// with the other ranks (agree()), then checks that every rank's shapes, dtype and options match
// and that the shard lengths are those of `layout` (every rank sees the same data: they all
// throw the same error). Collective.
Prepared prepare(Communicator& comm, const std::string& what, const Attention& local, Layout layout,
                 const TensorView& q, const TensorView& k, const TensorView& v,
                 const AttentionOptions& options, const std::string& extra_error = "", int extra_code = 0);

// The backward's counterpart: out, lse, dout validated with make_backward_problem.
struct PreparedBackward {
  BackwardProblem bp;
  ShardLayout q_layout, kv_layout;
  Layout layout = Layout::contiguous;
  int threads = 1;
};
PreparedBackward prepare_backward(Communicator& comm, const std::string& what, const Attention& local,
                                  Layout layout, const TensorView& q, const TensorView& k,
                                  const TensorView& v, const TensorView& out, const TensorView& lse,
                                  const TensorView& dout, const AttentionOptions& options,
                                  const std::string& extra_error = "", int extra_code = 0);

// The decision of a distributed call: requested / operator the distributed one, backend and
// reasons the local calls', run.kernel "ring(zigzag)+flash_attn2:avx512", run.kernel_detail the
// stats' summary, run.timings one entry per step (compute and wait).
DispatchDecision distributed_decision(const std::string& name, const DistStats& stats,
                                      const DispatchDecision& local, Pass pass);

// The options of one local call of a ring step: no static mask of the call's own (the caller
// passes at_offset masks), soft cap kept, no sinks (folded in once at the end), no bias.
AttentionOptions local_call_options(const AttentionOptions& user);

struct Stopwatch {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  double ms() const {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
};

// The header of a call's statistics: algorithm ("ring", "ulysses"), pass ("forward",
// "backward"), layout, ranks, global lengths and the transport; steps and totals come later.
DistStats start_stats(const char* algorithm, const char* pass, Communicator& comm, Layout layout,
                      std::int64_t Tq, std::int64_t Tk);
void finish_totals(DistStats& s);

DistOutput ring_forward(Communicator& comm, const Attention& local, const DistSettings& settings,
                        Prepared& in, const AttentionOptions& options);
DistGradients ring_backward(Communicator& comm, const Attention& local, const DistSettings& settings,
                            PreparedBackward& in, const AttentionOptions& options);
DistOutput ulysses_forward(Communicator& comm, const Attention& local, Prepared& in,
                           const AttentionOptions& options);
DistGradients ulysses_backward(Communicator& comm, const Attention& local, PreparedBackward& in,
                               const AttentionOptions& options);

}  // namespace attnops::dist::detail
