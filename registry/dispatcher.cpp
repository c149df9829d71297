#include "registry/dispatcher.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>

#include "attnops/error.h"
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

namespace {

// The gates every candidate passes first, forward or backward: the config, then the host.
std::optional<Reason> check_host(const OperationImpl& op, Backend b, const Host& host) {
  const auto& md = op.metadata();
  const std::string bn(backend_name(b));
  if (std::find(md.disabled_backends.begin(), md.disabled_backends.end(), b) != md.disabled_backends.end())
    return Reason{ReasonCode::disabled_by_config, bn + ": disabled by config (disabled_backends)"};
  if (Availability a = host.availability(b, md.gpu); !a.available)
    return Reason{ReasonCode::backend_unavailable, bn + ": " + a.detail};
  return std::nullopt;
}

std::optional<Reason> prefixed(std::optional<Reason> r, Backend b) {
  if (r) r->detail = std::string(backend_name(b)) + ": " + r->detail;
  return r;
}

}  // namespace

std::optional<Reason> check_backend(const OperationImpl& op, Backend b, const AttentionProblem& p,
                                    const Host& host) {
  if (auto r = check_host(op, b, host)) return r;
  const std::string bn(backend_name(b));
  if (!op.implements(b))
    return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no forward_" + bn};
  return prefixed(op.check_inputs(b, p), b);
}

std::optional<Reason> check_backward_backend(const OperationImpl& op, Backend b, const BackwardProblem& p,
                                             const Host& host) {
  if (auto r = check_host(op, b, host)) return r;
  const std::string bn(backend_name(b));
  if (!op.implements_backward(b))
    return Reason{ReasonCode::not_implemented, bn + ": " + op.name() + " has no backward_" + bn};
  return prefixed(op.check_backward_inputs(b, p), b);
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

std::vector<Backend> candidates_for(const OperationImpl& op, const RuntimeFlags& flags, DispatchDecision& d) {
  if (!flags.force_native) return backend_candidates(op.metadata());
  d.reasons.push_back({ReasonCode::forced_native, "ATTNOPS_FORCE_NATIVE is set"});
  return {Backend::native};
}

// Step 3's walk and step 4: `check(b)` gates a candidate, `run(b)` runs it (nullptr: plan only).
template <class Result, class Check, class Run>
Result first_candidate(const OperationImpl& op, const std::vector<Backend>& candidates, DispatchDecision& d,
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
      out.decision = d;
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

}  // namespace

AttentionOutput dispatch(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const AttentionOptions& options, const RuntimeFlags& flags, bool execute) {
  // The problem is built with the requested operator's metadata: scale, runtime dtype and thread
  // count are shared settings; block sizes matter only to the tiled operators.
  const AttentionProblem p = make_problem(q, k, v, options, requested.metadata());
  DispatchDecision d;
  OperationImpl& op = choose_operator(requested, vanilla, p, d);
  if (p.want_weights && !op.returns_weights())
    throw Error(ErrorCode::invalid_argument,
                "return_weights: only vanilla returns attention weights, and this call "
                "runs '" +
                    op.name() + "' (use the vanilla operator)");
  const std::vector<Backend> candidates = candidates_for(op, flags, d);
  return first_candidate<AttentionOutput>(
      op, candidates, d, flags, [&](Backend b) { return check_backend(op, b, p, host); },
      [&](Backend b) { return op.forward(b, p); }, execute);
}

AttentionGradients dispatch_backward(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse, const TensorView& dout,
                                     const AttentionOptions& options, const RuntimeFlags& flags) {
  const BackwardProblem p = make_backward_problem(q, k, v, out, lse, dout, options, requested.metadata());
  DispatchDecision d;
  d.pass = Pass::backward;
  OperationImpl& op = choose_operator(requested, vanilla, p.fwd, d);
  const std::vector<Backend> candidates = candidates_for(op, flags, d);
  return first_candidate<AttentionGradients>(
      op, candidates, d, flags, [&](Backend b) { return check_backward_backend(op, b, p, host); },
      [&](Backend b) { return op.backward(b, p); }, /*execute=*/true);
}

}  // namespace attnops
