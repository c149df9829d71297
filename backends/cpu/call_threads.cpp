// The small-call thread threshold (see call_threads.h for the measurements behind it).
#include "backends/cpu/call_threads.h"

#include <algorithm>
#include <cstdio>

#include "attnops/ext/problem.h"
#include "backends/common/threads.h"

namespace attnops::cpu {

CallThreads call_threads(const AttentionProblem& p, bool decode, bool small_call_rule) {
  CallThreads c;
  c.requested = worker_threads(p.num_threads);
  c.threads = c.requested;
  if (c.requested <= 1 || !small_call_rule) return c;
  const double B = static_cast<double>(p.B), Tk = static_cast<double>(p.Tk);
  // Decode reads all of K and V once; elsewhere 2 * (D + Dv) flops per (q, k) pair (an upper
  // bound: masks make it less, so a masked call gets at most as many threads as a dense one).
  const double work = decode ? B * Tk * static_cast<double>(p.Hkv) * static_cast<double>(p.D + p.Dv) *
                                   static_cast<double>(dtype_size(p.dtype))
                             : 2.0 * B * static_cast<double>(p.Hq) * static_cast<double>(p.Tq) * Tk *
                                   static_cast<double>(p.D + p.Dv);
  const double per_thread = decode ? kMinDecodeBytesPerThread : kMinFlopsPerThread;
  const double fit = std::max(1.0, work / per_thread);
  if (fit >= c.requested) return c;
  c.threads = static_cast<int>(fit);
  std::snprintf(c.detail, sizeof c.detail,
                "threads %d of %d: small call (%.2f %s, %.0f %s per thread at least)", c.threads, c.requested,
                work / (decode ? 1048576.0 : 1e6), decode ? "MiB of K/V" : "MFLOP",
                per_thread / (decode ? 1048576.0 : 1e6), decode ? "MiB" : "MFLOP");
  return c;
}

}  // namespace attnops::cpu
