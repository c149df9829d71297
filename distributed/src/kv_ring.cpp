#include "kv_ring.h"

#include "dist_impl.h"

namespace attnops::dist::detail {

KvRing::KvRing(Communicator& comm, const RingPlan& plan, const KvShape& shape, KvBlock own)
    : comm_(comm), plan_(plan), shape_(shape), own_(std::move(own)), cur_(own_) {}

void KvRing::start_step(int t) {
  step_ = t;
  sent_ = received_ = 0;
  const int me = comm_.rank(), P = comm_.size();
  const int left = (me - 1 + P) % P, right = (me + 1) % P;
  has_next_ = false;
  if (t + 1 < plan_.steps()) {
    // Receive: the keys of source (me - t - 1), which the left neighbour holds at its step t.
    const int s_next = plan_.source(me, t + 1);
    if (plan_.has_message(s_next, t + 1)) {
      const auto& ranges = plan_.message(s_next, t + 1);
      const std::size_t bytes = message_layout(shape_, total_columns(ranges)).bytes;
      char* buf = recv_[(t + 1) % 2].reserve(bytes);
      reqs_.push_back(comm_.irecv(buf, bytes, left, kTagKv));
      next_ = message_block(shape_, buf, ranges);
      has_next_ = true;
      received_ = bytes;
    }
    // Send: what the right neighbour needs of the current source at its step t + 1.
    const int s = plan_.source(me, t);
    if (has_cur_ && plan_.has_message(s, t + 1)) {
      const auto& ranges = plan_.message(s, t + 1);
      const std::size_t bytes = message_layout(shape_, total_columns(ranges)).bytes;
      const char* data;
      if (t >= 1 && ranges == cur_.ranges) {
        data = cur_.k;  // a received message, forwarded as it came
      } else {
        char* buf = pack_.reserve(bytes);
        pack(shape_, cur_, ranges, buf);
        data = buf;
      }
      reqs_.push_back(comm_.isend(data, bytes, right, kTagKv));
      sent_ = bytes;
    }
  }
}

double KvRing::finish_step() {
  Stopwatch w;
  wait_all(reqs_);
  const double ms = w.ms();
  has_cur_ = has_next_;
  if (has_next_) cur_ = next_;
  return ms;
}

}  // namespace attnops::dist::detail
