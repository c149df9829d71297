#include "benchkit/bench_spec.h"

#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cstdio>
#include <limits>

#include "attnops/config.h"
#include "attnops/decision.h"
#include "attnops/error.h"
#include "benchkit/parse.h"
#include "core/printable.h"

namespace attnops::benchkit {

std::string BenchShape::label() const {
  // Appends piece by piece: GCC 12 warns (-Wrestrict, a false positive) on "literal" + string.
  std::string s = "B";
  s += std::to_string(B);
  s += " H";
  s += std::to_string(Hq);
  if (Hkv != Hq) {
    s += '/';
    s += std::to_string(Hkv);
  }
  s += " T";
  s += std::to_string(Tq);
  if (Tk != Tq) {
    s += ':';
    s += std::to_string(Tk);
  }
  s += " D";
  s += std::to_string(D);
  return s;
}

BenchShape parse_bench_shape(std::string_view text) {
  const std::string what = "shape '" + std::string(text) + "'";
  const auto parts = split(text, ',');
  if (parts.size() != 4 && parts.size() != 5)
    throw Error(ErrorCode::invalid_argument, what + ": expected B,H,T,D or B,H,T,D,Hkv (T may be Tq:Tk)");
  BenchShape s;
  s.B = parse_integer(parts[0], what + " B");
  s.Hq = parse_integer(parts[1], what + " H");
  const auto t = split(parts[2], ':');
  if (t.size() > 2) throw Error(ErrorCode::invalid_argument, what + ": T is Tq or Tq:Tk");
  s.Tq = parse_integer(t[0], what + " Tq");
  s.Tk = t.size() == 2 ? parse_integer(t[1], what + " Tk") : s.Tq;
  s.D = parse_integer(parts[3], what + " D");
  s.Hkv = parts.size() == 5 ? parse_integer(parts[4], what + " Hkv") : s.Hq;
  if (s.B < 1 || s.Hq < 1 || s.Hkv < 1 || s.Tq < 1 || s.Tk < 1 || s.D < 1 || s.Hq % s.Hkv != 0)
    throw Error(ErrorCode::invalid_argument, what + ": every size must be >= 1 and H a multiple of Hkv");
  return s;
}

std::vector<BenchShape> parse_bench_shapes(std::string_view text) {
  std::vector<BenchShape> out;
  for (const std::string& piece : split(text, ';'))
    if (!piece.empty()) out.push_back(parse_bench_shape(piece));
  if (out.empty()) throw Error(ErrorCode::invalid_argument, "--shapes: no shape given");
  return out;
}

std::vector<bool> parse_causal_mode(std::string_view text) {
  if (text == "true" || text == "causal") return {true};
  if (text == "false" || text == "non_causal") return {false};
  if (text == "both") return {true, false};
  throw Error(ErrorCode::invalid_argument,
              "causal: expected true, false or both, got '" + std::string(text) + "'");
}

std::vector<Pass> parse_passes(std::string_view text) {
  if (text == "both") return {Pass::forward, Pass::backward};
  std::vector<Pass> out;
  for (const std::string& piece : split(text, ',')) {
    if (piece == "forward" || piece == "backward") {
      const Pass p = piece == "forward" ? Pass::forward : Pass::backward;
      if (std::find(out.begin(), out.end(), p) == out.end()) out.push_back(p);
    } else {
      throw Error(ErrorCode::invalid_argument,
                  "passes: expected forward, backward or both, got '" + std::string(text) + "'");
    }
  }
  return out;
}

namespace {

// a * b, saturating at UINT64_MAX.
std::uint64_t mul_sat(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_mul_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}
std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  std::uint64_t r = 0;
  return __builtin_add_overflow(a, b, &r) ? std::numeric_limits<std::uint64_t>::max() : r;
}

std::string human_bytes(std::uint64_t b) {
  const char* units[] = {"bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double x = static_cast<double>(b);
  int u = 0;
  while (x >= 1024 && u < 6) x /= 1024, ++u;
  char buf[48];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", x, units[u]);
  return buf;
}

}  // namespace

std::uint64_t bench_row_bytes(const BenchShape& s, DType dtype, Pass pass) {
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(x); };
  const std::uint64_t es = dtype_size(dtype);
  const std::uint64_t qo = mul_sat(mul_sat(mul_sat(u(s.B), u(s.Tq)), u(s.Hq)), u(s.D));   // q, out, dout, dq
  const std::uint64_t kv = mul_sat(mul_sat(mul_sat(u(s.B), u(s.Tk)), u(s.Hkv)), u(s.D));  // k, v, dk, dv
  const std::uint64_t lse = mul_sat(mul_sat(mul_sat(u(s.B), u(s.Hq)), u(s.Tq)), 4);
  const std::uint64_t copies = pass == Pass::backward ? 4 : 2;
  return add_sat(add_sat(mul_sat(mul_sat(qo, copies), es), mul_sat(mul_sat(kv, copies), es)), lse);
}

std::uint64_t serving_row_pages(const ServingRowSpec& r, std::int64_t page_size) {
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0)); };
  const std::uint64_t per_seq = u(r.kv_max) / u(page_size) + (u(r.kv_max) % u(page_size) != 0);
  return mul_sat(u(r.seqs), per_seq);
}

std::uint64_t serving_row_bytes(const ServingRowSpec& r, std::int64_t page_size, DType dtype) {
  const auto u = [](std::int64_t x) { return static_cast<std::uint64_t>(std::max<std::int64_t>(x, 0)); };
  const std::uint64_t es = dtype_size(dtype), pages = serving_row_pages(r, page_size);
  // Page ids three times (the shuffled free list, the page table, the plan's copy) and the pools.
  const std::uint64_t ids = mul_sat(pages, 3 * sizeof(std::int32_t));
  const std::uint64_t pools =
      mul_sat(mul_sat(mul_sat(mul_sat(pages, u(page_size)), u(r.Hkv)), mul_sat(u(r.D), 2)), es);
  // q and out: at most q_len (or prefill q_len) rows per sequence, never more than its keys.
  const std::uint64_t rows =
      mul_sat(u(r.seqs), std::min(u(r.kv_max), std::max(u(r.q_len), u(r.prefill_q_len))));
  const std::uint64_t qo = mul_sat(mul_sat(mul_sat(rows, u(r.Hq)), u(r.D)), mul_sat(es, 2));
  // compare: dense gathers the keys and values into dense tensors (seqs is 1 there).
  const std::uint64_t dense =
      r.compare_dense
          ? mul_sat(mul_sat(mul_sat(mul_sat(u(r.seqs), u(r.kv_max)), u(r.Hkv)), mul_sat(u(r.D), 2)), es)
          : 0;
  return add_sat(add_sat(ids, pools), add_sat(qo, dense));
}

std::uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return std::numeric_limits<std::uint64_t>::max();  // unknown: no limit
  return mul_sat(static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page));
}

void check_bench_size(const BenchSpec& spec, std::size_t ops, std::uint64_t memory_bytes) {
  const std::uint64_t factors[] = {ops,
                                   spec.backends.size(),
                                   spec.shapes.size(),
                                   spec.dtypes.size(),
                                   spec.causal.size(),
                                   spec.passes.size()};
  std::uint64_t rows = 1;
  std::string product;
  for (const std::uint64_t f : factors) {
    rows = mul_sat(rows, f);
    product += (product.empty() ? "" : " x ") + std::to_string(f);
  }
  if (rows > static_cast<std::uint64_t>(kMaxBenchRows))
    throw Error(ErrorCode::invalid_argument,
                "bench: the sweep has " + std::to_string(rows) +
                    " rows (operators x backends x shapes x dtypes x causal x passes = " + product +
                    "), more than the " + std::to_string(kMaxBenchRows) + " a run may have");
  const auto n = static_cast<std::uint64_t>(spec.sgemm);  // three n x n f32 matrices
  if (const std::uint64_t need = mul_sat(mul_sat(mul_sat(n, n), 3), 4); need > memory_bytes)
    throw Error(ErrorCode::out_of_memory, "bench: the SGEMM row (sgemm: " + std::to_string(n) + ") needs " +
                                              human_bytes(need) + ", more than this machine's " +
                                              human_bytes(memory_bytes) + " of memory");
  for (const BenchShape& s : spec.shapes)
    for (const DType d : spec.dtypes)
      for (const Pass p : spec.passes)
        if (const std::uint64_t need = bench_row_bytes(s, d, p); need > memory_bytes)
          throw Error(ErrorCode::out_of_memory,
                      "bench: shape " + s.label() + " " + std::string(dtype_name(d)) + " " +
                          std::string(pass_name(p)) + " needs at least " + human_bytes(need) +
                          " for its tensors, more than this machine's " + human_bytes(memory_bytes) +
                          " of memory");
  for (const ServingRowSpec& r : spec.serving)
    for (const std::int64_t page : r.page_sizes) {
      const std::string row =
          "bench: serving row '" + printable(r.label, 100) + "' page " + std::to_string(page);
      if (const std::uint64_t pages = serving_row_pages(r, page); pages > kMaxServingPages)
        throw Error(ErrorCode::invalid_argument,
                    row + ": " + std::to_string(r.seqs) + " sequences of up to " + std::to_string(r.kv_max) +
                        " keys take up to " + std::to_string(pages) + " pages, more than the " +
                        std::to_string(kMaxServingPages) + " an int32 page table can index");
      for (const DType d : spec.dtypes)
        if (const std::uint64_t need = serving_row_bytes(r, page, d); need > memory_bytes)
          throw Error(ErrorCode::out_of_memory,
                      row + " " + std::string(dtype_name(d)) + " needs at least " + human_bytes(need) +
                          " for its page pools, page ids and q, more than this machine's " +
                          human_bytes(memory_bytes) + " of memory");
    }
}

namespace {

// Keys and values quoted from the file are escaped (printable): no raw control bytes reach the
// terminal (found by fuzz/fuzz_bench_file).
[[noreturn]] void bad(const std::string& file, const YAML::Node& n, const std::string& key,
                      const std::string& what) {
  throw Error(ErrorCode::config_error, file + ":" + std::to_string(n.Mark().line + 1) + ":" +
                                           std::to_string(n.Mark().column + 1) + ": " + printable(key, 100) +
                                           ": " + printable(what, 400));
}

std::vector<std::string> strings(const std::string& file, const YAML::Node& n, const std::string& key) {
  std::vector<std::string> out;
  if (n.IsScalar()) return {n.as<std::string>()};
  if (!n.IsSequence()) bad(file, n, key, "expected a list");
  for (const auto& e : n) {
    if (!e.IsScalar()) bad(file, e, key, "expected a list of strings");
    out.push_back(e.as<std::string>());
  }
  return out;
}

// The schema walk shared by load_bench_file and parse_bench_text; `path` names the source.
BenchSpec bench_spec_from(const YAML::Node& root, const std::string& path) {
  BenchSpec spec;
  if (root.IsNull()) return spec;
  if (!root.IsMap())
    throw Error(ErrorCode::config_error, "bench file '" + path + "': expected a mapping at the top");
  for (const auto& kv : root) {
    // A key that is a list or a map would make as<std::string>() throw a yaml-cpp exception past
    // every handler below (found by fuzz/fuzz_bench_file: "[a]: 1").
    if (!kv.first.IsScalar())
      bad(path, kv.first, "key", "expected a name (ops, backends, ...), got a list or map");
    const std::string key = kv.first.as<std::string>();
    const YAML::Node& v = kv.second;
    try {
      if (key == "ops") {
        spec.ops = strings(path, v, key);
      } else if (key == "backends") {
        spec.backends = strings(path, v, key);
        for (const auto& b : spec.backends)  // validate now, with the file named
          if (b != "gpu_resident") parse_backend_list(b);
      } else if (key == "shapes") {
        spec.shapes.clear();
        for (const auto& s : strings(path, v, key)) spec.shapes.push_back(parse_bench_shape(s));
      } else if (key == "dtypes") {
        spec.dtypes.clear();
        for (const auto& s : strings(path, v, key)) {
          const auto d = parse_dtype(s);
          if (!d || !is_float(*d)) bad(path, v, key, "expected f32, f16 or bf16, got '" + s + "'");
          spec.dtypes.push_back(*d);
        }
      } else if (key == "causal") {
        spec.causal = parse_causal_mode(v.as<std::string>());
      } else if (key == "passes") {
        spec.passes.clear();
        for (const auto& x : strings(path, v, key))
          for (Pass p : parse_passes(x))
            if (std::find(spec.passes.begin(), spec.passes.end(), p) == spec.passes.end())
              spec.passes.push_back(p);
      } else if (key == "repeats") {
        spec.repeats = v.as<int>();
        if (spec.repeats < 1) bad(path, v, key, "expected >= 1");
      } else if (key == "sgemm") {
        spec.sgemm = v.as<int>();
        if (spec.sgemm < 0) bad(path, v, key, "expected >= 0");
      } else if (key == "serving") {
        spec.serving = parse_serving_rows(v, path);
      } else if (key == "read_bandwidth_mib") {
        spec.read_bandwidth_mib = v.as<int>();
        if (spec.read_bandwidth_mib < 1 || spec.read_bandwidth_mib > 65536)
          bad(path, v, key, "expected 1..65536");
      } else {
        bad(path, kv.first, key,
            "unknown key (expected ops, backends, shapes, dtypes, causal, passes, repeats, sgemm, serving, "
            "read_bandwidth_mib)");
      }
    } catch (const YAML::Exception& e) {
      bad(path, v, key, std::string("wrong type (") + printable(e.what(), 200) + ")");
    } catch (const Error& e) {
      if (e.code() == ErrorCode::config_error) throw;
      bad(path, v, key, e.what());
    }
  }
  return spec;
}

}  // namespace

BenchSpec load_bench_file(const std::string& path) {
  // Bounded (at most kMaxConfigBytes), then parsed as text.
  return parse_bench_text(read_yaml_file(path, "bench file"), path);
}

BenchSpec parse_bench_text(std::string_view yaml_text, const std::string& source) {
  YAML::Node root;
  try {
    root = YAML::Load(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    throw Error(ErrorCode::config_error, "bench file '" + source + "': " + printable(e.what()));
  }
  return bench_spec_from(root, source);
}

}  // namespace attnops::benchkit
