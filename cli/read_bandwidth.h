// The memory-bound yardstick of the serving benchmarks: a streaming read of a large array by every
// thread, measured in the same run as the rows it judges (KV bytes read per second / this).
#pragma once

namespace attnops::cli {

struct ReadBandwidth {
  double gbps = 0;                 // median over the repeats
  double gbps_per_cpu_second = 0;  // bytes per second of process CPU time (all threads), median: on a
                                   // shared machine, the rate over the time the threads really ran
  double mib = 0;                  // size of the array read
  int threads = 0;
};

// Sums a float array of `mib` MiB (512 by default: far beyond the caches) with `threads` OpenMP
// threads (0 = OpenMP's default), each reading the contiguous share it first touched; the median
// of `repeats` passes after one warm-up.
ReadBandwidth measure_read_bandwidth(int threads, int repeats, int mib = 512);

}  // namespace attnops::cli
