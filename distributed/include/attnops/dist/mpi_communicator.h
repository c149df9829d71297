// The MPI transport of sequence-parallel attention: the only attnops header that includes
// <mpi.h> (target attnops::dist_mpi, built when CMake finds MPI; the core library never links
// MPI).
//
//   int provided;
//   MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);   // the program's job
//   {
//     attnops::dist::MpiCommunicator comm(MPI_COMM_WORLD);           // duplicates the communicator
//     auto ring = attnops::dist::get("ring");
//     auto r = ring(comm, q_shard, k_shard, v_shard, {.causal = true});
//   }                                                                 // frees its duplicate
//   MPI_Finalize();
//
// The library never calls MPI_Init or MPI_Finalize. It needs MPI initialised with at least
// MPI_THREAD_FUNNELED and is called from the thread that initialised MPI; it calls MPI only
// outside its OpenMP regions. Messages above INT_MAX bytes are split.
#pragma once

#include <mpi.h>

#include <string>

#include "attnops/dist/communicator.h"

namespace attnops::dist {

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm` (MPI_Comm_dup), so the library's messages never match the caller's.
  // Error(invalid_argument) when MPI is not initialised, the thread level is below
  // MPI_THREAD_FUNNELED, or (FUNNELED) this is not the thread that initialised MPI.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;  // frees the duplicate (unless MPI was finalised already)
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string describe() const override { return describe_; }
  MPI_Comm comm() const { return comm_; }

  RequestPtr isend(const void* data, std::size_t bytes, int dest, int tag) override;
  RequestPtr irecv(void* data, std::size_t bytes, int source, int tag) override;

  void barrier() override;
  void quiet_barrier() override;  // MPI_Ibarrier polled with sleeps
  void allgather(const void* send, std::size_t bytes, void* recv) override;
  void broadcast(void* data, std::size_t bytes, int root) override;
  void alltoallv(const void* send, const std::vector<std::size_t>& send_bytes,
                 const std::vector<std::size_t>& send_offsets, void* recv,
                 const std::vector<std::size_t>& recv_bytes,
                 const std::vector<std::size_t>& recv_offsets) override;
  // allreduce_sum / allreduce_max stay the base class's allgather + fixed-order reduction, so
  // every rank gets bitwise the same result whatever algorithm the MPI library picks.

 private:
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  std::string describe_;
};

}  // namespace attnops::dist
