// The distributed forms of `attnops run` and `attnops bench` (distributed/README.md):
//
//   mpirun -np P attnops run --op ring|ulysses --q Q.npy --k K.npy --v V.npy --out O.npy ...
//   mpirun -np P attnops bench --distributed [--shapes ...] [--project] ...
//
// main() hands a command line to distributed_main() when is_distributed_command() says so; the
// ordinary run / bench never see it (and never initialise MPI).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

#include "cli/dist/world.h"

namespace attnops::cli {

// `run` with --op ring / ulysses (or their --op=...), or `bench` with --distributed.
bool is_distributed_command(int argc, char** argv);
// Opens the world, parses, runs; returns the exit status (0, or 2 with "error: ..." on stderr
// from rank 0 for errors every rank agrees on; other errors abort the job with status 2).
int distributed_main(int argc, char** argv);

struct DistCommand {
  CLI::App* app = nullptr;
  std::function<int(World&)> action;
};
DistCommand add_dist_run_command(CLI::App& root);
DistCommand add_dist_bench_command(CLI::App& root);

}  // namespace attnops::cli
