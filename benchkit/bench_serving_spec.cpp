#include "benchkit/bench_serving_spec.h"

#include <yaml-cpp/yaml.h>

#include <tuple>

#include "attnops/error.h"
#include "core/printable.h"

namespace attnops::benchkit {

namespace {

using i64 = std::int64_t;

[[noreturn]] void bad(const std::string& file, const YAML::Node& n, const std::string& key,
                      const std::string& what) {
  throw Error(ErrorCode::config_error, file + ":" + std::to_string(n.Mark().line + 1) + ":" +
                                           std::to_string(n.Mark().column + 1) +
                                           ": serving: " + printable(key, 100) + ": " + printable(what, 400));
}

i64 positive(const std::string& file, const YAML::Node& n, const std::string& key, i64 limit) {
  if (!n.IsScalar()) bad(file, n, key, "expected a number");
  const i64 v = n.as<i64>();
  if (v < 1 || v > limit)
    bad(file, n, key, "expected 1.." + std::to_string(limit) + ", got " + std::to_string(v));
  return v;
}

// A number or a pair [lo, hi].
std::pair<i64, i64> range(const std::string& file, const YAML::Node& n, const std::string& key, i64 limit) {
  if (n.IsSequence()) {
    if (n.size() != 2) bad(file, n, key, "expected a number or [lo, hi]");
    const i64 lo = positive(file, n[0], key, limit), hi = positive(file, n[1], key, limit);
    if (hi < lo) bad(file, n, key, "expected lo <= hi");
    return {lo, hi};
  }
  const i64 v = positive(file, n, key, limit);
  return {v, v};
}

}  // namespace

std::vector<ServingRowSpec> parse_serving_rows(const YAML::Node& list, const std::string& file) {
  if (!list.IsSequence()) bad(file, list, "serving", "expected a list of rows");
  std::vector<ServingRowSpec> rows;
  for (const auto& node : list) {
    if (!node.IsMap()) bad(file, node, "serving", "expected a mapping per row (label, seqs, kv_len, ...)");
    ServingRowSpec r;
    for (const auto& kv : node) {
      if (!kv.first.IsScalar()) bad(file, kv.first, "key", "expected a name");
      const std::string key = kv.first.as<std::string>();
      const YAML::Node& v = kv.second;
      if (key == "label") {
        if (!v.IsScalar()) bad(file, v, key, "expected a string");
        r.label = v.as<std::string>();
      } else if (key == "seqs") {
        r.seqs = positive(file, v, key, 1 << 16);
      } else if (key == "kv_len") {
        std::tie(r.kv_min, r.kv_max) = range(file, v, key, i64{1} << 24);
      } else if (key == "q_len") {
        r.q_len = positive(file, v, key, i64{1} << 24);
      } else if (key == "prefill") {
        if (!v.IsMap()) bad(file, v, key, "expected {fraction: F, q_len: N}");
        for (const auto& p : v) {
          if (!p.first.IsScalar()) bad(file, p.first, key, "expected a name");
          const std::string pk = p.first.as<std::string>();
          if (pk == "fraction") {
            r.prefill_fraction = p.second.as<double>();
            if (!(r.prefill_fraction >= 0 && r.prefill_fraction <= 1))
              bad(file, p.second, "prefill.fraction", "expected 0..1");
          } else if (pk == "q_len") {
            r.prefill_q_len = positive(file, p.second, "prefill.q_len", i64{1} << 24);
          } else {
            bad(file, p.first, "prefill." + pk, "unknown key (expected fraction, q_len)");
          }
        }
      } else if (key == "heads") {
        if (!v.IsSequence() || v.size() != 2) bad(file, v, key, "expected [Hq, Hkv]");
        r.Hq = positive(file, v[0], key, 4096), r.Hkv = positive(file, v[1], key, 4096);
        if (r.Hq % r.Hkv != 0) bad(file, v, key, "Hq must be a multiple of Hkv");
      } else if (key == "head_dim") {
        r.D = positive(file, v, key, 4096);
      } else if (key == "page_size") {
        r.page_sizes.clear();
        if (v.IsSequence()) {
          for (const auto& e : v) r.page_sizes.push_back(positive(file, e, key, 1 << 20));
          if (r.page_sizes.empty()) bad(file, v, key, "expected at least one page size");
        } else {
          r.page_sizes.push_back(positive(file, v, key, 1 << 20));
        }
      } else if (key == "kv_split_tokens") {
        r.kv_split_tokens = positive(file, v, key, i64{1} << 40);
      } else if (key == "kv_dtype") {
        r.kv_dtypes.clear();
        const auto one = [&](const YAML::Node& e) -> std::optional<DType> {
          if (!e.IsScalar()) bad(file, e, key, "expected same, f32, f16, bf16, int8 or fp8_e4m3");
          const std::string name = e.as<std::string>();
          if (name == "same") return std::nullopt;
          const std::optional<DType> t = parse_dtype(name);
          if (!t || (!is_float(*t) && !is_kv8(*t)))
            bad(file, e, key, "expected same, f32, f16, bf16, int8 or fp8_e4m3");
          return t;
        };
        if (v.IsSequence())
          for (const auto& e : v) r.kv_dtypes.push_back(one(e));
        else
          r.kv_dtypes.push_back(one(v));
        if (r.kv_dtypes.empty()) bad(file, v, key, "expected at least one dtype");
      } else if (key == "scales") {
        if (!v.IsScalar() || (v.as<std::string>() != "per_token" && v.as<std::string>() != "per_tensor"))
          bad(file, v, key, "expected per_token or per_tensor");
        r.scales = v.as<std::string>() == "per_tensor" ? KVScales::per_tensor : KVScales::per_token;
      } else if (key == "shared_prefix") {
        r.shared_prefix = positive(file, v, key, i64{1} << 24);
      } else if (key == "share") {
        r.share.clear();
        const auto one = [&](const YAML::Node& e) {
          if (!e.IsScalar() || (e.as<std::string>() != "on" && e.as<std::string>() != "off"))
            bad(file, e, key, "expected on or off");
          return e.as<std::string>() == "on";
        };
        if (v.IsSequence())
          for (const auto& e : v) r.share.push_back(one(e));
        else
          r.share.push_back(one(v));
        if (r.share.empty()) bad(file, v, key, "expected on, off or [on, off]");
      } else if (key == "compare") {
        if (!v.IsScalar() || (v.as<std::string>() != "dense" && v.as<std::string>() != "none"))
          bad(file, v, key, "expected dense or none");
        r.compare_dense = v.as<std::string>() == "dense";
      } else {
        bad(file, kv.first, key,
            "unknown key (expected label, seqs, kv_len, q_len, prefill, heads, head_dim, page_size, "
            "kv_split_tokens, compare, kv_dtype, scales, shared_prefix, share)");
      }
    }
    if (r.compare_dense && (r.kv_min != r.kv_max || r.prefill_fraction > 0 || r.shared_prefix > 0))
      bad(file, node, "compare",
          "a dense comparison needs one kv_len for every sequence, no prefill and no shared_prefix");
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace attnops::benchkit
