// The key/value channel of the ring: at step t a rank computes with the keys of source
// (rank - t); meanwhile it receives from its left neighbour the message of step t + 1 and sends
// its right neighbour the columns of the current keys that rank needs at step t + 1 (the plan's
// message: only what some later rank sees). A message is three sends of one pair and tag (K,
// V, segment ids; kv_block.h's layout), so that the rank's own keys and a message forwarded
// unchanged go out from where they are; only a narrower message is packed first. Two receive
// buffers alternate (double buffering). The buffers belong to the calling thread (one per rank)
// and are kept for its next call: no pages to map and zero per call.
#pragma once

#include <cstdint>
#include <vector>

#include "attnops/dist/communicator.h"
#include "kv_block.h"
#include "ring_plan.h"

namespace attnops::dist::detail {

class KvRing {
 public:
  // `own`: this rank's keys (every column of its chunks).
  KvRing(Communicator& comm, const RingPlan& plan, const KvShape& shape, KvBlock own);
  // Posts step t's receive (the message of step t + 1) and send. current() is step t's keys.
  void start_step(int t);
  const KvBlock& current() const { return cur_; }
  bool has_current() const { return has_cur_; }
  // Tests the step's requests (between local tiles, so that rendezvous messages move).
  void progress() { test_all(reqs_); }
  // Waits for the step's messages; the received message becomes current. Returns the wait (ms).
  double finish_step();
  std::uint64_t step_bytes_sent() const { return sent_; }
  std::uint64_t step_bytes_received() const { return received_; }

 private:
  Communicator& comm_;
  const RingPlan& plan_;
  KvShape shape_;
  KvBlock own_, cur_, next_;
  bool has_cur_ = true, has_next_ = false;
  int step_ = 0;
  Buffer* recv_[2];
  Buffer* pack_;
  std::vector<RequestPtr> reqs_;
  std::uint64_t sent_ = 0, received_ = 0;
};

}  // namespace attnops::dist::detail
