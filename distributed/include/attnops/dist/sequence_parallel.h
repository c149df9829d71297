// Sequence-parallel attention: a sequence too long for one process is split along T over the
// ranks of a communicator (communicator.h: MPI or ranks as threads), each rank holding a shard
// of q, k and v in BTHD (layout.h says which positions), and the ranks together compute exactly
// the attention of the whole sequence.
//
//   ring     q stays; the key/value shards travel around the ring with non-blocking
//            point-to-point messages, double-buffered and overlapped with the local tiles;
//            partial results merge by log-sum-exp. Causal uses the zigzag layout. Masks are
//            evaluated on global positions; blocks no row sees are neither computed nor sent.
//            Backward: dq stays, dK/dV accumulators travel back to their owners.
//   ulysses  an all-to-all turns the sequence split into a head split, the local operator runs
//            unchanged on whole sequences for Hq/P heads, a second all-to-all turns it back.
//            Needs Hq % P == 0 and (Hkv % P == 0 or P % Hkv == 0: K/V heads are then replicated).
//
//   attnops::dist::MpiCommunicator comm(MPI_COMM_WORLD);                 // or a LocalWorld's
//   auto ring = attnops::dist::get("ring");
//   attnops::dist::ShardLayout l = ring.layout_for(opts, T, comm.size()); // zigzag when causal
//   auto q_r = attnops::dist::shard(q, l, comm.rank()), ...;             // or the caller's own shards
//   attnops::dist::DistOutput o = ring(comm, q_r, k_r, v_r, opts);        // this rank's rows
//   attnops::dist::DistGradients g = ring.backward(comm, q_r, k_r, v_r, o, dout_r, opts);
//
// Every rank calls with its shard: q [B, n_r, Hq, D], k [B, m_r, Hkv, D], v [B, m_r, Hkv, Dv],
// segment ids [B, n_r] / [B, m_r] (they travel with K/V), sinks [Hq] and every other option the
// same on all ranks. T = sum of n_r (Tk = sum of m_r); n_r must be the layout's shard length.
// Outputs are the rank's rows: out [B, n_r, Hq, Dv], lse [B, Hq, n_r]; gradients dq [B, n_r, Hq,
// D], dk / dv [B, m_r, Hkv, D|Dv]; dsinks [Hq] (summed over ranks, the same on every rank).
// Not supported (Error not_implemented): an additive bias (it is O(T^2) per rank) and
// return_weights. Arguments are checked on every rank and the ranks agree before any message
// moves: a bad argument on one rank is an error on every rank, never a hang. Errors after that
// point (out of memory, a GPU failure) leave the communicator unusable (MPI: abort).
//
// Exactness: with one rank both call the local operator once with the caller's options (bitwise
// the single-process result). With P ranks the result is the same function computed in another
// order: fp32 merges of fp32 partial results, so it differs from one process by rounding (the
// tests hold it to at most twice the single-process error against the fp64 oracle). Partial
// results are in the runtime dtype: with f16 / bf16 every block's output is rounded before the
// merge (as ring-flash-attention's), so the error grows with P there.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/attnops.h"
#include "attnops/dist/communicator.h"
#include "attnops/dist/layout.h"

namespace attnops::dist {

struct DistSettings {
  // ring: the layout of the shards (nullopt: default_layout(options)); ulysses: how the caller's
  // shards are laid out (any; nullopt: the same default, so ring and ulysses take the same shards).
  std::optional<Layout> layout;
  // The registered operator each rank runs locally (any operator for ulysses; ring needs one
  // that returns lse, which all built-in ones do).
  std::string local_operator = "flash_attn2";
  // ring: query rows per local call, so that the transport is progressed (test()) between
  // tiles; 0 = one call per block.
  std::int64_t progress_rows = 1024;
};

// What one step of the ring (or one phase of ulysses) cost this rank.
struct StepStats {
  std::string name;       // "step 3" / "all-to-all in", "local", "all-to-all out"
  int source = -1;        // ring: whose keys this step computed
  double compute_ms = 0;  // local calls and merges
  double wait_ms = 0;     // waiting for messages after the compute (the exposed communication)
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  int calls = 0;             // local operator calls
  double visible_pairs = 0;  // (query, key) pairs per head computed
};

struct DistStats {
  std::string algorithm;  // "ring" or "ulysses"
  std::string pass;       // "forward" or "backward"
  Layout layout = Layout::contiguous;
  int ranks = 1;
  std::int64_t Tq = 0, Tk = 0;
  std::string transport;  // Communicator::describe()
  std::vector<StepStats> steps;
  double compute_ms = 0, wait_ms = 0, total_ms = 0;  // this rank: busy, exposed wait, wall
  std::uint64_t bytes_sent = 0, bytes_received = 0;
  std::string summary() const;  // one line: layout, ranks, per-step compute / wait / bytes
};

struct DistOutput {
  AttentionOutput output;  // this rank's rows; output.decision names the layout, the local
                           // kernel and the per-step times and bytes (run.kernel_detail, run.timings)
  DistStats stats;
};

struct DistGradients {
  AttentionGradients gradients;  // this rank's dq, its dk / dv, dsinks (all ranks')
  DistStats stats;
};

class DistributedAttention {
 public:
  // The forward on this rank's shards; out and lse are this rank's rows (lse always returned:
  // the backward needs it).
  DistOutput operator()(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                        const AttentionOptions& options = {}) const;
  // The backward: out and lse are the forward's (this rank's rows), dout the gradient of out.
  DistGradients backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                         const TensorView& out, const TensorView& lse, const TensorView& dout,
                         const AttentionOptions& options = {}) const;
  DistGradients backward(Communicator& comm, const TensorView& q, const TensorView& k, const TensorView& v,
                         const DistOutput& forward, const TensorView& dout,
                         const AttentionOptions& options = {}) const;

  // The layout this operator expects for these options over `ranks` ranks.
  ShardLayout layout_for(const AttentionOptions& options, std::int64_t T, int ranks) const;
  const std::string& name() const { return name_; }  // "ring" or "ulysses"
  const Attention& local() const { return local_; }
  const DistSettings& settings() const { return settings_; }

 private:
  friend DistributedAttention get(const Registry&, std::string_view, const Config&, DistSettings);
  std::string name_;
  Attention local_;           // the local operator, with the distributed entry's metadata
  Attention local_backward_;  // the same without the native backend (ring: see ring_backward.cpp)
  DistSettings settings_;
};

// Registers "ring" and "ulysses" in `r` (the local operator must be registered there too). As
// plain Attention handles (no communicator) they run on a world of one rank: the local operator
// (flash_attn2) itself. Their metadata (the config's top level and operators.ring /
// operators.ulysses: backend, block sizes, threads, dtype) configures the local operator.
void register_distributed_operators(Registry& r);

// The distributed handle of "ring" or "ulysses" registered in `r` (Error unknown_operator
// otherwise), configured by `config` as registry().get would configure it.
DistributedAttention get(const Registry& r, std::string_view name, const Config& config = {},
                         DistSettings settings = {});
// The same on the process registry, registering the two entries there on first use.
DistributedAttention get(std::string_view name, const Config& config = {}, DistSettings settings = {});

}  // namespace attnops::dist
