// The in-process communicator: MPI's message rules (non-overtaking per pair and tag,
// rendezvous above the eager limit), the collectives built on it, and abort on failure.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "attnops/dist/local_communicator.h"
#include "attnops/error.h"

namespace attnops::dist {
namespace {

TEST(LocalComm, MessagesArriveInOrderPerPairAndTag) {
  run_local_ranks(2, [](Communicator& comm) {
    if (comm.rank() == 0) {
      std::vector<int> a = {1, 2, 3}, b = {4, 5, 6}, c = {7};
      std::vector<RequestPtr> r;
      r.push_back(comm.isend(a.data(), 12, 1, 5));
      r.push_back(comm.isend(c.data(), 4, 1, 6));  // another tag: matched by tag, not by order
      r.push_back(comm.isend(b.data(), 12, 1, 5));
      wait_all(r);
    } else {
      std::vector<int> x(3), y(3), z(1);
      RequestPtr rz = comm.irecv(z.data(), 4, 0, 6);
      RequestPtr rx = comm.irecv(x.data(), 12, 0, 5);
      RequestPtr ry = comm.irecv(y.data(), 12, 0, 5);
      rx->wait(), ry->wait(), rz->wait();
      if (x != std::vector<int>{1, 2, 3} || y != std::vector<int>{4, 5, 6} || z[0] != 7)
        throw Error(ErrorCode::internal, "messages out of order");
    }
  });
}

TEST(LocalComm, RendezvousSendsCompleteOnlyWhenReceived) {
  std::atomic<bool> posted{false};
  run_local_ranks(2, [&](Communicator& comm) {
    int v = 42;
    if (comm.rank() == 0) {
      RequestPtr s = comm.isend(&v, 4, 1, 0);
      if (s->test()) throw Error(ErrorCode::internal, "a rendezvous send completed before its receive");
      s->wait();
      if (!posted) throw Error(ErrorCode::internal, "send completed without a receive");
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      int got = 0;
      posted = true;
      comm.irecv(&got, 4, 0, 0)->wait();
      if (got != 42) throw Error(ErrorCode::internal, "wrong value");
    }
  });
  // Eager: complete at once.
  run_local_ranks(
      2,
      [&](Communicator& comm) {
        int v = 7, got = 0;
        if (comm.rank() == 0) {
          RequestPtr s = comm.isend(&v, 4, 1, 0);
          if (!s->test()) throw Error(ErrorCode::internal, "an eager send should complete at once");
          v = 8;  // the bytes were copied at the send
          comm.barrier();
        } else {
          comm.barrier();
          comm.irecv(&got, 4, 0, 0)->wait();
          if (got != 7) throw Error(ErrorCode::internal, "eager copy not taken at the send");
        }
      },
      64);
}

TEST(LocalComm, Collectives) {
  run_local_ranks(4, [](Communicator& comm) {
    const int r = comm.rank();
    double x[2] = {static_cast<double>(r), 1.0};
    comm.allreduce_sum(x, 2);
    double m = r * 3.0;
    comm.allreduce_max(&m, 1);
    std::vector<int> all(4);
    comm.allgather(&r, sizeof r, all.data());
    int b = r == 2 ? 99 : 0;
    comm.broadcast(&b, sizeof b, 2);
    // alltoallv: rank r sends d + 1 ints of value 10 r + d to rank d.
    std::vector<std::size_t> sb(4), so(4), rb(4), ro(4);
    std::vector<int> send, recv;
    for (int d = 0; d < 4; ++d) {
      so[static_cast<std::size_t>(d)] = send.size() * 4;
      for (int i = 0; i <= d; ++i) send.push_back(10 * r + d);
      sb[static_cast<std::size_t>(d)] = static_cast<std::size_t>(d + 1) * 4;
      ro[static_cast<std::size_t>(d)] = static_cast<std::size_t>(d) * static_cast<std::size_t>(r + 1) * 4;
      rb[static_cast<std::size_t>(d)] = static_cast<std::size_t>(r + 1) * 4;
    }
    recv.assign(static_cast<std::size_t>(4 * (r + 1)), -1);
    comm.alltoallv(send.data(), sb, so, recv.data(), rb, ro);
    comm.quiet_barrier();
    bool ok = x[0] == 6 && x[1] == 4 && m == 9 && all == std::vector<int>{0, 1, 2, 3} && b == 99;
    for (int s = 0; s < 4; ++s)
      for (int i = 0; i <= r; ++i) ok = ok && recv[static_cast<std::size_t>(s * (r + 1) + i)] == 10 * s + r;
    if (!ok) throw Error(ErrorCode::internal, "collective results wrong on rank " + std::to_string(r));
  });
}

TEST(LocalComm, AFailingRankReleasesTheOthers) {
  // Rank 1 throws before sending; rank 0 waits on a receive that never comes: the world's abort
  // wakes it, and the first (real) error is what run_local_ranks rethrows.
  try {
    run_local_ranks(2, [](Communicator& comm) {
      if (comm.rank() == 1) throw Error(ErrorCode::invalid_argument, "rank 1 gives up");
      int v = 0;
      comm.irecv(&v, 4, 1, 0)->wait();
    });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::invalid_argument);
    EXPECT_STREQ(e.what(), "rank 1 gives up");
  }
}

TEST(LocalComm, AgreementTurnsOneRanksErrorIntoEveryRanks) {
  std::vector<std::string> msgs(3);
  run_local_ranks(3, [&](Communicator& comm) {
    CheckResult mine;
    if (comm.rank() == 2) mine = {false, static_cast<int>(ErrorCode::shape_mismatch), "q: bad"};
    try {
      agree(comm, mine, "op");
    } catch (const Error& e) {
      msgs[static_cast<std::size_t>(comm.rank())] = std::string(error_code_name(e.code())) + ": " + e.what();
    }
  });
  EXPECT_EQ(msgs[0], "shape_mismatch: op: rank 2 rejected its inputs: q: bad");
  EXPECT_EQ(msgs[1], msgs[0]);
  EXPECT_EQ(msgs[2], "shape_mismatch: q: bad");
}

}  // namespace
}  // namespace attnops::dist
