// The backward part of `attnops run`: with --dout, the forward is followed by its backward and
// the gradients are written as f32 .npy files.
//
//   attnops run ... --out o.npy --dout dout.npy --dq-out dq.npy --dk-out dk.npy --dv-out dv.npy
//                   [--dsinks-out ds.npy] [--dbias-out db.npy]
//
// Bad combinations exit 2 with "error:" before any work: a gradient output without --dout,
// --dout without any gradient output, --dsinks-out without --sinks, --dbias-out without --bias,
// two outputs naming the same file. dout of the wrong shape or dtype is the library's typed error.
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <utility>
#include <vector>

#include "attnops/attnops.h"
#include "cli/output_set.h"

namespace attnops::cli {

struct BackwardArgs {
  std::string dout, dq_out, dk_out, dv_out, dsinks_out, dbias_out;
  bool requested() const { return !dout.empty(); }
};

void add_backward_options(CLI::App* app, BackwardArgs& a);

// Throws Error(invalid_argument) for a bad combination. `forward_outputs` are the paths the
// forward writes (--out, --lse-out, --weights-out; empty entries ignored).
void check_backward_args(const BackwardArgs& a, bool has_sinks, bool has_bias,
                         const std::vector<std::string>& forward_outputs);

// The backward's results, ready to write: (path, f32 tensor) for each requested gradient.
struct GradientFiles {
  std::vector<std::pair<std::string, Tensor>> files;
  DispatchDecision decision;
};

// Reads dout and runs the backward of `forward` (which must carry the lse).
GradientFiles run_backward(const Attention& attn, const TensorView& q, const TensorView& k,
                           const TensorView& v, const AttentionOutput& forward,
                           const AttentionOptions& options, const BackwardArgs& a);

// Reserves the gradient outputs asked for in `outs` (before any work, as the forward's outputs
// are), in the order run_backward fills GradientFiles::files. Returns their indices in `outs`.
std::vector<int> reserve_gradient_outputs(const BackwardArgs& a, OutputSet& outs);
// Writes each gradient into its reserved output; `outs.commit()` then makes them appear.
void write_gradients(const GradientFiles& g, OutputSet& outs, const std::vector<int>& files);

}  // namespace attnops::cli
