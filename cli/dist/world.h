// The ranks a distributed command runs on: MPI's world when the program was started by mpirun
// (and built with MPI), otherwise a world of one rank in this process. Only world_mpi.cpp
// includes <mpi.h>.
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "attnops/dist/communicator.h"
#include "attnops/dist/local_communicator.h"

namespace attnops::cli {

class World {
 public:
  virtual ~World() = default;  // MPI: frees the communicator, then MPI_Finalize
  virtual dist::Communicator& comm() = 0;
  // Ends every rank of the job now with `code` (MPI_Abort): for errors after which other ranks
  // may be waiting for this one.
  [[noreturn]] virtual void abort(int code) = 0;
};

// One rank in this process (a build without MPI, or a program not started by a launcher).
class SingleRankWorld final : public World {
 public:
  SingleRankWorld() : world_(1), comm_(world_.communicator(0)) {}
  dist::Communicator& comm() override { return *comm_; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  dist::LocalWorld world_;
  std::unique_ptr<dist::Communicator> comm_;
};

// MPI_Init_thread (MPI_THREAD_FUNNELED) when started by a launcher (mpirun / mpiexec set
// OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK) in an MPI build; one rank otherwise.
std::unique_ptr<World> open_world(int& argc, char**& argv);
// Whether this build can run on MPI ranks.
bool built_with_mpi();

}  // namespace attnops::cli
