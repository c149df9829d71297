#include "operators/gates.h"

#include <string>

#include "attnops/ext/problem.h"

namespace attnops::gates {

std::optional<Reason> check_decode(const FallbackPolicy& f, const AttentionProblem& p) {
  if (f.decode && p.Tq == 1) return Reason{ReasonCode::decode, "q_len=1"};
  return std::nullopt;
}

std::optional<Reason> check_non_causal(const FallbackPolicy& f, const AttentionProblem& p) {
  if (f.non_causal && !p.causal) return Reason{ReasonCode::non_causal, "causal=false"};
  return std::nullopt;
}

std::optional<Reason> check_seq_multiple(const FallbackPolicy& f, const AttentionProblem& p) {
  if (f.seq_multiple && f.seq_multiple_of > 0 && p.Tq % f.seq_multiple_of != 0)
    return Reason{ReasonCode::seq_multiple, "q_len=" + std::to_string(p.Tq) + " is not a multiple of " +
                                                std::to_string(f.seq_multiple_of)};
  return std::nullopt;
}

std::vector<Reason> fallback_reasons(const FallbackPolicy& f, const AttentionProblem& p) {
  std::vector<Reason> r;
  for (auto gate : {check_decode, check_non_causal, check_seq_multiple})
    if (auto x = gate(f, p)) r.push_back(std::move(*x));
  return r;
}

}  // namespace attnops::gates
