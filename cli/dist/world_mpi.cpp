#include <mpi.h>

#include <cstdlib>

#include "attnops/dist/mpi_communicator.h"
#include "attnops/error.h"
#include "cli/dist/world.h"

namespace attnops::cli {

namespace {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

class MpiWorld final : public World {
 public:
  MpiWorld(int& argc, char**& argv) {
    int provided = 0;
    if (MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS)
      throw Error(ErrorCode::internal, "MPI_Init_thread failed");
    comm_ = std::make_unique<dist::MpiCommunicator>(MPI_COMM_WORLD);
  }
  ~MpiWorld() override {
    comm_.reset();
    MPI_Finalize();
  }
  dist::Communicator& comm() override { return *comm_; }
  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code);
  }

 private:
  std::unique_ptr<dist::MpiCommunicator> comm_;
};

}  // namespace

std::unique_ptr<World> open_world(int& argc, char**& argv) {
  if (launched_by_mpi()) return std::make_unique<MpiWorld>(argc, argv);
  return std::make_unique<SingleRankWorld>();
}

bool built_with_mpi() {
  return true;
}

}  // namespace attnops::cli
