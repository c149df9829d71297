// How many threads a CPU call runs on: the caller's (num_threads, else OMP_NUM_THREADS / OpenMP's
// default), fewer for a call whose work is too small to pay for waking a thread (baseline code).
//
// Measured on a 2-core AMD EPYC (Zen 5, shared with compilers): waking a pool worker costs
// 10-50 us quiet and up to a scheduler slice when the cores are busy, and one thread does about
// 20 GFLOP/s on the smallest prefills and streams about 20 GB/s of K/V in decode. A second thread
// gained nothing below ~0.05-0.1 ms of one-thread work (decode Tk <= 256 at H8 D64, prefill
// T <= 64 at H8 D64), so each thread must get at least that much: kMinDecodeBytesPerThread of
// K/V read, kMinFlopsPerThread of q.k and p.v arithmetic.
#pragma once

#include <cstdint>
#include <string>

#include "attnops/problem.h"

namespace attnops::cpu {

inline constexpr double kMinDecodeBytesPerThread = 1 << 20;  // 1 MiB of K and V per thread
inline constexpr double kMinFlopsPerThread = 2e6;            // 2 MFLOP per thread

struct CallThreads {
  int threads = 1;     // what the call runs on
  int requested = 1;   // what num_threads / OpenMP asked for
  std::string detail;  // empty, or why fewer threads ran ("threads 1 of 2: small call, ...")
};

// decode: the call takes the vanilla decode path (its work is the K/V it reads). small_call_rule
// false: the thread count asked for, whatever the size (the entry points with an explicit tier or
// plan, which the kernel tests call to run tiny shapes on several threads).
CallThreads call_threads(const AttentionProblem& p, bool decode, bool small_call_rule = true);

}  // namespace attnops::cpu
