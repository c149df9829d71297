// The main() of every bench binary: Google Benchmark's run, then the GPU state released before
// main returns (never from a static destructor: attnops/gpu.h), also after a usage error.
#pragma once

#include <benchmark/benchmark.h>

#include "attnops/gpu.h"

namespace attnops::bench {

// register_all: registers the binary's benchmarks (nullptr: they are registered statically).
inline int benchmark_main(int argc, char** argv, void (*register_all)() = nullptr) {
  if (register_all) register_all();
  benchmark::Initialize(&argc, argv);
  int status = 0;
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) {
    status = 1;
  } else {
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  release_gpu();
  return status;
}

}  // namespace attnops::bench
