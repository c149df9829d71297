#include "verify/report.h"

#include <sstream>

#include "verify/run_dist.h"

namespace attnops::verify {

namespace {

std::string env_prefix(const Target& t) {
  if (t.backend == Backend::cpu) return "ATTNOPS_CPU_ISA=" + t.kernel + " ";
  if (t.backend == Backend::gpu)
    return std::string("ATTNOPS_VK_ALLOW_SOFTWARE=1 ") +
           (t.kernel == "auto" ? "" : "ATTNOPS_VK_KERNEL=" + t.kernel + " ");
  return "";
}

std::string num(double x) {
  std::ostringstream os;
  os.precision(17);
  os << x;
  return os.str();
}

// .npy has no bf16: bf16 tensors are saved as f32 (exactly their values; `--dtype bf16` rounds
// them back to the same bits).
void save_tensor(const SaveNpy& save, const std::string& path, const TensorView& t) {
  if (t.dtype() == DType::bf16)
    save(path, Tensor::copy_of(t, DType::f32));
  else
    save(path, Tensor::copy_of(t));
}

std::string common_flags(const Target& t, DType dtype) {
  std::string s = " --backend " + std::string(backend_name(t.backend));
  if (t.backend != Backend::gpu) s += " --threads " + std::to_string(t.threads);
  if (dtype == DType::bf16) s += " --dtype bf16";
  return s;
}

}  // namespace

Shape7 shape_of(const DenseSpec& s) {
  return {s.B, s.Tq, s.Tk, s.Hq, s.Hkv, s.D, s.Dv};
}

std::string limits_flags(const Limits& l) {
  const Limits d;
  std::string s;
  if (l.max_work != d.max_work) s += " --work " + std::to_string(l.max_work);
  if (l.max_seq != d.max_seq) s += " --max-seq " + std::to_string(l.max_seq);
  if (l.nonfinite != d.nonfinite) s += " --no-nonfinite";
  if (!l.head_dims.empty()) {
    s += " --head-dims ";
    for (std::size_t i = 0; i < l.head_dims.size(); ++i) {
      if (i) s += ',';
      s += std::to_string(l.head_dims[i]);
    }
  }
  return s;
}

std::string replay_command(std::uint64_t seed, std::uint64_t index, const Target& t, const Limits& limits,
                           const std::optional<Shape7>& shape) {
  std::string s = "attnops verify --replay " + std::to_string(seed) + ":" + std::to_string(index) + " " +
                  t.flags() + limits_flags(limits);
  if (shape) {
    s += " --shape ";
    for (std::size_t i = 0; i < shape->size(); ++i) {
      if (i) s += ',';
      s += std::to_string((*shape)[i]);
    }
  }
  return s;
}

std::string failure_line(std::uint64_t seed, std::uint64_t index, const Finding& f, const Limits& limits) {
  return "MISMATCH seed=" + std::to_string(seed) + " case=" + std::to_string(index) + " " + f.target.text() +
         " | " + f.problem + " | " + f.mismatch.line() +
         " | replay: " + replay_command(seed, index, f.target, limits);
}

std::string save_dense_case(const DenseSpec& s, const Target& t, const std::string& dir, const SaveNpy& save,
                            const SaveText& save_text) {
  const DenseInputs in = materialize(s);
  const auto path = [&](const char* name) { return dir + "/" + name; };
  save_tensor(save, path("q.npy"), in.q);
  save_tensor(save, path("k.npy"), in.k);
  save_tensor(save, path("v.npy"), in.v);
  std::ostringstream yaml;
  yaml << "# the fuzzer's forced backend, block sizes, scale and fallbacks for this case\n"
       << "backend: " << backend_name(t.backend) << "\ndisabled_backends: [";
  bool first = true;
  for (Backend b : {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu})
    if (b != t.backend) yaml << (first ? "" : ", ") << backend_name(b), first = false;
  yaml << "]\n";
  if (s.scale) yaml << "softmax_scale: " << num(*s.scale) << "\n";
  if (s.bq) yaml << "blocksize_q: " << *s.bq << "\n";
  if (s.bk) yaml << "blocksize_k: " << *s.bk << "\n";
  if (t.backend == Backend::gpu) yaml << "gpu: {allow_software: true}\n";
  if (s.fallbacks_off) {
    yaml << "operators:\n";
    for (const char* op : {"blocksparse", "flash_attn2"})
      yaml << "  " << op << ": {fallbacks: {decode: false, non_causal: false, seq_multiple: false}}\n";
  }
  save_text(path("config.yaml"), yaml.str());
  std::string cmd = "attnops run --op " + t.op + " --config " + path("config.yaml") + " --q " +
                    path("q.npy") + " --k " + path("k.npy") + " --v " + path("v.npy") + " --out " +
                    path("out.npy") + " --lse-out " + path("lse.npy") + common_flags(t, s.dtype);
  if (!s.causal) cmd += " --no-causal";
  if (s.window) cmd += " --window " + std::to_string(s.window->left) + "," + std::to_string(s.window->right);
  if (s.chunk) cmd += " --chunk " + std::to_string(*s.chunk);
  if (s.soft_cap) cmd += " --soft-cap " + num(*s.soft_cap);
  if (in.sinks) save_tensor(save, path("sinks.npy"), *in.sinks), cmd += " --sinks " + path("sinks.npy");
  if (in.bias) save_tensor(save, path("bias.npy"), *in.bias), cmd += " --bias " + path("bias.npy");
  if (in.seg_q) {
    save_tensor(save, path("segment_ids_q.npy"), *in.seg_q);
    save_tensor(save, path("segment_ids_kv.npy"), *in.seg_kv);
    cmd +=
        " --segment-ids-q " + path("segment_ids_q.npy") + " --segment-ids-kv " + path("segment_ids_kv.npy");
  }
  if (s.return_weights && t.op == "vanilla" && t.pass == Pass::forward)
    cmd += " --weights-out " + path("weights.npy");
  if (t.pass == Pass::backward) {
    save_tensor(save, path("dout.npy"), in.dout);
    cmd += " --dout " + path("dout.npy") + " --dq-out " + path("dq.npy") + " --dk-out " + path("dk.npy") +
           " --dv-out " + path("dv.npy");
    if (in.sinks) cmd += " --dsinks-out " + path("dsinks.npy");
    if (in.bias) cmd += " --dbias-out " + path("dbias.npy");
  }
  std::string note;
  if (is_dist_op(t.op)) {  // the ranks of the case: the program runs them under mpirun
    const DistSpec d = draw_dist(s, t.op);
    if (!d.layout.empty()) cmd += " --layout " + d.layout;
    cmd = "mpirun -np " + std::to_string(d.ranks) +
          (t.backend == Backend::cpu ? " -x ATTNOPS_CPU_ISA " : " ") + cmd;
    note += " the local operator " + d.local_operator + ", progress rows and eager limit";
  }
  if (s.mask) note += " a Mask object (" + s.mask->build(s.Hq, s.Tq, s.Tk).key() + ")";
  for (const auto& l : s.layout)
    if (l.strided) note = note + (note.empty() ? "" : ";") + " strided views (saved contiguous)";
  if (!note.empty()) cmd += "   # not expressible as flags:" + note + "; use the replay command";
  return env_prefix(t) + cmd;
}

std::string save_paged_case(const PagedSpec& s, const Target& t, const std::string& dir,
                            const SaveNpy& save) {
  const PagedInputs in = materialize(s);
  const auto path = [&](const char* name) { return dir + "/" + name; };
  save_tensor(save, path("q.npy"), in.q);
  save_tensor(save, path("k_pages.npy"), in.pools[0].view);
  save_tensor(save, path("v_pages.npy"), in.pools[1].view);
  save_tensor(save, path("page_table.npy"), in.page_table);
  save_tensor(save, path("cu_seqlens_q.npy"), in.cu);
  save_tensor(save, path("kv_lens.npy"), in.kv_lens);
  std::string cmd = env_prefix(t) + "attnops run --op ragged_paged --q " + path("q.npy") + " --k-pages " +
                    path("k_pages.npy") + " --v-pages " + path("v_pages.npy") + " --page-table " +
                    path("page_table.npy") + " --cu-seqlens-q " + path("cu_seqlens_q.npy") + " --kv-lens " +
                    path("kv_lens.npy") + " --out " + path("out.npy") + " --lse-out " + path("lse.npy") +
                    common_flags(t, s.dtype);
  if (s.num_seqs >= 0) cmd += " --num-seqs " + std::to_string(s.num_seqs);
  if (s.kv_split_tokens) cmd += " --kv-split-tokens " + std::to_string(*s.kv_split_tokens);
  if (!s.causal) cmd += " --no-causal";
  if (s.window) cmd += " --window " + std::to_string(s.window->left) + "," + std::to_string(s.window->right);
  if (s.chunk) cmd += " --chunk " + std::to_string(*s.chunk);
  if (s.soft_cap) cmd += " --soft-cap " + num(*s.soft_cap);
  if (s.scale) cmd += " --scale " + num(*s.scale);
  if (in.sinks) save_tensor(save, path("sinks.npy"), *in.sinks), cmd += " --sinks " + path("sinks.npy");
  if (s.kv8) {  // the codes (int8 '|i1', e4m3 bit patterns '|u1') and their f32 scales
    save_tensor(save, path("k_scales.npy"), in.pools[2].view);
    save_tensor(save, path("v_scales.npy"), in.pools[3].view);
    cmd += " --kv-dtype " + std::string(dtype_name(*s.kv8)) + " --k-scales " + path("k_scales.npy") +
           " --v-scales " + path("v_scales.npy");
  }
  if (!s.share_prefixes) cmd += " --no-share-prefixes";
  return cmd;
}

}  // namespace attnops::verify
