#include "registry/dispatcher.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "attnops/cost.h"
#include "attnops/environment.h"
#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "core/printable.h"
#include "operators/gates.h"

namespace attnops {

RuntimeFlags RuntimeFlags::from_env() {
  const EnvironmentSettings& e = environment();  // read once per process (attnops/environment.h)
  RuntimeFlags f;
  f.force_native = e.forced_native();
  f.log_dispatch = e.log_dispatch;
  return f;
}

Preference preference(const OperationMetadata& md, const std::optional<std::vector<Backend>>& call) {
  if (!call) return Preference{&md.backends, false};
  for (Backend b : *call)
    if (static_cast<unsigned>(b) > static_cast<unsigned>(Backend::tpu))
      throw Error(ErrorCode::invalid_argument, "backends: " + std::to_string(static_cast<int>(b)) +
                                                   " is not a backend (expected native, cpu, gpu or tpu)");
  return Preference{&*call, true};
}

bool Preference::names(Backend b) const {
  return std::find(list->begin(), list->end(), b) != list->end();
}

BackendList backend_candidates(const Preference& pref) {
  BackendList order;
  for (Backend b : *pref.list) order.add(b);
  for (Backend b : {Backend::gpu, Backend::cpu, Backend::native}) order.add(b);  // the auto order
  return order;
}

namespace {

// The gates every candidate passes first, forward or backward: the config, then the host.
std::optional<Reason> check_host(const OperationImpl& op, Backend b, const Host& host,
                                 const Preference& pref) {
  const auto& md = op.metadata();
  const std::string bn(backend_name(b));
  if (std::find(md.disabled_backends.begin(), md.disabled_backends.end(), b) != md.disabled_backends.end() &&
      !(pref.per_call && pref.names(b)))
    return Reason{ReasonCode::disabled_by_config, bn + ": disabled by config (disabled_backends)"};
  if (!host.is_available(b, md.gpu))
    return Reason{ReasonCode::backend_unavailable, bn + ": " + host.availability(b, md.gpu).detail};
  return std::nullopt;
}

std::optional<Reason> prefixed(std::optional<Reason> r, Backend b) {
  if (r) r->detail = std::string(backend_name(b)) + ": " + r->detail;
  return r;
}

}  // namespace

std::optional<Reason> check_backend(const OperationImpl& op, Backend b, const AttentionProblem& p,
                                    const Host& host, const Preference& pref) {
  if (auto r = check_host(op, b, host, pref)) return r;
  const std::string bn(backend_name(b));
  if (!op.implements(b))
    return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no forward_" + bn};
  return prefixed(op.check_inputs(b, p), b);
}

std::optional<Reason> check_backward_backend(const OperationImpl& op, Backend b, const BackwardProblem& p,
                                             const Host& host, const Preference& pref) {
  if (auto r = check_host(op, b, host, pref)) return r;
  const std::string bn(backend_name(b));
  if (!op.implements_backward(b))
    return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no backward_" + bn};
  return prefixed(op.check_backward_inputs(b, p), b);
}

std::optional<Reason> check_paged_backend(const OperationImpl& op, Backend b, const PagedProblem& p,
                                          const Host& host, const Preference& pref) {
  if (auto r = check_host(op, b, host, pref)) return r;
  const std::string bn(backend_name(b));
  if (!op.implements_paged(b))
    return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no paged_" + bn};
  return prefixed(op.check_paged_inputs(b, p), b);
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

// What auto's cost rule weighs for one call: its FLOPs and the bytes it moves each way.
struct CallSize {
  double flops = 0, up = 0, down = 0;
};

double visible_pairs(const AttentionProblem& p) {
  return p.Tq > 0 && p.Tk > 0
             ? get_block_map(p.mask, p.Hq, p.Tq, p.Tk, p.blocksize_q, p.blocksize_k)->visible_pairs_per_head()
             : 0.0;
}

// The forward: q, k, v (and bias) up, the output (and lse) down.
CallSize forward_size(const AttentionProblem& p) {
  const double es = static_cast<double>(dtype_size(p.dtype));
  CallSize c;
  c.flops = attention_flops(p, visible_pairs(p));
  c.up = es * static_cast<double>(p.B * (p.Tq * p.Hq * p.D + p.Tk * p.Hkv * (p.D + p.Dv))) +
         (p.bias ? 4.0 * static_cast<double>(p.Tq * p.Tk) : 0.0);
  c.down = 4.0 * static_cast<double>(p.B * p.Tq * p.Hq * p.Dv) +
           (p.want_lse ? 4.0 * static_cast<double>(p.B * p.Hq * p.Tq) : 0);
  return c;
}

// The backward: its FLOPs (2.5 times the forward's, backward_flops); q, k, v, out, dout, lse (and
// bias) up; dq, dk, dv (f32 on the device) and dbias down.
CallSize backward_size(const BackwardProblem& bp) {
  const AttentionProblem& p = bp.fwd;
  const double es = static_cast<double>(dtype_size(p.dtype));
  const auto n = [](std::int64_t x) { return static_cast<double>(x); };
  CallSize c;
  c.flops = backward_flops(p, visible_pairs(p));
  c.up = es * n(p.B * (p.Tq * p.Hq * (p.D + 2 * p.Dv) + p.Tk * p.Hkv * (p.D + p.Dv))) +
         4.0 * n(p.B * p.Hq * p.Tq) + (p.bias ? 4.0 * n(p.Tq * p.Tk) : 0.0);
  c.down = 4.0 * n(p.B * (p.Tq * p.Hq * p.D + p.Tk * p.Hkv * (p.D + p.Dv))) +
           4.0 * n(bp.bias_B * bp.bias_H * p.Tq * p.Tk);
  return c;
}

// Auto's cost rule (attnops/cost.h) for the gpu candidate: the estimate, or nullopt when there
// are no rates.
std::optional<CostEstimate> gpu_cost(const OperationImpl& op, const CallSize& size, const Host& host) {
  const GpuSettings& gpu = op.metadata().gpu;
  std::optional<std::pair<CostRates, std::string>> rates;
  if (gpu.cost_rates)
    rates = std::pair{*gpu.cost_rates, std::string("config")};
  else
    rates = host.cost_rates(gpu);
  if (!rates || !rates->first.valid()) return std::nullopt;
  CostEstimate e = estimate_cost(rates->first, size.flops, size.up, size.down);
  e.rates_source = rates->second;
  return e;
}

// The cost rule as a gate of the gpu candidate: applies when the gpu is a candidate of the auto
// order only (not named by the config or --backend), the inputs are on the host, and the cpu,
// later in the order, could run the call instead (`cpu_ok`). Records the estimate in d.cost;
// the reason cpu_faster when the cpu wins.
template <class CpuOk, class Size>
std::optional<Reason> cost_gate(const OperationImpl& op, const BackendList& candidates, const Host& host,
                                const Preference& pref, bool exempt, DispatchDecision& d, CpuOk&& cpu_ok,
                                Size&& size) {
  if (exempt || pref.names(Backend::gpu)) return std::nullopt;
  const auto gpu_at = std::find(candidates.begin(), candidates.end(), Backend::gpu);
  if (std::find(gpu_at, candidates.end(), Backend::cpu) == candidates.end() || !cpu_ok()) return std::nullopt;
  const std::optional<CostEstimate> e = gpu_cost(op, size(), host);
  if (!e) return std::nullopt;
  d.cost = e;
  if (e->cpu_us > e->gpu_us) return std::nullopt;
  return Reason{ReasonCode::cpu_faster, "gpu: estimated " + us(e->gpu_us) + " (call " + us(e->call_us) +
                                            ", upload " + us(e->upload_us) + ", kernels " + us(e->kernel_us) +
                                            ", download " + us(e->download_us) + ") vs cpu " + us(e->cpu_us) +
                                            " (rates: " + e->rates_source + ")"};
}

// Steps 2 and 3's start, shared by both passes: the operator after the fallbacks (recorded in
// d) and the backend candidates in order.
OperationImpl& choose_operator(OperationImpl& requested, OperationImpl& vanilla, const AttentionProblem& p,
                               DispatchDecision& d) {
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
  return *op;
}

BackendList candidates_for(const Preference& pref, const RuntimeFlags& flags, DispatchDecision& d) {
  if (!flags.force_native) return backend_candidates(pref);
  d.reasons.push_back({ReasonCode::forced_native, "ATTNOPS_FORCE_NATIVE is set"});
  return BackendList{Backend::native};
}

// Step 3's walk and step 4: `check(b)` gates a candidate, `run(b)` runs it (nullptr: plan only).
template <class Result, class Check, class Run>
Result first_candidate(const OperationImpl& op, const BackendList& candidates, DispatchDecision& d,
                       const RuntimeFlags& flags, Check&& check, Run&& run, bool execute) {
  for (Backend b : candidates) {
    if (auto r = check(b)) {
      d.reasons.push_back(std::move(*r));
      continue;
    }
    d.backend = b;
    if (!execute) {
      Result planned;
      planned.decision = d;
      return planned;
    }
    try {
      Result out = run(b);
      RunInfo info = std::move(out.decision.run);  // what the backend reported about the run
      out.decision = std::move(d);                 // d is not used again: moved, not copied
      out.decision.run = std::move(info);
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
              "no backend can run " + std::string(d.pass == Pass::backward ? "the backward of '" : "'") +
                  op.name() + "' for this call: " + join_reasons(d.reasons));
}

// The per-call settings a call set, as they took effect in its problem (DispatchDecision::settings).
template <class Options>
CallSettings call_settings(const Options& o, double scale, DType dtype, int num_threads) {
  CallSettings c;
  if (o.softmax_scale) c.softmax_scale = scale;
  if (o.runtime_dtype) c.runtime_dtype = dtype;
  if (o.num_threads) c.num_threads = num_threads;
  c.backends = o.backends;
  return c;
}

// The bytes of the host copies make_problem / make_backward_problem made (RunInfo::bytes_copied).
std::uint64_t owned_bytes(const std::vector<Tensor>& owned) {
  std::uint64_t n = 0;
  for (const Tensor& t : owned) n += t.nbytes();
  return n;
}

}  // namespace

AttentionOutput dispatch(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const AttentionOptions& options, const RuntimeFlags& flags, bool execute) {
  // The problem is built with the requested operator's metadata: scale, runtime dtype and thread
  // count are shared settings; block sizes matter only to the tiled operators.
  const AttentionProblem p = make_problem(q, k, v, options, requested.metadata());
  DispatchDecision d;
  d.settings = call_settings(options, p.scale, p.dtype, p.num_threads);
  OperationImpl& op = choose_operator(requested, vanilla, p, d);
  const Preference pref = preference(op.metadata(), options.backends);
  if (p.want_weights && !op.returns_weights())
    throw Error(ErrorCode::invalid_argument,
                "return_weights: only vanilla returns attention weights, and this call "
                "runs '" +
                    op.name() + "' (use the vanilla operator)");

  // Device-resident inputs: only the gpu reads them. Asking for another backend is an error,
  // never a silent copy.
  const bool device_inputs = p.on_device();
  if (device_inputs) {
    const char* which = q.on_device() ? "q" : k.on_device() ? "k" : "v";
    if (flags.force_native)
      throw Error(ErrorCode::invalid_argument,
                  std::string(which) +
                      " is a device tensor and ATTNOPS_FORCE_NATIVE=1 "
                      "asks for the native backend, which reads host memory only: copy "
                      "the inputs with DeviceTensor::to_host() or unset it");
    if (!pref.list->empty() && pref.list->front() != Backend::gpu)
      throw Error(ErrorCode::invalid_argument,
                  std::string(which) + " is a device tensor and the backend asked for is " +
                      std::string(backend_name(pref.list->front())) +
                      ", which reads host memory only: use the gpu backend or copy the inputs with "
                      "DeviceTensor::to_host()");
  }
  const BackendList candidates = device_inputs ? BackendList{Backend::gpu} : candidates_for(pref, flags, d);

  // The cost rule (cost_gate) never applies to device-resident inputs.
  const auto check = [&](Backend b) -> std::optional<Reason> {
    if (auto r = check_backend(op, b, p, host, pref)) return r;
    if (b != Backend::gpu) return std::nullopt;
    return cost_gate(
        op, candidates, host, pref, device_inputs || flags.force_native, d,
        [&] { return !check_backend(op, Backend::cpu, p, host, pref); }, [&] { return forward_size(p); });
  };
  AttentionOutput out = first_candidate<AttentionOutput>(
      op, candidates, d, flags, check, [&](Backend b) { return op.forward(b, p); }, execute);
  out.decision.run.bytes_copied = owned_bytes(p.owned);
  return out;
}

AttentionGradients dispatch_backward(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse, const TensorView& dout,
                                     const AttentionOptions& options, const RuntimeFlags& flags) {
  // The backward reads host tensors only (no backend has a device-resident backward yet: the gpu
  // backward uploads q, k, v, out and dout like any host input).
  const std::pair<const char*, const TensorView*> args[] = {{"q", &q},     {"k", &k},     {"v", &v},
                                                            {"out", &out}, {"lse", &lse}, {"dout", &dout}};
  for (const auto& [name, t] : args)
    if (t->on_device())
      throw Error(ErrorCode::invalid_argument,
                  std::string(name) +
                      " is a device tensor, and the backward reads host memory only: copy it with "
                      "DeviceTensor::to_host()");
  const BackwardProblem p = make_backward_problem(q, k, v, out, lse, dout, options, requested.metadata());
  DispatchDecision d;
  d.pass = Pass::backward;
  d.settings = call_settings(options, p.fwd.scale, p.fwd.dtype, p.fwd.num_threads);
  OperationImpl& op = choose_operator(requested, vanilla, p.fwd, d);
  const Preference pref = preference(op.metadata(), options.backends);
  const BackendList candidates = candidates_for(pref, flags, d);
  // The same cost rule as the forward's, with the backward's FLOPs and bytes and the same rates
  // (measured on forward kernels: the rule assumes each backend runs its backward at its forward
  // GFLOP/s), so a call the rule sends to the cpu has its backward sent there too.
  const auto check = [&](Backend b) -> std::optional<Reason> {
    if (auto r = check_backward_backend(op, b, p, host, pref)) return r;
    if (b != Backend::gpu) return std::nullopt;
    return cost_gate(
        op, candidates, host, pref, flags.force_native, d,
        [&] { return !check_backward_backend(op, Backend::cpu, p, host, pref); },
        [&] { return backward_size(p); });
  };
  AttentionGradients g = first_candidate<AttentionGradients>(
      op, candidates, d, flags, check, [&](Backend b) { return op.backward(b, p); }, /*execute=*/true);
  g.decision.run.bytes_copied = owned_bytes(p.owned) + owned_bytes(p.fwd.owned);
  return g;
}

AttentionOutput dispatch_paged(OperationImpl& op, const Host& host, const TensorView& q,
                               const PagedKVCache& cache, const PagedPlan& plan,
                               const PagedAttentionOptions& options, const RuntimeFlags& flags,
                               bool execute) {
  bool serves = false;
  for (Backend b : {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu})
    serves = serves || op.implements_paged(b);
  if (!serves)
    throw Error(ErrorCode::not_implemented,
                "'" + op.name() +
                    "' does not serve paged batches: use the ragged_paged operator "
                    "(registry().get(\"ragged_paged\"), alias \"paged\")");
  const PagedProblem p = make_paged_problem(q, cache, plan, options, op.metadata());
  DispatchDecision d;
  d.requested = op.name();
  d.op = op.name();
  d.settings = call_settings(options, p.scale, p.dtype, p.num_threads);
  const Preference pref = preference(op.metadata(), options.backends);

  // Device-resident inputs: only the gpu reads them; anything else is an error, never a copy.
  const bool device_inputs = p.on_device();
  BackendList candidates;
  if (device_inputs) {
    const std::string which = cache.on_device() ? "the cache (k_pages, v_pages)" : "q";
    if (flags.force_native)
      throw Error(ErrorCode::invalid_argument,
                  which +
                      " is device-resident and ATTNOPS_FORCE_NATIVE=1 asks for the "
                      "native backend, which reads host memory only");
    if (!pref.list->empty() && pref.list->front() != Backend::gpu)
      throw Error(ErrorCode::invalid_argument,
                  which + " is device-resident and the backend asked for is " +
                      std::string(backend_name(pref.list->front())) +
                      ", which reads host memory only: use the gpu backend or a host "
                      "cache");
    if (auto r = check_paged_backend(op, Backend::gpu, p, host, pref)) {
      d.reasons.push_back(*r);
      log(flags, d);
      throw Error(
          r->code == ReasonCode::not_implemented ? ErrorCode::not_implemented
                                                 : ErrorCode::backend_unavailable,
          which + " is device-resident, so only the gpu backend can read it, and it cannot run this call (" +
              std::string(reason_code_name(r->code)) + ": " + r->detail +
              "); keep the cache on the host (PagedKVCache::host) for the native and cpu backends");
    }
    candidates = BackendList{Backend::gpu};
  } else {
    candidates = candidates_for(pref, flags, d);
  }
  const auto check = [&](Backend b) { return check_paged_backend(op, b, p, host, pref); };
  return first_candidate<AttentionOutput>(
      op, candidates, d, flags, check, [&](Backend b) { return op.paged(b, p); }, execute);
}

}  // namespace attnops
