// The memory-bound yardstick of the serving benchmarks: a STREAM-like read of a buffer several
// times the last-level cache by every thread of the row, measured in the same run as the rows it
// judges (KV bytes read per second / this).
#pragma once

#include <cstdint>
#include <string>

namespace attnops::benchkit {

struct ReadBandwidth {
  double gbps = 0;                 // the best pass: bytes read / wall time
  double gbps_per_cpu_second = 0;  // the best pass's bytes per second of process CPU time (all
                                   // threads): on a shared machine, the rate over the time the
                                   // threads really ran
  double mib = 0;                  // size of the buffer read
  int threads = 0;
  std::string isa;  // the copy of the loop that ran: avx512f, avx2 or default
};

// Reads (sums) a float buffer with `threads` OpenMP threads (0 = the rows' default), each reading
// the contiguous share it wrote first (its pages touched before the timing); the best of `passes`
// passes after one warm-up. The loop is vectorised for the widest ISA the CPU runs (avx512f, avx2
// or the default), with independent accumulators so that it is bound by memory, not by the adds.
// mib > 0: a buffer of that many MiB; 0: read_buffer_bytes's rule.
ReadBandwidth measure_read_bandwidth(int threads, int passes, int mib = 0);

// The buffer size rule: `requested_mib` MiB when > 0; else max(256 MiB, 4 x the last-level
// cache), so that no pass is served from the caches. Either is bounded by half of the available
// memory (when known: > 0) and is at least 1 MiB; whole MiB.
std::uint64_t read_buffer_bytes(std::uint64_t llc_bytes, std::uint64_t available_bytes, int requested_mib);

// The last-level cache of the machine in bytes: the highest-level data or unified cache under
// `sysfs_cpu` (/sys/devices/system/cpu), summed over its distinct instances (shared_cpu_list), e.g.
// one 32 MiB L3 per core complex. 0 when unknown.
std::uint64_t last_level_cache_bytes(const std::string& sysfs_cpu = "/sys/devices/system/cpu");
// MemAvailable from /proc/meminfo in bytes (0 when unknown).
std::uint64_t available_memory_bytes();

// One pass of the read loop over x[0, n) by `threads` threads (0 = OpenMP's default): the sum of
// the elements, each read exactly once. Exposed for the tests.
double read_pass(const float* x, std::int64_t n, int threads);

}  // namespace attnops::benchkit
