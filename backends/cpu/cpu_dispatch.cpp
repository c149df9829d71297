// The CPU backend's entry points (baseline code): validate the call, choose the ISA tier, call
// that tier's kernel through its TierKernels table and record what ran in buffers.run.
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <optional>
#include <string>

#include "attnops/error.h"
#include "attnops/ext/backward_problem.h"
#include "attnops/ext/problem.h"
#include "backends/common/block_map_impl.h"
#include "backends/common/threads.h"
#include "backends/cpu/call_threads.h"
#include "backends/cpu/isa.h"
#include "backends/cpu/tier_kernels.h"
#include "backends/cpu/tiled_backward.h"
#include "backends/cpu/tiled_cpu.h"
#include "backends/cpu/vanilla_cpu.h"
#include "backends/cpu/vanilla_decode.h"

namespace attnops::cpu {

// Only the tiers of this build (ATTNOPS_CPU_BUILT_TIERS, bit i: the tier of level i) are linked.
const TierKernels& tier_kernels(Isa isa) {
  switch (isa) {
#if defined(ATTNOPS_CPU_BUILT_TIERS) && (ATTNOPS_CPU_BUILT_TIERS & 2)
    case Isa::avx2:
      return tier_avx2::tier_kernels();
#endif
#if defined(ATTNOPS_CPU_BUILT_TIERS) && (ATTNOPS_CPU_BUILT_TIERS & 4)
    case Isa::avx512:
      return tier_avx512::tier_kernels();
#endif
#if defined(ATTNOPS_CPU_BUILT_TIERS) && (ATTNOPS_CPU_BUILT_TIERS & 8)
    case Isa::avx512bf16:
      return tier_avx512bf16::tier_kernels();
#endif
#if defined(ATTNOPS_CPU_BUILT_TIERS) && (ATTNOPS_CPU_BUILT_TIERS & 16)
    case Isa::amx:
      return tier_amx::tier_kernels();
#endif
    default:
      break;
  }
  if (isa != Isa::baseline)
    throw Error(ErrorCode::backend_unavailable,
                "cpu tier " + std::string(isa_name(isa)) + " is not compiled into this build");
  return tier_baseline::tier_kernels();
}

namespace {

// assign / append: a RunInfo reused from call to call keeps its strings' capacity. The whole
// detail is reserved first, so a fresh RunInfo (a public call's) allocates it once whatever its
// length: grown append by append, it took one to three allocations, and a warm call's count
// depended on the tier's text (ATTNOPS_CPU_ISA=avx2 made one decode shape allocate once more).
void record(RunInfo& run, const IsaChoice& c, const char* path, const char* extra = "") {
  run.kernel.assign(isa_name(c.tier));
  const std::size_t n_extra = std::strlen(extra);
  run.kernel_detail.reserve(std::strlen(path) + 2 + c.detail.size() + (n_extra ? 2 + n_extra : 0));
  run.kernel_detail.assign(path).append("; ").append(c.detail);
  if (n_extra) run.kernel_detail.append("; ").append(extra);
}
void record(AttentionBuffers& buffers, const IsaChoice& c, const char* path, const CallThreads& t) {
  record(buffers.run, c, path, t.detail);
}

}  // namespace

IsaChoice choose_forced_tier(const ForcedTier& forced) {
  if (!forced.table) return choose_isa_forced(forced.isa);
  // A test's own table: its tier's code, built to run on any AVX2 CPU when emulated.
  if (forced.table->emulated && detect_isa().best < Isa::avx2)
    throw Error(ErrorCode::backend_unavailable,
                "cpu tier " + std::string(isa_name(forced.isa)) +
                    " (emulated): the emulated build needs AVX2, which this CPU lacks");
  IsaChoice c;
  c.tier = c.detected = forced.isa;
  c.detail = "tier " + std::string(isa_name(forced.isa)) +
             (forced.table->emulated ? " emulated (its code built with the avx2 flags, instructions beyond "
                                       "AVX2 in C++), forced"
                                     : " from a given table, forced");
  return c;
}

namespace {

// The choice a call runs under: the current one, or the forced tier's (kept in `storage`).
const IsaChoice& choice(const std::optional<ForcedTier>& forced, IsaChoice& storage) {
  return forced ? (storage = choose_forced_tier(*forced)) : current_isa_choice();
}
const TierKernels& kernels(const std::optional<ForcedTier>& forced, const IsaChoice& c) {
  return forced && forced->table ? *forced->table : tier_kernels(c.tier);
}

// Runs a tier's kernel: the kernels allocate their scratch before any parallel region and throw
// nothing but std::bad_alloc, which becomes a typed error naming the kernel here.
template <class F>
const char* guarded(const char* where, F&& kernel) {
  try {
    return kernel();
  } catch (const std::bad_alloc&) {
    throw Error(ErrorCode::out_of_memory, std::string(where) + ": cannot allocate the kernel's scratch");
  }
}

// The block map must be the problem's and the dtype a float one (typed errors naming both).
void check_tiled_inputs(const char* where, const AttentionProblem& p, const BlockMap& map) {
  if (map.Tq != p.Tq || map.Tk != p.Tk || (map.heads != 1 && map.heads != p.Hq))
    throw Error(ErrorCode::shape_mismatch,
                std::string(where) + ": block map built for Tq=" + std::to_string(map.Tq) +
                    " Tk=" + std::to_string(map.Tk) + " heads=" + std::to_string(map.heads) +
                    ", expected Tq=" + std::to_string(p.Tq) + " Tk=" + std::to_string(p.Tk) + " heads=1 or " +
                    std::to_string(p.Hq));
  if (!is_float(p.dtype))
    throw Error(
        ErrorCode::unsupported_dtype,
        std::string(where) + ": dtype " + std::string(dtype_name(p.dtype)) + ", expected f32, f16 or bf16");
}

void run_tiled(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers,
               std::optional<ForcedTier> forced) {
  check_tiled_inputs("cpu tiled_attention", p, map);
  IsaChoice forced_choice;
  const IsaChoice& c = choice(forced, forced_choice);
  const CallThreads t = call_threads(p, false, !forced);
  AttentionProblem q = p;  // the kernel reads its thread count from the problem
  q.num_threads = t.threads;
  const TierKernels& k = kernels(forced, c);
  record(buffers, c, guarded("cpu tiled_attention", [&] { return k.tiled(q, map, buffers); }), t);
}

void run_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads,
                  std::optional<ForcedTier> forced) {
  const AttentionProblem& p = bp.fwd;
  check_tiled_inputs("cpu tiled_backward", p, map);
  IsaChoice forced_choice;
  const IsaChoice& c = choice(forced, forced_choice);
  const TierKernels& k = kernels(forced, c);
  record(grads.run, c, guarded("cpu tiled_backward", [&] { return k.backward(bp, map, grads); }));
}

void run_vanilla(const AttentionProblem& p, AttentionBuffers& buffers, std::optional<ForcedTier> forced,
                 const VanillaPlan* plan = nullptr) {
  IsaChoice forced_choice;
  const IsaChoice& c = choice(forced, forced_choice);
  if (p.B == 0 || p.Tq == 0 || p.Hq == 0) return;
  if (p.Tk == 0) {  // nothing to attend to: output stays 0, every lse is -inf
    if (buffers.lse) {
      float* l = buffers.lse->data_as<float>();
      std::fill(l, l + buffers.lse->numel(), -std::numeric_limits<float>::infinity());
    }
    return;
  }
  const TierKernels& k = kernels(forced, c);
  // The decode path cannot return the weights (it never materialises a whole row).
  if (!plan && p.Tq <= kDecodeMaxQ && !p.want_weights) {
    const CallThreads t = call_threads(p, true, !forced);
    record(
        buffers, c,
        guarded("vanilla cpu",
                [&] { return k.vanilla_decode(p, buffers, t.threads, vanilla_decode_splits(p, t.threads)); }),
        t);
    return;
  }
  // A caller's plan (tests) fixes the thread count it was made for.
  const CallThreads t = call_threads(p, false, !forced && !plan);
  const VanillaPlan pl = plan ? *plan : vanilla_plan(p, t.threads);
  record(buffers, c, guarded("vanilla cpu", [&] { return k.vanilla_general(p, buffers, t.threads, pl); }), t);
}

}  // namespace

void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers) {
  run_tiled(p, map, buffers, std::nullopt);
}
void tiled_attention(const AttentionProblem& p, const BlockMap& map, AttentionBuffers& buffers,
                     ForcedTier tier) {
  run_tiled(p, map, buffers, tier);
}
void tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads) {
  run_backward(bp, map, grads, std::nullopt);
}
void tiled_backward(const BackwardProblem& bp, const BlockMap& map, GradientBuffers& grads, ForcedTier tier) {
  run_backward(bp, map, grads, tier);
}
void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers) {
  run_vanilla(p, buffers, std::nullopt);
}
void vanilla_attention(const AttentionProblem& p, AttentionBuffers& buffers, ForcedTier tier) {
  run_vanilla(p, buffers, tier);
}
void vanilla_general(const AttentionProblem& p, AttentionBuffers& buffers, ForcedTier tier,
                     const VanillaPlan& plan) {
  run_vanilla(p, buffers, tier, &plan);
}

std::int64_t vanilla_decode_splits(const AttentionProblem& p, int threads) {
  const std::int64_t B = std::max<std::int64_t>(1, p.B);
  // About four tasks per thread, so dynamic scheduling evens out kv ranges that masks made uneven.
  const std::int64_t want = (4 * static_cast<std::int64_t>(threads) + B - 1) / B;
  const std::int64_t most = std::max<std::int64_t>(1, p.Tk / kMinSplitKeys);
  return std::clamp<std::int64_t>(want, 1, most);
}

}  // namespace attnops::cpu
