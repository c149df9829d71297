// The fuzzer's random numbers: SplitMix64 streams keyed by (seed, case, stream), so that one case
// is drawn from SEED:CASE alone, whatever ran before it (replay), and a change to how one part of
// a case is drawn (say the paged batch) does not move the others.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

namespace attnops::verify {

class Rng {
 public:
  explicit Rng(std::uint64_t state) : s_(state) {}
  // Independent streams of one case: the dense problem, its values, the paged batch, ...
  static Rng for_case(std::uint64_t seed, std::uint64_t case_index, std::uint64_t stream) {
    Rng r(seed * 0x9E3779B97F4A7C15ull ^ (case_index + 0x632BE59BD9B4E019ull));
    r.s_ ^= r.next() + stream * 0xD6E8FEB86659FD93ull;
    r.next();
    return r;
  }

  std::uint64_t next() {
    std::uint64_t z = (s_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1).
  double real() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double real(double lo, double hi) { return lo + (hi - lo) * real(); }
  // Uniform integer in [lo, hi] (hi >= lo).
  std::int64_t uniform(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    return lo + static_cast<std::int64_t>(span == 0 ? next() : next() % span);
  }
  // Log-uniform integer in [lo, hi] (lo >= 1): small values as often as large ones per octave.
  std::int64_t log_uniform(std::int64_t lo, std::int64_t hi) {
    const double a = std::log(static_cast<double>(lo)), b = std::log(static_cast<double>(hi) + 1);
    const auto x = static_cast<std::int64_t>(std::exp(real(a, b)));
    return x < lo ? lo : (x > hi ? hi : x);
  }
  bool chance(double p) { return real() < p; }
  template <class T>
  const T& pick(const std::vector<T>& v) {
    return v[static_cast<std::size_t>(uniform(0, static_cast<std::int64_t>(v.size()) - 1))];
  }

 private:
  std::uint64_t s_;
};

// Stream ids of Rng::for_case.
enum Stream : std::uint64_t {
  kStreamDense = 1,
  kStreamDenseValues = 2,
  kStreamPaged = 3,
  kStreamPagedValues = 4,
  kStreamDist = 5,
  kStreamSchedule = 6,
  kStreamPagedKv8 = 7,
  kStreamPagedKv8Values = 8,
};

}  // namespace attnops::verify
