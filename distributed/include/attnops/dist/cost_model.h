// A cost model of the ring, calibrated from measurements (attnops bench --distributed), that
// projects its efficiency to other rank counts and interconnects.
//
// Per ring step a rank computes while the next keys travel, so the step takes
//     t_step = max(t_compute, alpha + bytes / bandwidth)
// with, for Tl tokens per rank (B batch, Hq / Hkv heads, head dims D / Dv, e bytes per element):
//     t_compute = pairs * B * Hq * 2 (D + Dv) / F   (x 2.5 for the backward's FLOPs)
//     pairs     = Tl^2 / 2 causal (zigzag: every step the same), Tl^2 non-causal
//     bytes     = B * Tl * Hkv * (D + Dv) * e       (the backward adds the fp32 dK/dV: + 4 per element)
// F is one rank's attention rate, alpha and bandwidth the link's latency and throughput. A ring
// of P ranks runs P steps, the last without a message, so
//     t_ring = (P - 1) * max(t_compute, t_comm) + t_compute,   efficiency = P * t_compute / t_ring
// (the fraction of the ideal P-fold speed-up; per-rank compute itself is taken to scale, which the
// zigzag layout makes true for causal attention). Communication is hidden once t_compute >=
// t_comm, i.e. from Tl_min = (b + sqrt(b^2 + 4 a alpha)) / (2 a) tokens per rank, with a * Tl^2
// the compute time and b * Tl the transfer time of one step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace attnops::dist {

struct Link {
  std::string name;
  double latency_us = 0;      // one message's fixed cost
  double bandwidth_GBps = 0;  // sustained, one direction
  bool measured = false;      // from this machine (else a typical figure, see standard_links)
};

// Shared memory as measured (ping-pong), then typical figures for 25 GbE (TCP: 2.9 GB/s, 15 us),
// 100 GbE (RoCE: 11.5 GB/s, 5 us) and InfiniBand HDR (200 Gb/s: 23 GB/s, 1.5 us).
std::vector<Link> standard_links(double shm_latency_us, double shm_GBps);

struct RingShape {
  std::int64_t B = 1, Hq = 1, Hkv = 1, D = 64, Dv = 64;
  bool causal = true;
  bool backward = false;        // the backward pass (2.5x the FLOPs, fp32 dK/dV on the wire too)
  std::int64_t elem_bytes = 4;  // K / V storage (runtime dtype)
};

struct StepEstimate {
  double compute_s = 0, comm_s = 0, step_s = 0;
  double bytes = 0, flops = 0;
};

// One step with `tokens` tokens per rank, at `gflops` per rank, over `link`.
StepEstimate ring_step(const RingShape& s, double tokens, double gflops, const Link& link);
// Efficiency of a P-rank ring with `tokens` tokens per rank (see above).
double ring_efficiency(const RingShape& s, int P, double tokens, double gflops, const Link& link);
// The smallest tokens per rank for which a step's compute hides its communication.
double min_tokens_to_hide(const RingShape& s, double gflops, const Link& link);

}  // namespace attnops::dist
