#include "kv_ring.h"

#include "dist_impl.h"

namespace attnops::dist::detail {

namespace {
struct Workspace {
  Buffer recv[2], pack;
};
Workspace& workspace() {
  thread_local Workspace w;
  return w;
}
}  // namespace

KvRing::KvRing(Communicator& comm, const RingPlan& plan, const KvShape& shape, KvBlock own)
    : comm_(comm), plan_(plan), shape_(shape), own_(std::move(own)), cur_(own_) {
  Workspace& w = workspace();
  recv_[0] = &w.recv[0], recv_[1] = &w.recv[1], pack_ = &w.pack;
}

namespace {
// The three parts of a block of `ncols` columns whose K, V and seg start at k, v, seg.
struct Parts {
  const char* data[3];
  std::size_t bytes[3];
  int n;
};
Parts parts_of(const KvShape& s, const char* k, const char* v, const void* seg, std::int64_t ncols) {
  const std::size_t es = dtype_size(s.dtype), rows = static_cast<std::size_t>(s.B * ncols * s.Hkv);
  Parts p{{k, v, static_cast<const char*>(seg)},
          {rows * static_cast<std::size_t>(s.D) * es, rows * static_cast<std::size_t>(s.Dv) * es,
           static_cast<std::size_t>(s.B * ncols) * sizeof(std::int32_t)},
          s.segments ? 3 : 2};
  return p;
}
}  // namespace

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
      char* buf = recv_[(t + 1) % 2]->reserve(bytes);
      next_ = message_block(shape_, buf, ranges);
      const Parts parts = parts_of(shape_, next_.k, next_.v, next_.seg, next_.ncols);
      for (int i = 0; i < parts.n; ++i) {
        reqs_.push_back(comm_.irecv(const_cast<char*>(parts.data[i]), parts.bytes[i], left, kTagKv));
        received_ += parts.bytes[i];
      }
      has_next_ = true;
    }
    // Send: what the right neighbour needs of the current source at its step t + 1.
    const int s = plan_.source(me, t);
    if (has_cur_ && plan_.has_message(s, t + 1)) {
      const auto& ranges = plan_.message(s, t + 1);
      KvBlock out = cur_;           // the whole block (own keys, or a message forwarded as it came)
      if (ranges != cur_.ranges) {  // a narrower message: packed
        char* buf = pack_->reserve(message_layout(shape_, total_columns(ranges)).bytes);
        pack(shape_, cur_, ranges, buf);
        out = message_block(shape_, buf, ranges);
      }
      const Parts parts = parts_of(shape_, out.k, out.v, out.seg, out.ncols);
      for (int i = 0; i < parts.n; ++i) {
        reqs_.push_back(comm_.isend(parts.data[i], parts.bytes[i], right, kTagKv));
        sent_ += parts.bytes[i];
      }
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
