// oneDNN's matmul as the benchmarks' compute ceiling, beside Eigen's SGEMM (sgemm.h): the best
// GEMM a library gives on this machine (AMX tiles for bf16 on Xeons that have them, AVX-512 or
// AVX2 FMA for f32), measured in the same run as the attention rows, same thread count.
//
// The library is optional: libdnnl.so.2 (Debian's libdnnl2, oneDNN 2.x) is opened at run time
// (dlopen), and its C API is compiled in only where the headers were found at build time
// (libdnnl-dev). Neither attnops nor the programs link it; without it the ceiling says why it is
// missing and the benchmarks fall back to Eigen's.
#pragma once

#include <cmath>
#include <memory>
#include <string>

#include "attnops/dtype.h"

namespace attnops::benchkit {

struct GemmCeiling {
  std::string name;  // "onednn_f32", "onednn_bf16"
  DType dtype = DType::f32;
  int n = 0;
  double median_ms = NAN, gflops = NAN;  // 2 n^3 / time
  std::string impl;                      // the implementation oneDNN chose (impl_info_str)
  std::string error;                     // why there is no figure (no library, reference kernel, ...)
  bool ok() const { return error.empty() && std::isfinite(gflops); }
};

// One prepared matmul C = A * B (n x n row-major operands of `dtype`, filled: see below) on
// `threads` threads (0 = OpenMP's default), for the bench binaries' loops; error() says why run()
// would do nothing.
class OnednnMatmul {
 public:
  OnednnMatmul(int n, DType dtype, int threads);
  ~OnednnMatmul();
  OnednnMatmul(const OnednnMatmul&) = delete;
  OnednnMatmul& operator=(const OnednnMatmul&) = delete;
  void run();
  const std::string& error() const { return error_; }
  const std::string& impl() const { return impl_; }
  // The largest relative error of 32 entries of C against double dot products (after a run()).
  double check() const;

 private:
  struct State;
  std::unique_ptr<State> s_;
  std::string error_, impl_;
};

// C = A * B with n x n row-major operands of `dtype` (f32 or bf16; C of the same dtype), the
// operands filled with random values before timing (pages never written map the kernel's zero
// page and run from cache: 3-4x too fast). Median over `repeats` samples, each the mean of
// enough calls to last >= 20 ms, after one warm-up call; threads 0 = OpenMP's default (the
// attention rows' count, backends/common/threads.h). Entries of C are checked against double
// dot products of the operands; a mismatch or oneDNN's reference kernel (minutes at 2048^3: a
// CPU without the ISA) gives no figure.
GemmCeiling measure_onednn_matmul(int n, DType dtype, int repeats, int threads);

// "oneDNN 2.6.3 (libdnnl.so.2)" or why it cannot be used.
std::string onednn_version();

}  // namespace attnops::benchkit
