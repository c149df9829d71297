// The transport of sequence-parallel attention: a small communicator interface with two
// implementations, MPI (mpi_communicator.h, the only header that includes <mpi.h>) and ranks as
// threads of one process (local_communicator.h), so the ring and Ulysses logic runs, and is
// tested, in builds without MPI.
//
// Semantics are MPI's: ranks 0 .. size()-1; point-to-point messages between one pair with one
// tag arrive in the order they were sent (non-overtaking); a send's buffer must stay valid and
// unchanged, a receive's valid, until the request completes. Nothing is promised about progress
// unless a rank is inside a call of its communicator: long computations call test() on their
// outstanding requests now and then (between tiles) so that large (rendezvous) messages move.
// Collectives must be called by every rank in the same order. A Communicator is used by one
// thread at a time (MPI_THREAD_FUNNELED: the thread that calls MPI, outside OpenMP regions).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "attnops/error.h"

namespace attnops::dist {

// One outstanding point-to-point operation. Destroying an incomplete request waits for it.
class Request {
 public:
  virtual ~Request() = default;
  virtual bool test() = 0;  // progresses the transport; true once complete
  virtual void wait() = 0;  // blocks until complete
};
using RequestPtr = std::unique_ptr<Request>;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "mpi (Open MPI v4.1.4, ...)" or "in-process (4 ranks as threads)", for decisions and logs.
  virtual std::string describe() const = 0;

  // Point-to-point, in bytes. Tags below kReservedTags are free for callers; the collectives
  // of the default implementations use the ones above.
  static constexpr int kReservedTags = 1 << 20;
  virtual RequestPtr isend(const void* data, std::size_t bytes, int dest, int tag) = 0;
  virtual RequestPtr irecv(void* data, std::size_t bytes, int source, int tag) = 0;

  // Collectives. The defaults are built from isend / irecv (the in-process communicator uses
  // them); MpiCommunicator maps them to MPI's own.
  virtual void barrier();
  // A barrier that waits without spinning (sleeps between tests): ranks that idle while another
  // rank times something must not take its cores.
  virtual void quiet_barrier();
  virtual void allreduce_sum(double* data, std::size_t n);
  virtual void allreduce_max(double* data, std::size_t n);
  // recv holds size() blocks of `bytes`, block r from rank r.
  virtual void allgather(const void* send, std::size_t bytes, void* recv);
  virtual void broadcast(void* data, std::size_t bytes, int root);
  // Block d of `send` ([send_offsets[d], + send_bytes[d])) goes to rank d; block s of `recv`
  // comes from rank s. Offsets and sizes in bytes; every rank's sizes must agree pairwise.
  virtual void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                         const std::vector<std::size_t>& send_offsets, void* recv,
                         const std::vector<std::size_t>& recv_bytes,
                         const std::vector<std::size_t>& recv_offsets);
};

// Completes every request (in order) and clears the list.
void wait_all(std::vector<RequestPtr>& requests);
// Tests every request once (progress between tiles); true when all are complete.
bool test_all(std::vector<RequestPtr>& requests);

// An error every rank of a communicator raised at the same point, before any message of the
// call moved: the communicator is still usable (a program may report it and finish normally,
// where any other error in a distributed call should abort the job: MPI_Abort).
class AgreedError : public Error {
 public:
  using Error::Error;
};

// Agreement before communication: every rank reports whether its own checks passed, with a
// message when not. When any rank failed, every rank throws an AgreedError: a failed rank its
// own error, the others the first failed rank's code, naming the rank and its message. So a bad
// argument on one rank never leaves the others waiting for a message that will not come.
struct CheckResult {
  bool ok = true;
  int code = 0;  // ErrorCode of the failure
  std::string message;
};
void agree(Communicator& comm, const CheckResult& mine, const char* what);

}  // namespace attnops::dist
