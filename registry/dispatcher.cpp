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

  std::vector<Backend> candidates;
  if (flags.force_native) {
    candidates = {Backend::native};
    d.reasons.push_back({ReasonCode::forced_native, "ATTNOPS_FORCE_NATIVE is set"});
  } else {
    candidates = backend_candidates(op->metadata());
  }
  for (Backend b : candidates) {
    if (auto r = check_backend(*op, b, p, host)) {
      d.reasons.push_back(std::move(*r));
      continue;
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
