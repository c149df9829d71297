// Gates: small named checks in the style of PyTorch SDPA's check_* functions. Each returns the
// reason a call cannot take a path, or nullopt. The dispatcher runs them in order and records
// every reason in the DispatchDecision.
#pragma once

#include <optional>
#include <vector>

#include "attnops/decision.h"
#include "attnops/ext/problem.h"
#include "attnops/metadata.h"

namespace attnops::gates {

// Operator-level fallbacks to vanilla (each only when enabled in the policy).
std::optional<Reason> check_decode(const FallbackPolicy& f, const AttentionProblem& p);
std::optional<Reason> check_non_causal(const FallbackPolicy& f, const AttentionProblem& p);
std::optional<Reason> check_seq_multiple(const FallbackPolicy& f, const AttentionProblem& p);
// All fallback gates that fire, in the order decode, non_causal, seq_multiple.
std::vector<Reason> fallback_reasons(const FallbackPolicy& f, const AttentionProblem& p);

}  // namespace attnops::gates
