// YAML configuration: parse_config / load_config / Config::metadata_for (schema in config.h).
//
// The file is read with yaml-cpp's node API, then walked by hand against the schema so that
// every problem becomes an Error(config_error) "FILE:LINE:COL: ..." naming the full key path.
// We never call yaml-cpp's as<T>(): it throws on bad conversions, reads "010" as octal and
// accepts a quoted "128" as an integer. Scalars are converted here instead, strictly.
//
// Two yaml-cpp 0.7 behaviours shape the walker:
//  * duplicate mapping keys are kept (iteration sees both pairs), so we detect them ourselves;
//  * an anchor can be aliased inside itself (`x: &a [*a]`), which yields a cyclic node graph.
//    The walker therefore only descends into the fixed schema depth and never recurses into
//    arbitrary values (lists of backends must hold scalars; anything else is an error).
#include "attnops/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <span>
#include <sstream>
#include <system_error>
#include <utility>

#include "attnops/error.h"
#include "config/yaml_documents.h"
#include "core/printable.h"
#include "core/suggest.h"

namespace attnops {
namespace {

// Limits that are not in the header: block sizes beyond 8192 are certainly a typo (no kernel
// tiles that large), and they keep products like bq * bk far from overflow.
constexpr std::int64_t kMaxBlocksize = 8192;

using KeyList = std::span<const std::string_view>;
constexpr std::string_view kTopKeys[] = {
    "attn_mechanism", "backend",     "disabled_backends", "runtime_dtype", "softmax_scale",
    "blocksize_q",    "blocksize_k", "num_threads",       "gpu",           "operators"};
constexpr std::string_view kGpuKeys[] = {"device", "allow_software", "pipeline_cache", "cost_rates"};
constexpr std::string_view kRateKeys[] = {"cpu_gflops", "gpu_gflops", "upload_gbps", "download_gbps", "call_us"};
constexpr std::string_view kOperatorKeys[] = {"backend", "disabled_backends", "blocksize_q", "blocksize_k",
                                              "fallbacks"};
constexpr std::string_view kFallbackKeys[] = {"decode", "non_causal", "seq_multiple"};

// The maps of the schema; each has its own set of known keys.
enum class Section { top, gpu, rates, operators, op, fallbacks };

KeyList known_keys(Section s) {
  switch (s) {
    case Section::top:
      return kTopKeys;
    case Section::gpu:
      return kGpuKeys;
    case Section::rates:
      return kRateKeys;
    case Section::op:
      return kOperatorKeys;
    case Section::fallbacks:
      return kFallbackKeys;
    case Section::operators:
      break;
  }
  return {};  // operator names: checked by the registry, which knows them
}

constexpr std::array<Backend, 4> kBackends = {Backend::native, Backend::cpu, Backend::gpu, Backend::tpu};

std::string join(KeyList keys) {
  std::string out;
  for (std::string_view k : keys) {
    if (!out.empty()) out += ", ";
    out += k;
  }
  return out;
}

std::string backend_names(bool with_auto) {
  std::string out = with_auto ? "auto" : "";
  for (Backend b : kBackends) {
    if (!out.empty()) out += ", ";
    out += backend_name(b);
  }
  return out;
}

std::string quote(std::string_view s) {
  return "'" + printable(s, 40) + "'";
}

// Quoted scalars ("128", '1') carry yaml-cpp's non-specific tag "!": they are strings, never
// numbers or booleans.
bool is_quoted(const YAML::Node& n) {
  return n.Tag() == "!";
}

std::string describe(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
    case YAML::NodeType::Undefined:
      return "an empty value";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    case YAML::NodeType::Scalar:
      break;
  }
  return (is_quoted(n) ? "the string " : "") + quote(n.Scalar());
}

// The path appears in messages only; an operator name in it comes from the file, so it is
// escaped like any quoted text (fuzz/fuzz_config found a control byte echoed raw here).
std::string child_path(const std::string& parent, std::string_view key) {
  return parent.empty() ? printable(key, 40) : parent + "." + printable(key, 40);
}

// Walks one parsed document and fills a Config. Every error goes through fail().
class Walker {
 public:
  explicit Walker(std::string source) : source_(std::move(source)) {}

  [[noreturn]] void fail(const YAML::Mark& m, const std::string& message) const {
    throw Error(ErrorCode::config_error, position(m) + message);
  }
  // "path: message", the common form for a value that is wrong.
  [[noreturn]] void fail_at(const YAML::Mark& m, const std::string& path, const std::string& message) const {
    fail(m, path + ": " + message);
  }

  std::string position(const YAML::Mark& m) const {
    if (m.is_null()) return source_ + ":1:1: ";
    return source_ + ":" + std::to_string(m.line + 1) + ":" + std::to_string(m.column + 1) + ": ";
  }

  void walk(const YAML::Node& root, Config& c) {
    if (root.IsNull()) return;  // empty file, comments only, or an explicit `~`
    if (!root.IsMap()) fail(root.Mark(), "the top level must be a map of settings, got " + describe(root));

    for_each(root, "", Section::top, [&](std::string_view key, const Entry& e) {
      if (key == "attn_mechanism") {
        c.attn_mechanism = name(e, "an operator name");
      } else if (key == "backend") {
        c.backends = backend_list(e, /*allow_auto=*/true);
      } else if (key == "disabled_backends") {
        c.disabled_backends = backend_list(e, /*allow_auto=*/false);
      } else if (key == "runtime_dtype") {
        c.runtime_dtype = dtype(e);
      } else if (key == "softmax_scale") {
        c.softmax_scale = positive_number(e);
      } else if (key == "blocksize_q") {
        c.blocksize_q = integer(e, 1, kMaxBlocksize);
      } else if (key == "blocksize_k") {
        c.blocksize_k = integer(e, 1, kMaxBlocksize);
      } else if (key == "num_threads") {
        c.num_threads = static_cast<int>(integer(e, 0, std::numeric_limits<int>::max()));
      } else if (key == "gpu") {
        gpu(e, c);
      } else if (key == "operators") {
        operators(e, c);
      }
    });
  }

 private:
  // One `key: value` pair being read, with everything an error message needs.
  struct Entry {
    YAML::Node value;
    std::string path;  // full key path, e.g. operators.blocksparse.fallbacks.decode
    YAML::Mark key_mark;
    // Where a wrong value is reported: at the value, except for an empty value, whose mark
    // yaml-cpp puts at the start of the next line (so report the key instead).
    YAML::Mark value_mark() const {
      return value.IsNull() || value.Mark().is_null() ? key_mark : value.Mark();
    }
  };

  // Calls fn(key, entry) for each pair of `map` (which may be null: an empty section), after
  // checking that keys are strings, unique, and known (any name is accepted under operators:).
  template <class Fn>
  void for_each(const YAML::Node& map, const std::string& path, Section section, Fn&& fn) {
    const KeyList known = known_keys(section);
    std::map<std::string, YAML::Mark> seen;
    for (auto it = map.begin(); it != map.end(); ++it) {
      // Copies, not references: yaml-cpp's it->first lives in a temporary proxy.
      const YAML::Node k = it->first;
      if (!k.IsScalar()) {
        fail(k.Mark(), "keys must be plain names, got " + describe(k) + " as a key " + where(path));
      }
      const std::string& key = k.Scalar();
      const std::string full = child_path(path, key);
      if (auto [pos, inserted] = seen.emplace(key, k.Mark()); !inserted) {
        fail(k.Mark(), "duplicate key '" + full + "' (first at line " + std::to_string(pos->second.line + 1) +
                           ", column " + std::to_string(pos->second.column + 1) + ")");
      }
      if (section != Section::operators && !contains(known, key)) unknown_key(k.Mark(), key, path, section);
      fn(std::string_view(key), Entry{it->second, full, k.Mark()});
    }
  }

  static std::string where(const std::string& path) {
    return path.empty() ? std::string("at the top level") : "in '" + path + "'";
  }

  static bool contains(KeyList l, std::string_view key) {
    return std::find(l.begin(), l.end(), key) != l.end();
  }

  // Keys users put one level off (a gpu key at the top level, a top-level key in an operator
  // section): name the section where they belong, since edit distance cannot find it.
  static std::string misplaced_hint(std::string_view key, Section section) {
    const std::string k(key);
    if (section != Section::gpu && contains(kGpuKeys, key))
      return " ('" + k + "' belongs in the 'gpu' section)";
    if (section != Section::fallbacks && contains(kFallbackKeys, key)) {
      return " ('" + k + "' belongs in an 'operators.<name>.fallbacks' section)";
    }
    if (section != Section::op && key == "fallbacks")
      return " ('fallbacks' belongs in an 'operators.<name>' section)";
    if (section != Section::top && section != Section::op && contains(kOperatorKeys, key)) {
      return " ('" + k + "' belongs at the top level or in an 'operators.<name>' section)";
    }
    if (section != Section::top && contains(kTopKeys, key) && !contains(kOperatorKeys, key)) {
      return " ('" + k + "' is only valid at the top level)";
    }
    return "";
  }

  [[noreturn]] void unknown_key(const YAML::Mark& m, std::string_view key, const std::string& path,
                                Section section) const {
    const KeyList known = known_keys(section);
    std::string msg = "unknown key " + quote(key) + " " + where(path);
    if (std::string hint = misplaced_hint(key, section); !hint.empty()) fail(m, msg + hint);
    // The nearest known key, when it is close enough to be a plausible misspelling (the same
    // rule as the registry's "did you mean" for operator names).
    if (const auto best = nearest_name(key, std::vector<std::string>(known.begin(), known.end()))) {
      fail(m, msg + "; did you mean '" + *best + "'?");
    }
    fail(m, msg + "; known keys: " + join(known));
  }

  // --- scalar conversions -------------------------------------------------------------------

  // The text of a plain (unquoted) scalar that should be a number or boolean; errors otherwise.
  std::string plain_scalar(const Entry& e, const std::string& expected) const {
    if (!e.value.IsScalar() || is_quoted(e.value)) {
      fail_at(e.value_mark(), e.path, "expected " + expected + ", got " + describe(e.value));
    }
    return e.value.Scalar();
  }

  bool boolean(const Entry& e) const {
    const std::string s = plain_scalar(e, "a boolean");
    // YAML 1.1 spellings, as yaml-cpp reads them (true/false, yes/no, on/off in three cases).
    static const std::array<std::string_view, 9> kTrue = {"true", "True", "TRUE", "yes", "Yes",
                                                          "YES",  "on",   "On",   "ON"};
    static const std::array<std::string_view, 9> kFalse = {"false", "False", "FALSE", "no", "No",
                                                           "NO",    "off",   "Off",   "OFF"};
    if (std::find(kTrue.begin(), kTrue.end(), s) != kTrue.end()) return true;
    if (std::find(kFalse.begin(), kFalse.end(), s) != kFalse.end()) return false;
    fail_at(e.value_mark(), e.path, "expected a boolean, got " + describe(e.value));
  }

  std::int64_t integer(const Entry& e, std::int64_t lo, std::int64_t hi) const {
    const std::string range = hi == std::numeric_limits<int>::max()
                                  ? "an integer >= " + std::to_string(lo)
                                  : "an integer between " + std::to_string(lo) + " and " + std::to_string(hi);
    const std::string s = plain_scalar(e, range);
    // Decimal only, optional sign: "010" is ten, not eight as in yaml-cpp's conversion.
    std::string_view t = s;
    if (t.starts_with('+')) t.remove_prefix(1);
    std::int64_t v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (t.empty() || ec == std::errc::invalid_argument || end != t.data() + t.size()) {
      fail_at(e.value_mark(), e.path, "expected " + range + ", got " + describe(e.value));
    }
    if (ec == std::errc::result_out_of_range || v < lo || v > hi) {
      fail_at(e.value_mark(), e.path, "expected " + range + ", got " + quote(s) + " (out of range)");
    }
    return v;
  }

  double positive_number(const Entry& e) const {
    static const std::string kExpected = "a finite number > 0";
    const std::string s = plain_scalar(e, kExpected);
    std::string_view t = s;
    if (t.starts_with('+')) t.remove_prefix(1);
    double v = 0;
    const auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    // from_chars reads "inf"/"nan" (and YAML spells them ".inf"/".nan", which fail to parse):
    // both end up here, as does an out-of-range value like 1e999.
    if (t.empty() || ec != std::errc() || end != t.data() + t.size() || !std::isfinite(v) || !(v > 0)) {
      fail_at(e.value_mark(), e.path, "expected " + kExpected + ", got " + describe(e.value));
    }
    return v;
  }

  // Any scalar, quoted or not (a name may well look like a number).
  std::string string(const Entry& e, const std::string& expected) const {
    if (!e.value.IsScalar())
      fail_at(e.value_mark(), e.path, "expected " + expected + ", got " + describe(e.value));
    return e.value.Scalar();
  }

  std::string name(const Entry& e, const std::string& expected) const {
    std::string s = string(e, expected);
    if (s.empty()) fail_at(e.value_mark(), e.path, "expected " + expected + ", got an empty string");
    return s;
  }

  DType dtype(const Entry& e) const {
    const std::string s = name(e, "one of f32, f16, bf16");
    const std::optional<DType> t = parse_dtype(s);
    if (!t || !is_float(*t)) {
      fail_at(e.value_mark(), e.path, "runtime_dtype " + quote(s) + " is not one of f32, f16, bf16");
    }
    return *t;
  }

  Backend backend(const YAML::Node& n, const YAML::Mark& m, const std::string& path, bool allow_auto) const {
    if (!n.IsScalar()) fail_at(m, path, "expected a backend name, got " + describe(n));
    const std::string& s = n.Scalar();
    if (const std::optional<Backend> b = parse_backend(s)) return *b;
    if (s == "auto" && allow_auto) {
      fail_at(m, path, "'auto' cannot be combined with other backends; write 'backend: auto' alone");
    }
    fail_at(m, path, "backend " + quote(s) + " is not one of " + backend_names(/*with_auto=*/false));
  }

  // `auto` (backend: only) -> empty list; one name; or a list of distinct names.
  std::vector<Backend> backend_list(const Entry& e, bool allow_auto) const {
    const YAML::Node& v = e.value;
    if (v.IsScalar()) {
      if (allow_auto && v.Scalar() == "auto") return {};
      if (!parse_backend(v.Scalar())) {
        fail_at(e.value_mark(), e.path,
                "backend " + quote(v.Scalar()) + " is not one of " + backend_names(allow_auto));
      }
      return {*parse_backend(v.Scalar())};
    }
    if (!v.IsSequence()) {
      fail_at(e.value_mark(), e.path,
              std::string("expected ") + (allow_auto ? "auto, " : "") +
                  "a backend name or a list of backend names, got " + describe(v));
    }
    std::vector<Backend> out;
    std::size_t i = 0;
    for (auto it = v.begin(); it != v.end(); ++it, ++i) {
      const YAML::Node item = *it;
      const std::string item_path = e.path + "[" + std::to_string(i) + "]";
      const YAML::Mark m = item.IsNull() || item.Mark().is_null() ? e.value_mark() : item.Mark();
      const Backend b = backend(item, m, item_path, allow_auto);
      if (std::find(out.begin(), out.end(), b) != out.end()) {
        fail_at(m, item_path, "backend '" + std::string(backend_name(b)) + "' is listed twice");
      }
      out.push_back(b);
    }
    return out;
  }

  // --- sections -----------------------------------------------------------------------------

  // A section must be a map; an empty value (`gpu:` with everything below commented out) is an
  // empty section.
  void require_map(const Entry& e, const std::string& what) const {
    if (!e.value.IsMap() && !e.value.IsNull()) {
      fail_at(e.value_mark(), e.path, "expected " + what + ", got " + describe(e.value));
    }
  }

  void gpu(const Entry& section, Config& c) {
    require_map(section, "a map with keys " + join(kGpuKeys));
    for_each(section.value, section.path, Section::gpu, [&](std::string_view key, const Entry& e) {
      if (key == "device") {
        c.gpu_device = device(e);
      } else if (key == "allow_software") {
        c.gpu_allow_software = boolean(e);
      } else if (key == "pipeline_cache") {
        c.gpu_pipeline_cache = string(e, "a file path");
      } else if (key == "cost_rates") {
        require_map(e, "a map with keys " + join(kRateKeys));
        CostRates r;
        double* fields[] = {&r.cpu_gflops, &r.gpu_gflops, &r.upload_gbps, &r.download_gbps, &r.call_us};
        for_each(e.value, e.path, Section::rates, [&](std::string_view k, const Entry& x) {
          for (std::size_t i = 0; i < std::size(kRateKeys); ++i)
            if (k == kRateKeys[i]) *fields[i] = positive_number(x);
        });
        if (!r.valid())
          fail_at(e.value_mark(), e.path, "expected cpu_gflops, gpu_gflops, upload_gbps and download_gbps (call_us "
                                          "optional), all > 0");
        c.gpu_cost_rates = r;
      }
    });
  }

  // A name substring (any string, "" = best device) or a device index >= 0.
  std::string device(const Entry& e) const {
    const std::string s = string(e, "a device name or index");
    if (!is_quoted(e.value) && s.starts_with('-') && s.size() > 1 &&
        std::all_of(s.begin() + 1, s.end(), [](char ch) { return ch >= '0' && ch <= '9'; })) {
      fail_at(e.value_mark(), e.path, "expected a device name or an index >= 0, got " + quote(s));
    }
    return s;
  }

  void operators(const Entry& section, Config& c) {
    require_map(section, "a map of operator names to settings");
    // Operator names are not checked here: only the registry knows them (and their aliases).
    for_each(section.value, section.path, Section::operators, [&](std::string_view op_name, const Entry& op) {
      OperatorConfig oc;
      oc.line = op.key_mark.line + 1;
      oc.column = op.key_mark.column + 1;
      require_map(op, "a map with keys " + join(kOperatorKeys));
      for_each(op.value, op.path, Section::op, [&](std::string_view key, const Entry& e) {
        if (key == "backend") {
          oc.backends = backend_list(e, /*allow_auto=*/true);
        } else if (key == "disabled_backends") {
          oc.disabled_backends = backend_list(e, /*allow_auto=*/false);
        } else if (key == "blocksize_q") {
          oc.blocksize_q = integer(e, 1, kMaxBlocksize);
        } else if (key == "blocksize_k") {
          oc.blocksize_k = integer(e, 1, kMaxBlocksize);
        } else if (key == "fallbacks") {
          require_map(e, "a map with keys " + join(kFallbackKeys));
          for_each(e.value, e.path, Section::fallbacks, [&](std::string_view fb, const Entry& f) {
            if (fb == "decode") {
              oc.fallbacks.decode = boolean(f);
            } else if (fb == "non_causal") {
              oc.fallbacks.non_causal = boolean(f);
            } else if (fb == "seq_multiple") {
              oc.fallbacks.seq_multiple = boolean(f);
            }
          });
        }
      });
      c.operators[std::string(op_name)] = std::move(oc);
    });
  }

  std::string source_;
};

// Line and column just past the end of `text`, for yaml-cpp errors that carry no mark.
YAML::Mark end_mark(std::string_view text) {
  YAML::Mark m;
  m.pos = static_cast<int>(std::min<std::size_t>(text.size(), std::numeric_limits<int>::max()));
  for (char ch : text) {
    if (ch == '\n') {
      ++m.line;
      m.column = 0;
    } else {
      ++m.column;
    }
  }
  return m;
}

// Values can also come from code (Config is a plain struct): check them again before they
// reach an operator. `where` is "SOURCE: " or "SOURCE:LINE:COL: " with the key path prefix.
void check_values(const std::string& where, const std::optional<std::int64_t>& bq,
                  const std::optional<std::int64_t>& bk, const std::optional<std::vector<Backend>>& backends,
                  const std::optional<std::vector<Backend>>& disabled) {
  auto fail = [&](const std::string& msg) { throw Error(ErrorCode::config_error, where + msg); };
  auto check_bs = [&](const char* key, const std::optional<std::int64_t>& v) {
    if (v && (*v < 1 || *v > kMaxBlocksize)) {
      fail(std::string(key) + ": expected an integer between 1 and " + std::to_string(kMaxBlocksize) +
           ", got " + std::to_string(*v));
    }
  };
  auto check_unique = [&](const char* key, const std::optional<std::vector<Backend>>& v) {
    if (!v) return;
    for (std::size_t i = 0; i < v->size(); ++i) {
      if (std::find(v->begin(), v->begin() + static_cast<std::ptrdiff_t>(i), (*v)[i]) != v->begin() + i) {
        fail(std::string(key) + ": backend '" + std::string(backend_name((*v)[i])) + "' is listed twice");
      }
    }
  };
  check_bs("blocksize_q", bq);
  check_bs("blocksize_k", bk);
  check_unique("backend", backends);
  check_unique("disabled_backends", disabled);
}

}  // namespace

Config parse_config(std::string_view yaml_text, const std::string& source) {
  Config c;
  c.source = source;
  Walker w(c.source);
  std::vector<YAML::Node> docs;
  try {
    docs = load_yaml_documents(std::string(yaml_text));
  } catch (const YAML::Exception& e) {
    // e.msg is yaml-cpp's text without its own "error at line ..." prefix (ours replaces it);
    // it can quote a raw byte of the input ("unknown escape character: \x01").
    w.fail(e.mark.is_null() ? end_mark(yaml_text) : e.mark, "malformed YAML: " + printable(e.msg, 200));
  }
  // Empty documents (a stray trailing `---`) carry nothing; more than one real one is an error
  // rather than a silent "first one wins".
  std::erase_if(docs, [](const YAML::Node& d) { return d.IsNull(); });
  if (docs.size() > 1) {
    w.fail(docs[1].Mark(), "a config file holds one YAML document, found " + std::to_string(docs.size()));
  }
  if (docs.empty()) return c;  // empty, or comments only
  try {
    w.walk(docs[0], c);
  } catch (const YAML::Exception& e) {
    // Defensive: the walker avoids the throwing accessors, but any yaml-cpp throw must still
    // come out as a config_error, never escape as a foreign exception type.
    w.fail(e.mark, "malformed YAML: " + printable(e.msg, 200));
  }
  return c;
}

std::string read_yaml_file(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    throw Error(ErrorCode::io_error, "cannot read " + what + " '" + path + "': it is a directory");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw Error(ErrorCode::io_error,
                "cannot open " + what + " '" + path + "': " + std::generic_category().message(errno));
  }
  // At most kMaxConfigBytes + 1 bytes are read: /dev/zero or a runaway file is refused after a
  // bounded read, and yaml-cpp (which needs ~140 bytes of memory per byte of a file of many
  // keys) never sees more than the cap.
  std::string text(static_cast<std::size_t>(kMaxConfigBytes) + 1, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (in.bad()) throw Error(ErrorCode::io_error, "cannot read " + what + " '" + path + "'");
  text.resize(static_cast<std::size_t>(in.gcount()));
  if (text.size() > static_cast<std::size_t>(kMaxConfigBytes))
    throw Error(ErrorCode::config_error, path + ": a " + what + " holds at most " +
                                             std::to_string(kMaxConfigBytes) +
                                             " bytes (256 KiB); this one is larger");
  return text;
}

Config load_config(const std::string& path) {
  return parse_config(read_yaml_file(path, "config file"), path);
}

OperationMetadata Config::metadata_for(const std::string& canonical, const std::vector<std::string>& aliases,
                                       const OperationMetadata& defaults) const {
  check_values(source + ": ", blocksize_q, blocksize_k, backends, disabled_backends);
  if (softmax_scale && !(std::isfinite(*softmax_scale) && *softmax_scale > 0)) {
    throw Error(ErrorCode::config_error, source + ": softmax_scale: expected a finite number > 0, got " +
                                             std::to_string(*softmax_scale));
  }
  if (num_threads && *num_threads < 0) {
    throw Error(ErrorCode::config_error,
                source + ": num_threads: expected an integer >= 0, got " + std::to_string(*num_threads));
  }
  if (runtime_dtype && !is_float(*runtime_dtype)) {
    throw Error(ErrorCode::config_error, source + ": runtime_dtype: '" +
                                             std::string(dtype_name(*runtime_dtype)) +
                                             "' is not one of f32, f16, bf16");
  }

  OperationMetadata md = defaults;
  // Top-level keys apply to every operator...
  if (runtime_dtype) md.runtime_dtype = runtime_dtype;
  if (softmax_scale) md.softmax_scale = softmax_scale;
  if (blocksize_q) md.blocksize_q = blocksize_q;
  if (blocksize_k) md.blocksize_k = blocksize_k;
  if (backends) md.backends = *backends;
  if (disabled_backends) md.disabled_backends = *disabled_backends;
  if (num_threads) md.num_threads = *num_threads;
  if (gpu_device) md.gpu.device = *gpu_device;
  if (gpu_allow_software) md.gpu.allow_software = *gpu_allow_software;
  if (gpu_pipeline_cache) md.gpu.pipeline_cache = *gpu_pipeline_cache;
  if (gpu_cost_rates) md.gpu.cost_rates = *gpu_cost_rates;

  // ...then the operator's own section, under its canonical name or one alias (not two: which
  // one should win would be a guess).
  const std::string* found_name = nullptr;
  const OperatorConfig* section = nullptr;
  std::vector<std::string> names{canonical};
  names.insert(names.end(), aliases.begin(), aliases.end());
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (std::find(names.begin(), names.begin() + static_cast<std::ptrdiff_t>(i), names[i]) !=
        names.begin() + i) {
      continue;  // an alias listed twice, or equal to the canonical name
    }
    const auto it = operators.find(names[i]);
    if (it == operators.end()) continue;
    if (section) {
      // Report at whichever of the two comes later in the file.
      const OperatorConfig& later = it->second.line >= section->line ? it->second : *section;
      std::string pos =
          source +
          (later.line > 0 ? ":" + std::to_string(later.line) + ":" + std::to_string(later.column)
                          : std::string()) +
          ": ";
      throw Error(ErrorCode::config_error, pos + "operators: both 'operators." + *found_name + "' (line " +
                                               std::to_string(section->line) + ") and 'operators." +
                                               names[i] + "' (line " + std::to_string(it->second.line) +
                                               ") configure operator '" + canonical + "'; keep one");
    }
    found_name = &names[i];
    section = &it->second;
  }
  if (!section) return md;

  const std::string where =
      source +
      (section->line > 0 ? ":" + std::to_string(section->line) + ":" + std::to_string(section->column)
                         : std::string()) +
      ": operators." + *found_name + ".";
  check_values(where, section->blocksize_q, section->blocksize_k, section->backends,
               section->disabled_backends);
  // An operator section replaces (not merges with) the top-level lists, so that a section can
  // re-enable a backend the top level disabled with `disabled_backends: []`.
  if (section->backends) md.backends = *section->backends;
  if (section->disabled_backends) md.disabled_backends = *section->disabled_backends;
  if (section->blocksize_q) md.blocksize_q = section->blocksize_q;
  if (section->blocksize_k) md.blocksize_k = section->blocksize_k;
  // Fallback overrides change only the fields they set; the rest keep the operator's defaults.
  if (section->fallbacks.decode) md.fallbacks.decode = *section->fallbacks.decode;
  if (section->fallbacks.non_causal) md.fallbacks.non_causal = *section->fallbacks.non_causal;
  if (section->fallbacks.seq_multiple) md.fallbacks.seq_multiple = *section->fallbacks.seq_multiple;
  return md;
}

}  // namespace attnops
