#include "registry/dispatcher.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "attnops/error.h"
#include "attnops/cost.h"
#include "backends/common/block_map_impl.h"
#include "operators/gates.h"

namespace attnops {

RuntimeFlags RuntimeFlags::from_env() {
  RuntimeFlags f;
  if (const char* s = std::getenv("ATTNOPS_FORCE_NATIVE"))
    f.force_native = *s != '\0' && std::strcmp(s, "0") != 0 && std::strcmp(s, "false") != 0;
  if (const char* s = std::getenv("ATTNOPS_LOG")) {
    std::string v = std::string(",") + s + ",";
    f.log_dispatch = v.find(",dispatch,") != std::string::npos || v.find(",all,") != std::string::npos;
  }
  return f;
}

std::vector<Backend> backend_candidates(const OperationMetadata& md) {
  std::vector<Backend> order;
  auto add = [&](Backend b) {
    if (std::find(order.begin(), order.end(), b) == order.end()) order.push_back(b);
  };
  for (Backend b : md.backends) add(b);
  for (Backend b : {Backend::gpu, Backend::cpu, Backend::native}) add(b);  // the auto order
  return order;
}

std::optional<Reason> check_backend(const OperationImpl& op, Backend b, const AttentionProblem& p, const Host& host) {
  const auto& md = op.metadata();
  const std::string bn(backend_name(b));
  if (std::find(md.disabled_backends.begin(), md.disabled_backends.end(), b) != md.disabled_backends.end())
    return Reason{ReasonCode::disabled_by_config, bn + ": disabled by config (disabled_backends)"};
  if (Availability a = host.availability(b, md.gpu); !a.available)
    return Reason{ReasonCode::backend_unavailable, bn + ": " + a.detail};
  if (!op.implements(b)) return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no forward_" + bn};
  if (auto r = op.check_inputs(b, p)) {
    r->detail = bn + ": " + r->detail;
    return r;
  }
  return std::nullopt;
}

namespace {

std::string join_reasons(const std::vector<Reason>& reasons) {
  std::string s;
  for (const auto& r : reasons) {
    if (!s.empty()) s += "; ";
    s += reason_code_name(r.code);
    s += ": ";
    s += r.detail;
  }
  return s;
}

void log(const RuntimeFlags& flags, const DispatchDecision& d) {
  if (flags.log_dispatch) std::cerr << d.to_log_line() << std::endl;
}

std::string us(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.0f us", v);
  return b;
}

// Auto's cost rule (attnops/cost.h) for the gpu candidate: the estimate, or nullopt when there
// are no rates. Bytes: q, k, v (and bias) up, the output (and lse) down.
std::optional<CostEstimate> gpu_cost(const OperationImpl& op, const AttentionProblem& p, const Host& host) {
  const GpuSettings& gpu = op.metadata().gpu;
  std::optional<std::pair<CostRates, std::string>> rates;
  if (gpu.cost_rates)
    rates = std::pair{*gpu.cost_rates, std::string("config")};
  else
    rates = host.cost_rates(gpu);
  if (!rates || !rates->first.valid()) return std::nullopt;
  const double es = static_cast<double>(dtype_size(p.dtype));
  const double up = es * static_cast<double>(p.B * (p.Tq * p.Hq * p.D + p.Tk * p.Hkv * (p.D + p.Dv))) +
                    (p.bias ? 4.0 * static_cast<double>(p.Tq * p.Tk) : 0.0);
  const double down =
      4.0 * static_cast<double>(p.B * p.Tq * p.Hq * p.Dv) + (p.want_lse ? 4.0 * static_cast<double>(p.B * p.Hq * p.Tq) : 0);
  const double pairs =
      p.Tq > 0 && p.Tk > 0
          ? get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k)->visible_pairs_per_head()
          : 0.0;
  CostEstimate e = estimate_cost(rates->first, attention_flops(p, pairs), up, down);
  e.rates_source = rates->second;
  return e;
}

}  // namespace

AttentionOutput dispatch(OperationImpl& requested, OperationImpl& vanilla, const Host& host, const TensorView& q,
                         const TensorView& k, const TensorView& v, const AttentionOptions& options,
                         const RuntimeFlags& flags, bool execute) {
  // The problem is built with the requested operator's metadata: scale, runtime dtype and thread
  // count are shared settings; block sizes matter only to the tiled operators.
  const AttentionProblem p = make_problem(q, k, v, options, requested.metadata());
  DispatchDecision d;
  d.requested = requested.name();
  OperationImpl* op = &requested;
  if (&requested != &vanilla) {
    auto fallbacks = gates::fallback_reasons(requested.metadata().fallbacks, p);
    if (!fallbacks.empty()) {
      op = &vanilla;
      d.reasons = std::move(fallbacks);
    }
  }
  d.op = op->name();
  if (p.want_weights && !op->returns_weights())
    throw Error(ErrorCode::invalid_argument, "return_weights: only vanilla returns attention weights, and this call "
                                             "runs '" + op->name() + "' (use the vanilla operator)");

  // Device-resident inputs: only the gpu reads them. Asking for another backend is an error,
  // never a silent copy.
  const bool device_inputs = p.on_device();
  const auto& md = op->metadata();
  if (device_inputs) {
    const char* which = q.on_device() ? "q" : k.on_device() ? "k" : "v";
    if (flags.force_native)
      throw Error(ErrorCode::invalid_argument, std::string(which) + " is a device tensor and ATTNOPS_FORCE_NATIVE=1 "
                                               "asks for the native backend, which reads host memory only: copy "
                                               "the inputs with DeviceTensor::to_host() or unset it");
    if (!md.backends.empty() && md.backends.front() != Backend::gpu)
      throw Error(ErrorCode::invalid_argument,
                  std::string(which) + " is a device tensor and the backend asked for is " +
                      std::string(backend_name(md.backends.front())) +
                      ", which reads host memory only: use the gpu backend or copy the inputs with "
                      "DeviceTensor::to_host()");
  }

  std::vector<Backend> candidates;
  if (device_inputs) {
    candidates = {Backend::gpu};
  } else if (flags.force_native) {
    candidates = {Backend::native};
    d.reasons.push_back({ReasonCode::forced_native, "ATTNOPS_FORCE_NATIVE is set"});
  } else {
    candidates = backend_candidates(op->metadata());
  }
  // The cost rule applies when the gpu is a candidate of the auto order only (not named by the
  // config or --backend) and the inputs are on the host.
  const bool gpu_named = std::find(md.backends.begin(), md.backends.end(), Backend::gpu) != md.backends.end();
  for (std::size_t ci = 0; ci < candidates.size(); ++ci) {
    const Backend b = candidates[ci];
    if (auto r = check_backend(*op, b, p, host)) {
      d.reasons.push_back(std::move(*r));
      continue;
    }
    if (b == Backend::gpu && !gpu_named && !device_inputs && !flags.force_native &&
        std::find(candidates.begin() + static_cast<std::ptrdiff_t>(ci), candidates.end(), Backend::cpu) !=
            candidates.end() &&
        !check_backend(*op, Backend::cpu, p, host)) {
      if (auto e = gpu_cost(*op, p, host)) {
        d.cost = e;
        if (e->cpu_us <= e->gpu_us) {
          d.reasons.push_back({ReasonCode::cpu_faster,
                               "gpu: estimated " + us(e->gpu_us) + " (call " + us(e->call_us) + ", upload " +
                                   us(e->upload_us) + ", kernels " + us(e->kernel_us) + ", download " +
                                   us(e->download_us) + ") vs cpu " + us(e->cpu_us) + " (rates: " + e->rates_source +
                                   ")"});
          continue;
        }
      }
    }
    d.backend = b;
    if (!execute) {
      AttentionOutput planned;
      planned.decision = d;
      return planned;
    }
    try {
      AttentionOutput out = op->forward(b, p);
      RunInfo run = std::move(out.decision.run);  // what the backend reported about the run
      out.decision = d;
      out.decision.run = std::move(run);
      log(flags, out.decision);
      return out;
    } catch (const Error& e) {
      // A GPU that fails at run time is not fatal: record it and let the next backend run.
      if (e.code() != ErrorCode::gpu_error) throw;
      d.reasons.push_back({ReasonCode::gpu_error, std::string(backend_name(b)) + ": " + e.what()});
    }
  }
  log(flags, d);
  throw Error(ErrorCode::backend_unavailable,
              "no backend can run '" + op->name() + "' for this call: " + join_reasons(d.reasons));
}

}  // namespace attnops
