// The thread count of one CPU kernel call, in one place: the call's num_threads (already
// clamped by make_problem) or OpenMP's default, never more than max_worker_threads() (an
// OMP_NUM_THREADS of 100000 would otherwise start that many threads, or overflow their stacks).
#pragma once

#include <omp.h>

#include <algorithm>

#include "attnops/ext/problem.h"

namespace attnops {

inline int worker_threads(int requested) {
  const int n = requested > 0 ? requested : omp_get_max_threads();
  return std::clamp(n, 1, max_worker_threads());
}

}  // namespace attnops
