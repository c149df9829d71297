// A build without MPI: every distributed command runs on one rank in this process.
#include "cli/dist/world.h"

namespace attnops::cli {

std::unique_ptr<World> open_world(int&, char**&) {
  return std::make_unique<SingleRankWorld>();
}

bool built_with_mpi() {
  return false;
}

}  // namespace attnops::cli
