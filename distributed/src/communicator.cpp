// The default collectives, built from isend / irecv (used by the in-process communicator; the
// MPI one maps them to MPI's collectives), and the agreement step.
#include "attnops/dist/communicator.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "attnops/error.h"

namespace attnops::dist {

namespace {
// Reserved tags, one per collective: a collective's messages never match another's.
enum Tag : int {
  kTagBarrier = Communicator::kReservedTags,
  kTagReduce,
  kTagGather,
  kTagBroadcast,
  kTagAlltoall,
};
}  // namespace

void wait_all(std::vector<RequestPtr>& requests) {
  for (auto& r : requests)
    if (r) r->wait();
  requests.clear();
}

bool test_all(std::vector<RequestPtr>& requests) {
  bool done = true;
  for (auto& r : requests)
    if (r && !r->test()) done = false;
  return done;
}

void Communicator::barrier() {
  char token = 0;
  std::vector<char> all(static_cast<std::size_t>(size()));
  allgather(&token, 1, all.data());
}

void Communicator::quiet_barrier() {
  // Everyone tells rank 0, rank 0 tells everyone; each receive is polled with sleeps.
  const int n = size(), me = rank();
  char token = 0;
  const auto poll = [](Request& r) {
    while (!r.test()) std::this_thread::sleep_for(std::chrono::microseconds(200));
  };
  if (me == 0) {
    std::vector<char> in(static_cast<std::size_t>(n));
    for (int s = 1; s < n; ++s) {
      RequestPtr r = irecv(&in[static_cast<std::size_t>(s)], 1, s, kTagBarrier);
      poll(*r);
    }
    std::vector<RequestPtr> out;
    for (int d = 1; d < n; ++d) out.push_back(isend(&token, 1, d, kTagBarrier));
    wait_all(out);
  } else {
    RequestPtr s = isend(&token, 1, 0, kTagBarrier);
    poll(*s);
    char back = 0;
    RequestPtr r = irecv(&back, 1, 0, kTagBarrier);
    poll(*r);
  }
}

void Communicator::allgather(const void* send, std::size_t bytes, void* recv) {
  const int n = size(), me = rank();
  auto* out = static_cast<char*>(recv);
  std::memcpy(out + static_cast<std::size_t>(me) * bytes, send, bytes);
  std::vector<RequestPtr> reqs;
  for (int s = 0; s < n; ++s)
    if (s != me) reqs.push_back(irecv(out + static_cast<std::size_t>(s) * bytes, bytes, s, kTagGather));
  for (int d = 0; d < n; ++d)
    if (d != me) reqs.push_back(isend(send, bytes, d, kTagGather));
  wait_all(reqs);
}

namespace {
template <class Op>
void allreduce_with(Communicator& c, double* data, std::size_t n, Op op) {
  // An allgather of every rank's values, then the same fixed-order reduction on every rank:
  // every rank gets bitwise the same result.
  std::vector<double> all(n * static_cast<std::size_t>(c.size()));
  c.allgather(data, n * sizeof(double), all.data());
  for (std::size_t i = 0; i < n; ++i) {
    double acc = all[i];
    for (int r = 1; r < c.size(); ++r) acc = op(acc, all[static_cast<std::size_t>(r) * n + i]);
    data[i] = acc;
  }
}
}  // namespace

void Communicator::allreduce_sum(double* data, std::size_t n) {
  allreduce_with(*this, data, n, [](double a, double b) { return a + b; });
}

void Communicator::allreduce_max(double* data, std::size_t n) {
  allreduce_with(*this, data, n, [](double a, double b) { return std::max(a, b); });
}

void Communicator::broadcast(void* data, std::size_t bytes, int root) {
  if (rank() == root) {
    std::vector<RequestPtr> reqs;
    for (int d = 0; d < size(); ++d)
      if (d != root) reqs.push_back(isend(data, bytes, d, kTagBroadcast));
    wait_all(reqs);
  } else {
    irecv(data, bytes, root, kTagBroadcast)->wait();
  }
}

void Communicator::alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                             const std::vector<std::size_t>& send_offsets, void* recv,
                             const std::vector<std::size_t>& recv_bytes,
                             const std::vector<std::size_t>& recv_offsets) {
  const int n = size(), me = rank();
  const auto un = static_cast<std::size_t>(n);
  if (send_bytes.size() != un || send_offsets.size() != un || recv_bytes.size() != un ||
      recv_offsets.size() != un)
    throw Error(ErrorCode::internal, "alltoallv: counts and offsets need one entry per rank");
  const auto* in = static_cast<const char*>(send);
  auto* out = static_cast<char*>(recv);
  const auto me_u = static_cast<std::size_t>(me);
  if (send_bytes[me_u] != recv_bytes[me_u])
    throw Error(ErrorCode::internal, "alltoallv: a rank sends itself a different size than it receives");
  if (send_bytes[me_u] > 0) std::memcpy(out + recv_offsets[me_u], in + send_offsets[me_u], send_bytes[me_u]);
  std::vector<RequestPtr> reqs;
  for (int s = 0; s < n; ++s) {
    const auto su = static_cast<std::size_t>(s);
    if (s != me && recv_bytes[su] > 0)
      reqs.push_back(irecv(out + recv_offsets[su], recv_bytes[su], s, kTagAlltoall));
  }
  for (int d = 0; d < n; ++d) {
    const auto du = static_cast<std::size_t>(d);
    if (d != me && send_bytes[du] > 0)
      reqs.push_back(isend(in + send_offsets[du], send_bytes[du], d, kTagAlltoall));
  }
  wait_all(reqs);
}

namespace {
// One rank's verdict, fixed size so that one allgather carries everyone's.
struct Verdict {
  std::int32_t ok = 1;
  std::int32_t code = 0;
  char message[504] = {};
};
}  // namespace

void agree(Communicator& comm, const CheckResult& mine, const char* what) {
  Verdict v;
  v.ok = mine.ok ? 1 : 0;
  v.code = mine.code;
  std::strncpy(v.message, mine.message.c_str(), sizeof v.message - 1);
  std::vector<Verdict> all(static_cast<std::size_t>(comm.size()));
  comm.allgather(&v, sizeof v, all.data());
  if (!mine.ok) throw AgreedError(static_cast<ErrorCode>(mine.code), mine.message);
  for (int r = 0; r < comm.size(); ++r) {
    const Verdict& o = all[static_cast<std::size_t>(r)];
    if (!o.ok)
      throw AgreedError(static_cast<ErrorCode>(o.code), std::string(what) + ": rank " + std::to_string(r) +
                                                            " rejected its inputs: " + o.message);
  }
}

}  // namespace attnops::dist
