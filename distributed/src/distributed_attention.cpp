// The distributed handles (DistributedAttention), their registry entries and their decisions.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "attnops/environment.h"
#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/operation.h"
#include "attnops/ext/problem.h"
#include "dist_impl.h"

namespace attnops::dist {

namespace {

bool force_native() {
  return environment().forced_native();  // read once per process (attnops/environment.h)
}

std::string bytes_text(std::uint64_t b) {
  char buf[32];
  if (b >= (std::uint64_t{1} << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / (1 << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", static_cast<double>(b) / 1024);
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

std::string ms_text(double ms) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g", ms);
  return buf;
}

// A registry entry's operator as a plain Attention handle: a world of one rank, which is the
// local operator itself (the distributed handle of dist::get runs on a communicator).
class SingleRankOperation final : public OperationImpl {
 public:
  SingleRankOperation(std::string name, const OperationMetadata& md, std::shared_ptr<OperationImpl> local)
      : OperationImpl(md), name_(std::move(name)), local_(std::move(local)) {}
  std::string name() const override { return name_; }
  bool implements(Backend b) const override { return local_->implements(b); }
  bool returns_weights() const override { return local_->returns_weights(); }
  std::optional<Reason> check_inputs(Backend b, const AttentionProblem& p) const override {
    return local_->check_inputs(b, p);
  }
  AttentionOutput forward_native(const AttentionProblem& p) override {
    return local_->forward(Backend::native, p);
  }
  AttentionOutput forward_cpu(const AttentionProblem& p) override { return local_->forward(Backend::cpu, p); }
  AttentionOutput forward_gpu(const AttentionProblem& p) override { return local_->forward(Backend::gpu, p); }
  AttentionOutput forward_tpu(const AttentionProblem& p) override { return local_->forward(Backend::tpu, p); }
  bool implements_backward(Backend b) const override { return local_->implements_backward(b); }
  std::optional<Reason> check_backward_inputs(Backend b, const BackwardProblem& p) const override {
    return local_->check_backward_inputs(b, p);
  }
  AttentionGradients backward_native(const BackwardProblem& p) override {
    return local_->backward(Backend::native, p);
  }
  AttentionGradients backward_cpu(const BackwardProblem& p) override {
    return local_->backward(Backend::cpu, p);
  }
  AttentionGradients backward_gpu(const BackwardProblem& p) override {
    return local_->backward(Backend::gpu, p);
  }
  AttentionGradients backward_tpu(const BackwardProblem& p) override {
    return local_->backward(Backend::tpu, p);
  }

 private:
  std::string name_;
  std::shared_ptr<OperationImpl> local_;
};

constexpr const char* kDefaultLocal = "flash_attn2";

OperationEntry entry_for(const Registry& r, const std::string& name) {
  const Registry* reg = &r;
  return OperationEntry{name, {}, r.entry(kDefaultLocal).defaults, [reg, name](const OperationMetadata& md) {
                          return std::make_shared<SingleRankOperation>(name, md,
                                                                       reg->entry(kDefaultLocal).make(md));
                        }};
}

// Ulysses' head rule, checked on every rank before the agreement.
std::string ulysses_heads_error(const TensorView& q, const TensorView& k, int P) {
  if (q.rank() != 4 || k.rank() != 4 || P <= 1) return "";  // make_problem names bad ranks
  const std::int64_t Hq = q.dim(2), Hkv = k.dim(2);
  if (Hq % P != 0)
    return "ulysses: Hq=" + std::to_string(Hq) + " q heads do not divide over " + std::to_string(P) +
           " ranks (ulysses splits heads; use ring, or a rank count that divides Hq)";
  if (Hkv > 0 && Hq % Hkv == 0 && Hkv % P != 0 && P % Hkv != 0)
    return "ulysses: Hkv=" + std::to_string(Hkv) + " K/V heads neither divide over " + std::to_string(P) +
           " ranks nor divide it (K/V heads are split when Hkv % P == 0 and replicated when P % Hkv == 0; "
           "use ring)";
  return "";
}

DistStats single_rank_stats(const char* name, const char* pass, Layout layout, Communicator& comm,
                            std::int64_t Tq, std::int64_t Tk, double ms) {
  DistStats s;
  s.algorithm = name;
  s.pass = pass;
  s.layout = layout;
  s.ranks = 1;
  s.Tq = Tq;
  s.Tk = Tk;
  s.transport = comm.describe();
  StepStats st;
  st.name = "local";
  st.compute_ms = ms;
  st.calls = 1;
  s.steps.push_back(st);
  s.total_ms = ms;
  detail::finish_totals(s);
  return s;
}

}  // namespace

std::string DistStats::summary() const {
  std::string s = algorithm + " " + pass + ", " + std::string(layout_name(layout)) + " layout, " +
                  std::to_string(ranks) + " ranks (" + transport + "), Tq=" + std::to_string(Tq) +
                  " Tk=" + std::to_string(Tk) + ": compute " + ms_text(compute_ms) + " ms, exposed wait " +
                  ms_text(wait_ms) + " ms, sent " + bytes_text(bytes_sent) + ", received " +
                  bytes_text(bytes_received) + "; per step (compute ms / wait ms / sent / calls):";
  constexpr std::size_t kMaxSteps = 16;
  for (std::size_t i = 0; i < steps.size() && i < kMaxSteps; ++i) {
    const StepStats& t = steps[i];
    s += " [" + t.name + (t.source >= 0 ? " keys of rank " + std::to_string(t.source) : std::string()) +
         ": " + ms_text(t.compute_ms) + " / " + ms_text(t.wait_ms) + " / " + bytes_text(t.bytes_sent) +
         " / " + std::to_string(t.calls) + "]";
  }
  if (steps.size() > kMaxSteps) s += " ... (" + std::to_string(steps.size()) + " steps)";
  return s;
}

namespace detail {

DispatchDecision distributed_decision(const std::string& name, const DistStats& stats,
                                      const DispatchDecision& local, Pass pass) {
  DispatchDecision d;
  d.pass = pass;
  d.requested = name;
  d.op = name;
  d.backend = local.backend;
  d.reasons = local.reasons;
  d.cost = local.cost;
  const std::string local_kernel =
      local.run.kernel.empty() ? std::string(backend_name(local.backend)) : local.run.kernel;
  d.run.kernel = name + "(" + std::string(layout_name(stats.layout)) + ")+" + local.op + ":" + local_kernel;
  d.run.kernel_detail =
      stats.summary() + "; local operator " + local.op + " on " + std::string(backend_name(local.backend)) +
      (local.run.kernel_detail.empty() ? std::string() : " (" + local.run.kernel_detail + ")");
  d.run.inputs = "host";
  d.run.output = "host";
  RunTimings t;
  for (const StepStats& s : stats.steps) {
    t.passes.push_back({s.name + " compute", s.compute_ms});
    t.passes.push_back({s.name + " wait", s.wait_ms});
  }
  t.kernel_ms = stats.compute_ms;
  t.wall_ms = stats.total_ms;
  d.run.timings = t;
  return d;
}

}  // namespace detail

void register_distributed_operators(Registry& r) {
  r.add(entry_for(r, "ring"));
  r.add(entry_for(r, "ulysses"));
}

DistributedAttention get(const Registry& r, std::string_view name, const Config& config,
                         DistSettings settings) {
  const std::string canonical = r.canonical(name);
  if (canonical != "ring" && canonical != "ulysses")
    throw Error(ErrorCode::unknown_operator,
                "'" + canonical +
                    "' is not a distributed operator (ring, ulysses); register them with "
                    "attnops::dist::register_distributed_operators");
  const OperationEntry dist_entry = r.entry(canonical);
  const OperationEntry local_entry = r.entry(settings.local_operator);
  (void)r.get(canonical, config);  // checks the config as any get does (unknown operators in it, ...)
  // The local operator's own defaults, then the config's top level, then its ring / ulysses section.
  OperationMetadata md = config.metadata_for(dist_entry.name, dist_entry.aliases, local_entry.defaults);
  DistributedAttention a;
  a.name_ = canonical;
  a.local_ = r.get(local_entry.name, md);
  // The ring's local backward reads the global lse: never the native backward (it recomputes
  // each block's own softmax).
  OperationMetadata bmd = md;
  bmd.disabled_backends.push_back(Backend::native);
  a.local_backward_ = canonical == "ring" ? r.get(local_entry.name, bmd) : a.local_;
  a.settings_ = std::move(settings);
  return a;
}

DistributedAttention get(std::string_view name, const Config& config, DistSettings settings) {
  static std::once_flag once;
  std::call_once(once, [] {
    const auto names = registry().list();
    if (std::find(names.begin(), names.end(), "ring") == names.end())
      register_distributed_operators(registry());
  });
  return get(registry(), name, config, std::move(settings));
}

ShardLayout DistributedAttention::layout_for(const AttentionOptions& options, std::int64_t T,
                                             int ranks) const {
  return ShardLayout(settings_.layout.value_or(default_layout(options)), T, ranks);
}

DistOutput DistributedAttention::operator()(Communicator& comm, const TensorView& q, const TensorView& k,
                                            const TensorView& v, const AttentionOptions& options) const {
  const Layout layout = settings_.layout.value_or(default_layout(options));
  const bool ring = name_ == "ring";
  const std::string heads = ring ? std::string() : ulysses_heads_error(q, k, comm.size());
  detail::Prepared in = detail::prepare(comm, name_, local_, layout, q, k, v, options, heads,
                                        static_cast<int>(ErrorCode::invalid_argument));
  if (comm.size() == 1) {  // the local operator itself: bitwise the single-process call
    detail::Stopwatch w;
    AttentionOptions o = options;
    o.return_lse = true;
    DistOutput r;
    r.output = local_(q, k, v, o);
    r.stats = single_rank_stats(name_.c_str(), "forward", layout, comm, in.p.Tq, in.p.Tk, w.ms());
    r.output.decision = detail::distributed_decision(name_, r.stats, r.output.decision, Pass::forward);
    return r;
  }
  return ring ? detail::ring_forward(comm, local_, settings_, in, options)
              : detail::ulysses_forward(comm, local_, in, options);
}

DistGradients DistributedAttention::backward(Communicator& comm, const TensorView& q, const TensorView& k,
                                             const TensorView& v, const TensorView& out,
                                             const TensorView& lse, const TensorView& dout,
                                             const AttentionOptions& options) const {
  const Layout layout = settings_.layout.value_or(default_layout(options));
  const bool ring = name_ == "ring";
  std::string extra = ring ? std::string() : ulysses_heads_error(q, k, comm.size());
  int code = static_cast<int>(ErrorCode::invalid_argument);
  // The local backward never runs on native (get above): with native forced, or with every other
  // backend disabled by the config, no local call could run; say why instead of the dispatcher's
  // "disabled by config" for native.
  const std::vector<Backend>& off = local_.metadata().disabled_backends;
  const auto disabled = [&](Backend b) { return std::find(off.begin(), off.end(), b) != off.end(); };
  const bool native_only = disabled(Backend::cpu) && disabled(Backend::gpu);
  if (ring && comm.size() > 1 && (force_native() || native_only)) {
    extra = std::string("ring: ") +
            (force_native() ? "ATTNOPS_FORCE_NATIVE runs" : "the config (disabled_backends) leaves only") +
            " the native backward, which recomputes each block's own softmax instead of reading the global "
            "lse; the ring backward needs the cpu or gpu backward (ulysses runs any backend)";
    code = static_cast<int>(ErrorCode::unsupported_feature);
  }
  detail::PreparedBackward in =
      detail::prepare_backward(comm, name_, local_, layout, q, k, v, out, lse, dout, options, extra, code);
  if (comm.size() == 1) {
    detail::Stopwatch w;
    DistGradients r;
    r.gradients = local_.backward(q, k, v, out, lse, dout, options);
    r.stats = single_rank_stats(name_.c_str(), "backward", layout, comm, in.bp.fwd.Tq, in.bp.fwd.Tk, w.ms());
    r.gradients.decision = detail::distributed_decision(name_, r.stats, r.gradients.decision, Pass::backward);
    return r;
  }
  return ring ? detail::ring_backward(comm, local_backward_, settings_, in, options)
              : detail::ulysses_backward(comm, local_, in, options);
}

DistGradients DistributedAttention::backward(Communicator& comm, const TensorView& q, const TensorView& k,
                                             const TensorView& v, const DistOutput& forward,
                                             const TensorView& dout, const AttentionOptions& options) const {
  if (!forward.output.lse)
    throw Error(ErrorCode::invalid_argument, name_ + ": backward: the forward output has no lse");
  return backward(comm, q, k, v, forward.output.out, *forward.output.lse, dout, options);
}

}  // namespace attnops::dist
