// A build without MPI: every distributed command runs on one rank in this process.
#include <cstdlib>

#include "attnops/dist/local_communicator.h"
#include "cli/dist/world.h"

namespace attnops::cli {

namespace {
class SingleRank final : public World {
 public:
  SingleRank() : world_(1), comm_(world_.communicator(0)) {}
  dist::Communicator& comm() override { return *comm_; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 private:
  dist::LocalWorld world_;
  std::unique_ptr<dist::Communicator> comm_;
};
}  // namespace

std::unique_ptr<World> open_world(int&, char**&) {
  return std::make_unique<SingleRank>();
}

bool built_with_mpi() {
  return false;
}

}  // namespace attnops::cli
