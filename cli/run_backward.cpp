#include "cli/run_backward.h"

#include "cli/npy.h"

namespace attnops::cli {

void add_backward_options(CLI::App* app, BackwardArgs& a) {
  auto* dout = app->add_option(
      "--dout", a.dout, "Gradient of the output [B, Tq, Hq, Dv] (.npy): run the backward after the forward");
  const std::pair<const char*, std::string*> outputs[] = {{"--dq-out", &a.dq_out},
                                                          {"--dk-out", &a.dk_out},
                                                          {"--dv-out", &a.dv_out},
                                                          {"--dsinks-out", &a.dsinks_out},
                                                          {"--dbias-out", &a.dbias_out}};
  const char* help[] = {"Write dq [B, Tq, Hq, D] f32 (.npy)", "Write dk [B, Tk, Hkv, D] f32 (.npy)",
                        "Write dv [B, Tk, Hkv, Dv] f32 (.npy)", "Write dsinks [Hq] f32 (.npy; needs --sinks)",
                        "Write dbias f32 in the bias's shape (.npy; needs --bias)"};
  for (std::size_t i = 0; i < std::size(outputs); ++i)
    app->add_option(outputs[i].first, *outputs[i].second, help[i])->needs(dout);
}

void check_backward_args(const BackwardArgs& a, bool has_sinks, bool has_bias,
                         const std::vector<std::string>& forward_outputs) {
  if (!a.requested()) return;
  const std::pair<const char*, const std::string*> grads[] = {{"--dq-out", &a.dq_out},
                                                              {"--dk-out", &a.dk_out},
                                                              {"--dv-out", &a.dv_out},
                                                              {"--dsinks-out", &a.dsinks_out},
                                                              {"--dbias-out", &a.dbias_out}};
  bool any = false;
  for (const auto& [flag, path] : grads) any = any || !path->empty();
  if (!any)
    throw Error(
        ErrorCode::invalid_argument,
        "--dout: no gradient to write (give --dq-out, --dk-out, --dv-out, --dsinks-out or --dbias-out)");
  if (!a.dsinks_out.empty() && !has_sinks)
    throw Error(ErrorCode::invalid_argument,
                "--dsinks-out: needs --sinks (a call without sinks has no dsinks)");
  if (!a.dbias_out.empty() && !has_bias)
    throw Error(ErrorCode::invalid_argument,
                "--dbias-out: needs --bias (a call without a bias has no dbias)");
  std::vector<std::pair<std::string, std::string>> seen;  // (path, flag)
  for (const std::string& p : forward_outputs)
    if (!p.empty()) seen.emplace_back(p, "a forward output");
  for (const auto& [flag, path] : grads) {
    if (path->empty()) continue;
    for (const auto& [p, other] : seen)
      if (p == *path)
        throw Error(ErrorCode::invalid_argument, std::string(flag) + ": '" + p + "' is also " + other);
    seen.emplace_back(*path, flag);
  }
}

GradientFiles run_backward(const Attention& attn, const TensorView& q, const TensorView& k,
                           const TensorView& v, const AttentionOutput& forward,
                           const AttentionOptions& options, const BackwardArgs& a) {
  const Tensor dout = read_npy(a.dout);
  AttentionGradients g = attn.backward(q, k, v, forward, dout, options);
  GradientFiles r;
  const auto add = [&](const std::string& path, const Tensor& t) {
    if (!path.empty()) r.files.emplace_back(path, Tensor::copy_of(t, DType::f32));
  };
  add(a.dq_out, g.dq);
  add(a.dk_out, g.dk);
  add(a.dv_out, g.dv);
  if (!a.dsinks_out.empty()) {
    if (!g.dsinks)
      throw Error(ErrorCode::internal, "the backward returned no dsinks although sinks were given");
    add(a.dsinks_out, *g.dsinks);
  }
  if (!a.dbias_out.empty()) {
    if (!g.dbias)
      throw Error(ErrorCode::internal, "the backward returned no dbias although a bias was given");
    add(a.dbias_out, *g.dbias);
  }
  r.decision = std::move(g.decision);
  return r;
}

std::vector<int> reserve_gradient_outputs(const BackwardArgs& a, OutputSet& outs) {
  const std::pair<const char*, const std::string*> grads[] = {{"--dq-out", &a.dq_out},
                                                              {"--dk-out", &a.dk_out},
                                                              {"--dv-out", &a.dv_out},
                                                              {"--dsinks-out", &a.dsinks_out},
                                                              {"--dbias-out", &a.dbias_out}};
  std::vector<int> files;
  if (!a.requested()) return files;
  for (const auto& [flag, path] : grads)
    if (!path->empty()) files.push_back(outs.add(*path, flag));
  return files;
}

void write_gradients(const GradientFiles& g, OutputSet& outs, const std::vector<int>& files) {
  if (files.size() != g.files.size())
    throw Error(ErrorCode::internal, "the backward produced " + std::to_string(g.files.size()) +
                                         " gradients for " + std::to_string(files.size()) + " outputs");
  for (std::size_t i = 0; i < files.size(); ++i)
    write_npy(outs.fd(files[i]), outs.name(files[i]), g.files[i].second);
}

}  // namespace attnops::cli
