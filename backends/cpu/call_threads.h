// How many threads a CPU call runs on: the caller's (num_threads, else OMP_NUM_THREADS / OpenMP's
// default), fewer for a call whose work is too small to pay for waking a thread (baseline code).
//
// Measured on a 2-core AMD EPYC (Zen 5, shared with compilers): waking a pool worker costs
// 10-50 us quiet and up to a scheduler slice when the cores are busy, and one thread does about
// 20 GFLOP/s on the smallest prefills and streams about 20 GB/s of K/V in decode. A second thread
// gained nothing below ~0.05-0.1 ms of one-thread work (decode Tk <= 256 at H8 D64, prefill
// T <= 64 at H8 D64), so each thread must get at least that much: kMinDecodeBytesPerThread of
// K/V read, kMinFlopsPerThread of q.k and p.v arithmetic. Decode measured again on a quieter
// machine with the work pool (2026-11-25, f32 H8 D64, medians of 15, 1 -> 2 threads): 2 MiB of
// K/V 0.044 -> 0.044-0.048 ms, 4 MiB 0.083 -> 0.076-0.079, 8 MiB 0.164 -> 0.143-0.147; and
// with one busy process the 2 MiB call took 0.057 ms on 2 threads, 0.041 on 1. So 2 MiB per
// thread.
#pragma once

#include <cstdint>
#include <string>

#include "attnops/ext/problem.h"

namespace attnops::cpu {

inline constexpr double kMinDecodeBytesPerThread = 2 << 20;  // 2 MiB of K and V per thread
inline constexpr double kMinFlopsPerThread = 2e6;            // 2 MFLOP per thread

struct CallThreads {
  int threads = 1;    // what the call runs on
  int requested = 1;  // what num_threads / OpenMP asked for
  // Empty, or why fewer threads ran ("threads 1 of 2: small call, ..."). A fixed buffer, not a
  // std::string: a decode step is exactly the small call that says this, and a warm call must
  // not allocate (the caller appends it to the kernel detail, whose capacity is reused).
  char detail[160] = {};
  bool has_detail() const { return detail[0] != '\0'; }
};

// decode: the call takes the vanilla decode path (its work is the K/V it reads). small_call_rule
// false: the thread count asked for, whatever the size (the entry points with an explicit tier or
// plan, which the kernel tests call to run tiny shapes on several threads).
CallThreads call_threads(const AttentionProblem& p, bool decode, bool small_call_rule = true);

}  // namespace attnops::cpu
