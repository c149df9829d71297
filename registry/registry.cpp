#include "attnops/registry.h"

#include <algorithm>

#include "attnops/error.h"
#include "attnops/ext/operation.h"
#include "core/printable.h"
#include "core/suggest.h"
#include "registry/dispatcher.h"

namespace attnops {

AttentionOutput Attention::operator()(const TensorView& q, const TensorView& k, const TensorView& v,
                                      const AttentionOptions& options) const {
  return dispatch(*op_, *vanilla_, *host_, q, k, v, options, RuntimeFlags::from_env(), /*execute=*/true);
}

DispatchDecision Attention::explain(const TensorView& q, const TensorView& k, const TensorView& v,
                                    const AttentionOptions& options) const {
  return dispatch(*op_, *vanilla_, *host_, q, k, v, options, RuntimeFlags::from_env(), /*execute=*/false)
      .decision;
}

AttentionGradients Attention::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const TensorView& out, const TensorView& lse, const TensorView& dout,
                                       const AttentionOptions& options) const {
  return dispatch_backward(*op_, *vanilla_, *host_, q, k, v, out, lse, dout, options,
                           RuntimeFlags::from_env());
}

AttentionGradients Attention::backward(const TensorView& q, const TensorView& k, const TensorView& v,
                                       const AttentionOutput& forward, const TensorView& dout,
                                       const AttentionOptions& options) const {
  if (!forward.lse)
    throw Error(ErrorCode::invalid_argument,
                "backward: the forward output has no lse; call the forward with return_lse = true");
  return backward(q, k, v, forward.out, *forward.lse, dout, options);
}

void Attention::require_paged() const {
  for (Backend b : {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu})
    if (op_->implements_paged(b)) return;
  throw Error(ErrorCode::not_implemented, "'" + op_->name() +
                                              "' does not serve paged batches: use the ragged_paged operator "
                                              "(registry().get(\"ragged_paged\"), alias \"paged\")");
}

AttentionOutput Attention::paged(const TensorView& q, const PagedKVCache& cache,
                                 const PagedPlan& plan) const {
  require_paged();
  return dispatch_paged(*op_, *host_, q, cache, plan, plan.options(), RuntimeFlags::from_env(),
                        /*execute=*/true);
}

AttentionOutput Attention::paged(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                                 const PagedAttentionOptions& options) const {
  require_paged();
  return dispatch_paged(*op_, *host_, q, cache, plan, options, RuntimeFlags::from_env(), /*execute=*/true);
}

AttentionOutput Attention::paged(const TensorView& q, const PagedKVCache& cache, const RaggedBatch& batch,
                                 const PagedAttentionOptions& options) const {
  require_paged();
  if (q.rank() != 3)
    throw Error(ErrorCode::shape_mismatch, "q: expected rank 3 [N, Hq, D], got " +
                                               (q.empty() ? std::string("none") : shape_string(q.shape())));
  return paged(q, cache, plan_paged(batch, cache.spec(), q.dim(0), q.dim(1), options));
}

DispatchDecision Attention::explain(const TensorView& q, const PagedKVCache& cache,
                                    const PagedPlan& plan) const {
  require_paged();
  return dispatch_paged(*op_, *host_, q, cache, plan, plan.options(), RuntimeFlags::from_env(),
                        /*execute=*/false)
      .decision;
}

DispatchDecision Attention::explain(const TensorView& q, const PagedKVCache& cache, const PagedPlan& plan,
                                    const PagedAttentionOptions& options) const {
  require_paged();
  return dispatch_paged(*op_, *host_, q, cache, plan, options, RuntimeFlags::from_env(), /*execute=*/false)
      .decision;
}

const OperationMetadata& Attention::metadata() const {
  return op_->metadata();
}
std::vector<std::string> Attention::aliases() const {
  return op_->aliases();
}
bool Attention::implements(Backend backend) const {
  return op_->implements(backend);
}
bool Attention::implements_backward(Backend backend) const {
  return op_->implements_backward(backend);
}
bool Attention::implements_paged(Backend backend) const {
  return op_->implements_paged(backend);
}
bool Attention::returns_weights() const {
  return op_->returns_weights();
}

Registry::Registry(std::shared_ptr<const Host> host) : host_(host ? std::move(host) : system_host()) {}

Registry::EntryPtr Registry::find(std::string_view name) const {
  for (const auto& e : entries_) {
    if (e->name == name) return e;
    if (std::find(e->aliases.begin(), e->aliases.end(), name) != e->aliases.end()) return e;
  }
  return nullptr;
}

void Registry::add(OperationEntry entry) {
  if (entry.name.empty() || !entry.make)
    throw Error(ErrorCode::invalid_argument, "Registry::add: an operator needs a name and a factory");
  auto added = std::make_shared<const OperationEntry>(std::move(entry));
  std::lock_guard lock(mu_);
  std::vector<std::string> names = added->aliases;
  names.push_back(added->name);
  for (const auto& n : names)
    if (EntryPtr other = find(n); other && other->name != added->name)
      throw Error(ErrorCode::invalid_argument, "Registry::add: name '" + n + "' of operator '" + added->name +
                                                   "' is already taken by '" + other->name + "'");
  // Re-registering a name replaces it (as EasyDeL's registry does): tests inject mocks this way.
  // A reader that copied the old pointer keeps a valid (old) entry.
  auto it =
      std::find_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e->name == added->name; });
  if (it != entries_.end())
    *it = std::move(added);
  else
    entries_.push_back(std::move(added));
}

std::vector<std::string> Registry::list() const {
  std::lock_guard lock(mu_);
  std::vector<std::string> r;
  for (const auto& e : entries_) r.push_back(e->name);
  std::sort(r.begin(), r.end());
  return r;
}

OperationEntry Registry::entry(std::string_view name) const {
  return *lookup(name);
}

Registry::EntryPtr Registry::lookup(std::string_view name) const {
  std::lock_guard lock(mu_);
  if (EntryPtr e = find(name)) return e;
  std::vector<std::string> all;
  std::string listing;
  std::vector<const OperationEntry*> sorted;
  for (const auto& e : entries_) sorted.push_back(e.get());
  std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
  for (const auto* e : sorted) {
    if (!listing.empty()) listing += ", ";
    listing += e->name;
    all.push_back(e->name);
    for (const auto& a : e->aliases) {
      listing += " (alias " + a + ")";
      all.push_back(a);
    }
  }
  // The name may come from a file or a user: control bytes escaped, length bounded (printable.h).
  std::string msg =
      "unknown operator '" + printable(name) + "'; registered: " + (listing.empty() ? "none" : listing);
  if (auto s = nearest_name(name, all)) msg += "; did you mean '" + *s + "'?";
  throw Error(ErrorCode::unknown_operator, msg);
}

std::string Registry::canonical(std::string_view name) const {
  return lookup(name)->name;
}

Attention Registry::make(const OperationEntry& e, const OperationMetadata& md, const Config* config) const {
  const EntryPtr van_ptr = lookup("vanilla");  // the fallback of every operator
  const OperationEntry& van = *van_ptr;
  Attention a;
  a.requested_ = e.name;
  a.host_ = host_;
  a.op_ = e.make(md);
  if (!a.op_) throw Error(ErrorCode::internal, "factory of operator '" + e.name + "' returned null");
  if (e.name == van.name) {
    a.vanilla_ = a.op_;
  } else {
    // Vanilla runs with the same settings; only its own (empty) fallback policy and block sizes.
    OperationMetadata vmd = config ? config->metadata_for(van.name, van.aliases, van.defaults) : md;
    if (!config) {
      vmd.fallbacks = van.defaults.fallbacks;
      vmd.blocksize_q = van.defaults.blocksize_q;
      vmd.blocksize_k = van.defaults.blocksize_k;
    }
    a.vanilla_ = van.make(vmd);
  }
  return a;
}

Attention Registry::get(std::string_view name, const Config& config) const {
  // Every operator the config names must exist: a typo there would silently do nothing.
  for (const auto& [key, oc] : config.operators) {
    std::lock_guard lock(mu_);
    if (find(key)) continue;
    std::vector<std::string> all;
    for (const auto& e : entries_) {
      all.push_back(e->name);
      all.insert(all.end(), e->aliases.begin(), e->aliases.end());
    }
    // A config built in code has no position (line 0): name the source only.
    std::string msg = config.source;
    if (oc.line > 0) {
      msg += ':';
      msg += std::to_string(oc.line);
      msg += ':';
      msg += std::to_string(oc.column);
    }
    msg += ": unknown operator '" + printable(key) + "' in 'operators'";
    if (auto s = nearest_name(key, all)) msg += "; did you mean '" + *s + "'?";
    throw Error(ErrorCode::config_error, msg);
  }
  const EntryPtr e = lookup(name);  // held for the whole call: a concurrent add() cannot free it
  return make(*e, config.metadata_for(e->name, e->aliases, e->defaults), &config);
}

Attention Registry::get(std::string_view name, const OperationMetadata& metadata) const {
  const EntryPtr e = lookup(name);
  return make(*e, metadata, nullptr);
}

}  // namespace attnops
