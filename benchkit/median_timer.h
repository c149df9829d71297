// Call timing for the benchmarks and the demo. The demo's (median_call_time): one untimed warm-up call
// (thread pool, block maps, pipelines), then the median of several timed calls. A single timed call on a
// machine with anything else running shows the scheduler's time slices (a 0.08 ms decode measured as 16 ms
// when a worker thread waits for a descheduled one); the median of several calls does not.
#pragma once

#include <algorithm>
#include <chrono>
#include <vector>

namespace attnops::benchkit {

struct CallTimes {
  double median_ms = 0;
  int calls = 0;  // timed calls (the warm-up excluded)
};

// Calls `call()` once untimed, then times it min_calls times, and more (up to max_calls) while
// the timed calls have taken less than budget_ms in all. Clock: a std::chrono clock (tests give
// a scripted one).
template <class Clock = std::chrono::steady_clock, class Call>
CallTimes median_call_time(Call&& call, int min_calls = 5, int max_calls = 25, double budget_ms = 200) {
  call();  // warm-up
  std::vector<double> ms;
  double total = 0;
  while (static_cast<int>(ms.size()) < max_calls &&
         (static_cast<int>(ms.size()) < min_calls || total < budget_ms)) {
    const auto t0 = Clock::now();
    call();
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
    total += ms.back();
  }
  std::sort(ms.begin(), ms.end());
  const std::size_t n = ms.size();
  return {n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2, static_cast<int>(n)};
}

// One sample of `attnops bench` (rows and serving rows): the mean time per call, in ms, of
// `call()` repeated until the sample has lasted >= min_ms (at most max_calls calls), so that short
// calls are not rounded to the scheduler's time slice on a busy machine.
template <class Clock = std::chrono::steady_clock, class Call>
double mean_call_ms(Call&& call, double min_ms = 20, int max_calls = 1000) {
  const auto t0 = Clock::now();
  int calls = 0;
  double total = 0;
  do {
    call();
    ++calls;
    total = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  } while (total < min_ms && calls < max_calls);
  return total / calls;
}

// The bench's median of its samples (the upper middle one for an even count; never empty).
inline double median_of(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace attnops::benchkit
