#include "attnops/dist/cost_model.h"

#include <algorithm>
#include <cmath>

namespace attnops::dist {

std::vector<Link> standard_links(double shm_latency_us, double shm_GBps) {
  return {{"shm (measured)", shm_latency_us, shm_GBps, true},
          {"25 GbE", 15.0, 2.9, false},
          {"100 GbE", 5.0, 11.5, false},
          {"InfiniBand HDR", 1.5, 23.0, false}};
}

namespace {
// a: seconds of compute per token^2, b: seconds of transfer per token.
double compute_per_token2(const RingShape& s, double gflops) {
  const double pairs_factor = s.causal ? 0.5 : 1.0;
  const double flops = pairs_factor * static_cast<double>(s.B * s.Hq) * 2.0 *
                       static_cast<double>(s.D + s.Dv) * (s.backward ? 2.5 : 1.0);
  return flops / (gflops * 1e9);
}
double bytes_per_token(const RingShape& s) {
  const double e = static_cast<double>(s.elem_bytes) + (s.backward ? 4.0 : 0.0);
  return static_cast<double>(s.B * s.Hkv * (s.D + s.Dv)) * e;
}
}  // namespace

StepEstimate ring_step(const RingShape& s, double tokens, double gflops, const Link& link) {
  StepEstimate e;
  const double a = compute_per_token2(s, gflops);
  e.compute_s = a * tokens * tokens;
  e.flops = e.compute_s * gflops * 1e9;
  e.bytes = bytes_per_token(s) * tokens;
  e.comm_s = link.latency_us * 1e-6 + e.bytes / (link.bandwidth_GBps * 1e9);
  e.step_s = std::max(e.compute_s, e.comm_s);
  return e;
}

double ring_efficiency(const RingShape& s, int P, double tokens, double gflops, const Link& link) {
  if (P <= 1) return 1.0;
  const StepEstimate e = ring_step(s, tokens, gflops, link);
  const double ring = (P - 1) * e.step_s + e.compute_s;
  return ring > 0 ? P * e.compute_s / ring : 1.0;
}

double min_tokens_to_hide(const RingShape& s, double gflops, const Link& link) {
  const double a = compute_per_token2(s, gflops);
  const double b = bytes_per_token(s) / (link.bandwidth_GBps * 1e9);
  const double alpha = link.latency_us * 1e-6;
  return (b + std::sqrt(b * b + 4 * a * alpha)) / (2 * a);
}

}  // namespace attnops::dist
