// The exactness matrix (dist_check.h) over MPI: CTest runs this under mpirun with 1 to 4 ranks
// (tests/dist/CMakeLists.txt). Every rank runs every case for ring and ulysses and reports its
// failures; the exit status is non-zero on a rank that failed (mpirun then fails).
#include <mpi.h>

#include <cstdio>
#include <exception>
#include <string>

#include "attnops/dist/mpi_communicator.h"
#include "attnops/gpu.h"
#include "tests/dist/dist_check.h"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  int failures = 0, rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  try {
    attnops::dist::MpiCommunicator comm(MPI_COMM_WORLD);
    if (rank == 0) std::printf("transport: %s\n", comm.describe().c_str());
    for (const char* op : {"ring", "ulysses"}) {
      for (const auto& c : attnops::dist::testing::matrix(size)) {
        const auto r = attnops::dist::testing::check_case(comm, op, c);
        if (!r.ok) {
          ++failures;
          std::fprintf(stderr, "FAILED %s\n", r.message.c_str());
        } else if (rank == 0) {
          std::printf("ok %s %s (%d ranks)\n", op, c.name.c_str(), size);
        }
      }
    }
  } catch (const std::exception& e) {
    // A rank that stops here would leave the others waiting: abort the job.
    std::fprintf(stderr, "rank %d: error: %s\n", rank, e.what());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  attnops::release_gpu();
  MPI_Finalize();
  return failures == 0 ? 0 : 1;
}
