// Registry of attention operators and the Attention handle that model code calls.
//
//   auto attn = attnops::registry().get("blocksparse");   // or an alias: "splash"
//   attnops::AttentionOutput out = attn(q, k, v, {.causal = true});
//   out.decision;   // which operator / backend ran and why
//
// Registration is an explicit list (register_builtin_operators), never static initialisers.
// A Registry can be built for tests with an injected Host and injected operator factories.
// All methods are thread-safe: entries are immutable once added and held by shared pointers, so
// get() and entry() copy what they need under the lock while add() may replace or append entries
// concurrently. An Attention handle is immutable and can be shared by threads.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/backward.h"
#include "attnops/config.h"
#include "attnops/decision.h"
#include "attnops/host.h"
#include "attnops/metadata.h"
#include "attnops/options.h"
#include "attnops/paged.h"

namespace attnops {

// Implemented by operator authors (attnops/ext/operation.h); model code never sees it.
class OperationImpl;

using OperationFactory = std::function<std::shared_ptr<OperationImpl>(const OperationMetadata&)>;

struct OperationEntry {
  std::string name;  // canonical
  std::vector<std::string> aliases;
  OperationMetadata defaults;  // the operator's own defaults (fallbacks, block sizes)
  OperationFactory make;
};

class Registry;

// A configured operator, ready to call. Holds the requested operator and the vanilla operator
// its fallbacks hand calls to, both built with metadata from the config.
class Attention {
 public:
  AttentionOutput operator()(const TensorView& q, const TensorView& k, const TensorView& v,
                             const AttentionOptions& options = {}) const;
  // The decision a call would get, without running it (the backend is the first candidate that
  // passes every gate; a runtime gpu_error can still move a real call further down the list).
  DispatchDecision explain(const TensorView& q, const TensorView& k, const TensorView& v,
                           const AttentionOptions& options = {}) const;
  [[deprecated("use explain")]] DispatchDecision plan(const TensorView& q, const TensorView& k,
                                                      const TensorView& v,
                                                      const AttentionOptions& options = {}) const {
    return explain(q, k, v, options);
  }

  // The backward of a call with these inputs and options (see backward.h): out and lse are that
  // forward's results (call it with return_lse = true), dout the gradient of out. The operator
  // the forward ran (after the same fallbacks) runs the backward, on the first backend candidate
  // that implements it; the result carries its own decision (pass "backward").
  AttentionGradients backward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const TensorView& out, const TensorView& lse, const TensorView& dout,
                              const AttentionOptions& options = {}) const;
  // The same, with out and lse taken from the forward's result (Error invalid_argument when it
  // has no lse).
  AttentionGradients backward(const TensorView& q, const TensorView& k, const TensorView& v,
                              const AttentionOutput& forward, const TensorView& dout,
                              const AttentionOptions& options = {}) const;

  // Paged calls (paged.h): q [N, Hq, D] over the cache, with the batch planned once per step
  // (plan_paged, which keeps the options) and the plan reused by every layer. out [N, Hq, Dv],
  // lse [N, Hq] when the plan asked for it, the decision as for dense calls. No operator
  // fallbacks. Only ragged_paged (alias paged) serves paged calls: on any other operator each
  // paged / explain overload throws Error(not_implemented) naming it, before looking at its
  // arguments.
  AttentionOutput paged(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan) const;
  // With options: they replace the plan's for this run; the masks and kv_split_tokens shape the
  // work list, so they must be the plan's (Error invalid_argument naming both, else).
  AttentionOutput paged(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                        const PagedAttentionOptions& options) const;
  // Plans the batch (plan_paged) and runs it: for one-off calls; a model step plans once.
  AttentionOutput paged(const TensorView& q, const PagedKVCache& cache, const RaggedBatch& batch,
                        const PagedAttentionOptions& options = {}) const;
  // The decision a paged call would get, without running it.
  DispatchDecision explain(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan) const;
  DispatchDecision explain(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                           const PagedAttentionOptions& options) const;
  [[deprecated("use explain")]] DispatchDecision explain_paged(const TensorView& q, const PagedKVCache& cache,
                                                               const PagedPlan& plan) const {
    return explain(q, cache, plan);
  }
  [[deprecated("use explain")]] DispatchDecision explain_paged(const TensorView& q, const PagedKVCache& cache,
                                                               const PagedPlan& plan,
                                                               const PagedAttentionOptions& options) const {
    return explain(q, cache, plan, options);
  }

  const std::string& name() const { return requested_; }
  // The operator's configuration and abilities (the operator itself: attnops/ext/attention.h).
  const OperationMetadata& metadata() const;
  std::vector<std::string> aliases() const;
  bool implements(Backend backend) const;           // a real forward for backend
  bool implements_backward(Backend backend) const;  // a real backward for backend
  bool implements_paged(Backend backend) const;     // a real paged call for backend
  bool returns_weights() const;                     // return_weights works (vanilla)

 private:
  friend class Registry;
  friend struct AttentionAccess;  // attnops/ext/attention.h
  void require_paged() const;
  std::string requested_;
  std::shared_ptr<OperationImpl> op_;
  std::shared_ptr<OperationImpl> vanilla_;
  std::shared_ptr<const Host> host_;
};

class Registry {
 public:
  // host: capabilities to dispatch against; nullptr = system_host(). The registry starts
  // empty; register_builtin_operators() adds vanilla, blocksparse, flash_attn2 and ragged_paged.
  explicit Registry(std::shared_ptr<const Host> host = nullptr);

  // Registers (or replaces, by canonical name) an operator. Aliases must not collide with
  // another operator's names (Error invalid_argument).
  void add(OperationEntry entry);
  // Error(unknown_operator) listing the registered names for an unknown name; Error(config_error)
  // when the config names an unknown operator or sets an invalid value.
  Attention get(std::string_view name, const Config& config = {}) const;
  Attention get(std::string_view name, const OperationMetadata& metadata) const;

  std::vector<std::string> list() const;  // canonical names, sorted
  // A copy of the entry (a reference could dangle once add() replaces it); throws unknown_operator.
  OperationEntry entry(std::string_view name_or_alias) const;
  std::string canonical(std::string_view name_or_alias) const;  // throws unknown_operator
  const Host& host() const { return *host_; }
  std::shared_ptr<const Host> host_ptr() const { return host_; }

 private:
  using EntryPtr = std::shared_ptr<const OperationEntry>;
  Attention make(const OperationEntry& e, const OperationMetadata& md, const Config* config) const;
  EntryPtr find(std::string_view name) const;    // caller holds mu_
  EntryPtr lookup(std::string_view name) const;  // takes mu_; throws unknown_operator
  std::shared_ptr<const Host> host_;
  mutable std::mutex mu_;
  std::vector<EntryPtr> entries_;
};

// vanilla, blocksparse (alias splash), flash_attn2 (alias flash), ragged_paged (alias paged): the
// explicit list.
void register_builtin_operators(Registry& r);

// The process-wide registry with the built-in operators and the system host.
Registry& registry();

}  // namespace attnops
