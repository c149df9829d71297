// Robustness: truncated, garbled and hostile variants of default.yaml must parse or raise
// Error(config_error) with a "SOURCE:LINE:COL: " prefix; never crash, hang, or let another
// exception type escape. Deterministic (fixed seeds), so a failure reproduces.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/config.h"
#include "attnops/error.h"

namespace attnops {
namespace {

const std::string kSourceDir = ATTNOPS_SOURCE_DIR;

std::string read_default_yaml() {
  std::ifstream in(kSourceDir + "/config/default.yaml", std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// "fuzz.yaml:LINE:COL: message", LINE and COL 1-based. (Checked by hand: std::regex drags
// GCC 12's -Wmaybe-uninitialized false positives into the build.)
bool has_position_prefix(std::string_view m) {
  constexpr std::string_view kSource = "fuzz.yaml:";
  if (!m.starts_with(kSource)) return false;
  m.remove_prefix(kSource.size());
  for (char end : {':', ':'}) {
    std::size_t digits = 0;
    while (digits < m.size() && m[digits] >= '0' && m[digits] <= '9') ++digits;
    if (digits == 0 || m[0] == '0' || digits >= m.size() || m[digits] != end) return false;
    m.remove_prefix(digits + 1);
  }
  return m.size() > 1 && m[0] == ' ';
}

struct Tally {
  int parsed = 0, rejected = 0;
};

// Parses `text`; success, or a config_error whose message starts with "fuzz.yaml:L:C: ".
// A parsed config must also merge into metadata without surprises.
void check(const std::string& text, Tally& tally) {
  try {
    const Config c = parse_config(text, "fuzz.yaml");
    ++tally.parsed;
    try {
      c.metadata_for("blocksparse", {"splash"}, OperationMetadata{});
    } catch (const Error& e) {
      // Only a canonical + alias pair is a legitimate error this late.
      EXPECT_EQ(e.code(), ErrorCode::config_error) << e.what();
    }
  } catch (const Error& e) {
    ++tally.rejected;
    EXPECT_EQ(e.code(), ErrorCode::config_error) << e.what() << "\n--- input:\n" << text;
    EXPECT_TRUE(has_position_prefix(e.what())) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "foreign exception: " << e.what() << "\n--- input:\n" << text;
  }
}

TEST(ConfigFuzz, PositionPrefixCheckerItself) {
  EXPECT_TRUE(has_position_prefix("fuzz.yaml:1:1: x"));
  EXPECT_TRUE(has_position_prefix("fuzz.yaml:12:305: unknown key"));
  EXPECT_FALSE(has_position_prefix("fuzz.yaml: x"));
  EXPECT_FALSE(has_position_prefix("fuzz.yaml:0:1: x"));  // 1-based
  EXPECT_FALSE(has_position_prefix("fuzz.yaml:3: x"));
  EXPECT_FALSE(has_position_prefix("other.yaml:1:1: x"));
  EXPECT_FALSE(has_position_prefix("fuzz.yaml:1:1:"));
}

TEST(ConfigFuzz, EveryTruncationOfDefaultYaml) {
  const std::string full = read_default_yaml();
  ASSERT_GT(full.size(), 500u);
  Tally t;
  for (std::size_t n = 0; n <= full.size(); ++n) check(full.substr(0, n), t);
  // Cutting inside a word ("attn_mechan") gives unknown keys: both outcomes must occur.
  EXPECT_GT(t.parsed, 0);
  EXPECT_GT(t.rejected, 0);
}

TEST(ConfigFuzz, ByteMutationsOfDefaultYaml) {
  const std::string full = read_default_yaml();
  // Bytes that mean something to YAML, plus a few that mean nothing to anyone.
  const std::string specials = std::string(":-[]{}\"'&*!|>?,#%@`\t\n\r ~") + '\0' + "\xff\xfe\x01" + "az09.";
  std::mt19937_64 rng(20261122);
  Tally t;
  for (int round = 0; round < 3000; ++round) {
    std::string s = full;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const std::size_t pos = rng() % s.size();
      const char c = specials[rng() % specials.size()];
      switch (rng() % 3) {
        case 0:
          s[pos] = c;
          break;
        case 1:
          s.insert(s.begin() + static_cast<std::ptrdiff_t>(pos), c);
          break;
        default:
          s.erase(pos, 1 + rng() % 8);
          break;
      }
      if (s.empty()) s.push_back('x');  // (not s = "x": GCC 12 -Wrestrict false positive)
    }
    check(s, t);
  }
  EXPECT_GT(t.rejected, 0);
}

TEST(ConfigFuzz, LineShufflesOfDefaultYaml) {
  const std::string full = read_default_yaml();
  std::vector<std::string> lines;
  std::istringstream in(full);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  std::mt19937_64 rng(7);
  Tally t;
  for (int round = 0; round < 500; ++round) {
    std::vector<std::string> v = lines;
    const std::size_t a = rng() % v.size(), b = rng() % v.size();
    switch (rng() % 4) {
      case 0:
        std::swap(v[a], v[b]);  // a key moves into another section
        break;
      case 1:
        v.insert(v.begin() + static_cast<std::ptrdiff_t>(a), v[b]);  // duplicates, usually
        break;
      case 2:
        v.erase(v.begin() + static_cast<std::ptrdiff_t>(a));
        break;
      default:
        v[a] = std::string(rng() % 5, ' ') + v[a];  // indentation goes wrong
        break;
    }
    std::string s;
    for (const std::string& l : v) s += l + "\n";
    check(s, t);
  }
  EXPECT_GT(t.parsed, 0);
  EXPECT_GT(t.rejected, 0);
}

TEST(ConfigFuzz, HostileInputs) {
  const std::vector<std::string> inputs = {
      // Deep nesting: yaml-cpp's depth guard must turn these into errors, not stack overflows.
      std::string(100000, '['),
      std::string(100000, '{'),
      [] {
        std::string s;
        for (int i = 0; i < 20000; ++i) s += "- ";
        return s + "x\n";
      }(),
      [] {
        std::string s = "operators:\n";
        for (int i = 1; i < 3000; ++i) s += std::string(static_cast<std::size_t>(i), ' ') + "k:\n";
        return s;
      }(),
      // An anchor aliased inside itself makes a cyclic node graph; the walker must not follow it.
      "backend: &a [*a]\n",
      "disabled_backends: &a [cpu, *a]\n",
      "operators: &a {blocksparse: *a}\n",
      "operators: &a\n  x: *a\n",
      "gpu: &a {device: *a}\n",
      "&a {operators: *a}\n",
      "x: *undefined_anchor\n",
      // Odd scalars and bytes.
      std::string("backend: cpu\0gpu\n", 17),
      "\xef\xbb\xbf"
      "backend: cpu\n",  // UTF-8 byte order mark
      "\xff\xfe\x00\x00",
      "backend: \xc3\x28\n",  // invalid UTF-8
      "softmax_scale: " + std::string(5000, '9') + "\n",
      "blocksize_q: -" + std::string(5000, '9') + "\n",
      "num_threads: 1e3\n",
      "%YAML 1.2\n---\nbackend: cpu\n",
      "%TAG ! tag:example.com,2000:\n---\nbackend: !foo cpu\n",
      "backend: !!binary aGVsbG8=\n",
      "? \n: \n",
      ": \n",
      "---\n---\n---\n",
      "...\n",
      "backend: |\n  cpu\n",
      "backend: >\n  cpu\n",
      "<<: {backend: cpu}\n",
      "[a, b]: c\n",
      std::string(1 << 16, '\n'),
      std::string(1 << 16, '#'),
  };
  Tally t;
  for (const std::string& s : inputs) check(s, t);
  EXPECT_GT(t.rejected, 0);
}

// Found by fuzz/fuzz_config: yaml-cpp 0.7's LoadAll loops forever, allocating, when a token
// follows a complete flow collection (config/yaml_documents.h). Each must be a config_error at
// the token; before the guard this test never finished.
TEST(ConfigFuzz, TokenAfterAFlowCollectionIsAnErrorNotAHang) {
  for (const char* text : {"{},", "[],", "{a: b},\n", "backend: [cpu]\n---\n{},"}) {
    try {
      parse_config(text, "fuzz.yaml");
      ADD_FAILURE() << "accepted: " << text;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::config_error) << e.what();
      EXPECT_TRUE(has_position_prefix(e.what())) << e.what();
      EXPECT_NE(std::string(e.what()).find("malformed YAML"), std::string::npos) << e.what();
    }
  }
}

// Found by fuzz/fuzz_config: an operator name with a control byte reached the key path of a
// later message raw ("in 'operators.bloc\x1cksparse.fallbacks'").
TEST(ConfigFuzz, KeyPathsEscapeControlBytes) {
  try {
    parse_config("operators:\n  bloc\x1bksparse:\n    fallbacks: {nope: true}\n", "fuzz.yaml");
    ADD_FAILURE() << "accepted";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("operators.bloc\\x1bksparse.fallbacks"), std::string::npos) << m;
    EXPECT_EQ(m.find('\x1b'), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace attnops
