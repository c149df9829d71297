// Ranks as threads of one process: the communicator that lets the distributed algorithms run,
// and be tested, without MPI.
//
//   attnops::dist::run_local_ranks(4, [&](attnops::dist::Communicator& comm) {
//     ... every rank's part, comm.rank() in 0..3 ...
//   });
//
// Messages follow MPI's rules (non-overtaking per pair and tag). A send of at most `eager_limit`
// bytes completes at once (its bytes are copied); a larger one completes only when the receiver
// has posted its receive (rendezvous), so an exchange that would deadlock under MPI with large
// messages deadlocks here too. The default eager limit is 0: every send is a rendezvous.
// Whoever posts second (send or receive) copies the bytes, so no progress calls are needed.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "attnops/dist/communicator.h"

namespace attnops::dist {

class LocalWorld {
 public:
  explicit LocalWorld(int size, std::size_t eager_limit = 0);
  int size() const;
  // The communicator of rank `rank`; used by one thread at a time, it must not outlive the world.
  std::unique_ptr<Communicator> communicator(int rank);
  // Every call blocked in a wait, and every later call, throws Error(internal) with `why`: the
  // other ranks of a world whose rank failed stop instead of waiting forever.
  void abort(const std::string& why);

  struct State;

 private:
  std::shared_ptr<State> state_;
};

// Runs fn(comm) for each rank of a new world on its own thread and joins them. When a rank
// throws, the world is aborted and the first exception is rethrown after every thread ended.
void run_local_ranks(int size, const std::function<void(Communicator&)>& fn, std::size_t eager_limit = 0);

}  // namespace attnops::dist
