// The dispatcher: first the operator-level fallbacks, then the backend.
//
//  1. make_problem validates the call (typed errors).
//  2. Operator fallbacks (gates::fallback_reasons): when any enabled rule fires, the call goes to
//     vanilla and every rule that fired is recorded (decode, non_causal, seq_multiple).
//  3. Backend candidates, in order: ATTNOPS_FORCE_NATIVE=1 gives [native] (reason
//     forced_native); otherwise the call's preference list (AttentionOptions::backends) or the
//     metadata's, followed by the rest of the auto order gpu, cpu, native. Each candidate passes four gates
//     or is rejected with a reason: disabled_by_config, then the host's availability (backend_unavailable),
//     then whether the operator implements it (not_implemented), then the operator's input check
//     (unsupported_feature / unsupported_dtype). The first that passes runs.
//  4. A runtime GPU failure (Error gpu_error) is recorded as gpu_error and the next candidate runs.
// The decision travels with the output; ATTNOPS_LOG=dispatch prints it as one line to stderr.
//
// Paged calls (dispatch_paged) take steps 1, 3 and 4 on make_paged_problem's problem.
// The backward (dispatch_backward) takes the same steps on make_backward_problem's problem:
// the same fallbacks pick the same operator the forward ran, then the candidates pass the same
// gates with implements_backward and check_backward_inputs in place of the forward's.
#pragma once

#include <algorithm>
#include <array>
#include <initializer_list>
#include <optional>
#include <vector>

#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/paged_problem.h"
#include "attnops/ext/problem.h"
#include "attnops/host.h"
#include "attnops/options.h"
#include "attnops/paged.h"

namespace attnops {

// The environment switches the dispatcher uses (read once per process: attnops/environment.h).
struct RuntimeFlags {
  bool force_native = false;  // ATTNOPS_FORCE_NATIVE=1
  bool log_dispatch = false;  // ATTNOPS_LOG=dispatch (a comma-separated list may hold more)
  static RuntimeFlags from_env();
};

// The backends a call tries, in order, each at most once: a fixed array (a call allocates
// nothing for it; there are four backends).
class BackendList {
 public:
  BackendList() = default;
  BackendList(std::initializer_list<Backend> bs) {
    for (Backend b : bs) add(b);
  }
  void add(Backend b) {  // appended unless already listed
    if (std::find(begin(), end(), b) == end() && n_ < items_.size()) items_[n_++] = b;
  }
  const Backend* begin() const { return items_.data(); }
  const Backend* end() const { return items_.data() + n_; }
  std::size_t size() const { return n_; }

 private:
  std::array<Backend, 4> items_{};
  std::size_t n_ = 0;
};

// The backend preference of one call: the call's own list (AttentionOptions::backends) when it
// gave one, else the metadata's. A backend the call names is exempt from disabled_backends.
struct Preference {
  const std::vector<Backend>* list = nullptr;  // never null once built by preference()
  bool per_call = false;
  bool names(Backend b) const;
};
// Error invalid_argument naming `backends` for a value that is no Backend.
Preference preference(const OperationMetadata& md, const std::optional<std::vector<Backend>>& call);

// The ordered candidates for a preference (duplicates removed), then the rest of the auto order.
BackendList backend_candidates(const Preference& pref);

// Why `op` cannot run problem `p` on backend `b` of `host`, or nullopt.
std::optional<Reason> check_backend(const OperationImpl& op, Backend b, const AttentionProblem& p,
                                    const Host& host, const Preference& pref);

// Why `op` cannot run the backward of problem `p` on backend `b` of `host`, or nullopt.
std::optional<Reason> check_backward_backend(const OperationImpl& op, Backend b, const BackwardProblem& p,
                                             const Host& host, const Preference& pref);

// Plans (execute = false: decision only) or runs one call.
AttentionOutput dispatch(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                         const TensorView& q, const TensorView& k, const TensorView& v,
                         const AttentionOptions& options, const RuntimeFlags& flags, bool execute);

// Why `op` cannot run paged problem `p` on backend `b` of `host`, or nullopt.
std::optional<Reason> check_paged_backend(const OperationImpl& op, Backend b, const PagedProblem& p,
                                          const Host& host, const Preference& pref);

// Plans (execute = false: decision only) or runs one paged call (paged.h). No operator fallbacks
// apply; the candidates pass the forward's gates with implements_paged and check_paged_inputs.
// A device-resident cache (or q) runs on the gpu only: asking for another backend, forcing
// native, or a gpu that cannot run it is an Error naming the argument. No cost rule yet (no
// backend both reads host memory and runs paged calls on the gpu).
AttentionOutput dispatch_paged(OperationImpl& op, const Host& host, const TensorView& q,
                               const PagedKVCache& cache, const PagedPlan& plan,
                               const PagedAttentionOptions& options, const RuntimeFlags& flags, bool execute);

// Runs the backward of one call.
AttentionGradients dispatch_backward(OperationImpl& requested, OperationImpl& vanilla, const Host& host,
                                     const TensorView& q, const TensorView& k, const TensorView& v,
                                     const TensorView& out, const TensorView& lse, const TensorView& dout,
                                     const AttentionOptions& options, const RuntimeFlags& flags);

}  // namespace attnops
