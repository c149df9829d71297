// Config::metadata_for: defaults, then top-level keys, then the operator's own section
// (canonical name or alias), with fallback overrides that touch only what they set.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "attnops/config.h"
#include "attnops/error.h"
#include "attnops/registry.h"

namespace attnops {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kSourceDir = ATTNOPS_SOURCE_DIR;
const std::vector<std::string> kSplash{"splash"};

// The built-in operator defaults as documented in metadata.h (blocksparse: every fallback on;
// flash_attn2: decode only), with a measured block size as operators set one.
OperationMetadata blocksparse_defaults() {
  OperationMetadata md;
  md.fallbacks.decode = md.fallbacks.non_causal = md.fallbacks.seq_multiple = true;
  md.blocksize_q = 128;
  md.blocksize_k = 128;
  return md;
}
OperationMetadata flash_defaults() {
  OperationMetadata md;
  md.fallbacks.decode = true;
  return md;
}

TEST(ConfigMetadata, EmptyConfigKeepsTheDefaults) {
  const OperationMetadata d = blocksparse_defaults();
  EXPECT_EQ(Config{}.metadata_for("blocksparse", kSplash, d), d);
  EXPECT_EQ(parse_config("# nothing\n").metadata_for("blocksparse", kSplash, d), d);
}

TEST(ConfigMetadata, TopLevelKeysApplyToEveryOperator) {
  const Config c = parse_config(
      "backend: [cpu, native]\n"
      "disabled_backends: [gpu]\n"
      "runtime_dtype: f16\n"
      "softmax_scale: 0.25\n"
      "blocksize_q: 32\n"
      "blocksize_k: 64\n"
      "num_threads: 3\n"
      "gpu: {device: Radeon, allow_software: yes, pipeline_cache: /var/cache/p.bin}\n"
      "attn_mechanism: vanilla\n");
  for (const char* op : {"blocksparse", "flash_attn2", "vanilla"}) {
    SCOPED_TRACE(op);
    const OperationMetadata md = c.metadata_for(op, {}, flash_defaults());
    EXPECT_EQ(md.backends, (std::vector<Backend>{Backend::cpu, Backend::native}));
    EXPECT_EQ(md.disabled_backends, std::vector<Backend>{Backend::gpu});
    EXPECT_EQ(md.runtime_dtype, DType::f16);
    EXPECT_EQ(md.runtime_softmax_dtype, DType::f32);
    EXPECT_EQ(md.softmax_scale, 0.25);
    EXPECT_EQ(md.blocksize_q, 32);
    EXPECT_EQ(md.blocksize_k, 64);
    EXPECT_EQ(md.num_threads, 3);
    EXPECT_EQ(md.gpu, (GpuSettings{"Radeon", true, "/var/cache/p.bin", std::nullopt}));
    EXPECT_EQ(md.fallbacks, flash_defaults().fallbacks);  // no operator section: untouched
  }
}

TEST(ConfigMetadata, OperatorSectionOverridesTheTopLevel) {
  const Config c = parse_config(
      "backend: gpu\n"
      "disabled_backends: [tpu]\n"
      "blocksize_q: 32\n"
      "blocksize_k: 32\n"
      "operators:\n"
      "  blocksparse:\n"
      "    backend: [cpu]\n"
      "    disabled_backends: []\n"  // re-enables tpu for this operator only
      "    blocksize_q: 256\n");
  const OperationMetadata bs = c.metadata_for("blocksparse", kSplash, blocksparse_defaults());
  EXPECT_EQ(bs.backends, std::vector<Backend>{Backend::cpu});
  EXPECT_EQ(bs.disabled_backends, std::vector<Backend>{});
  EXPECT_EQ(bs.blocksize_q, 256);
  EXPECT_EQ(bs.blocksize_k, 32);  // from the top level
  EXPECT_EQ(bs.fallbacks, blocksparse_defaults().fallbacks);

  const OperationMetadata fa = c.metadata_for("flash_attn2", {"flash"}, flash_defaults());
  EXPECT_EQ(fa.backends, std::vector<Backend>{Backend::gpu});
  EXPECT_EQ(fa.disabled_backends, std::vector<Backend>{Backend::tpu});
  EXPECT_EQ(fa.blocksize_q, 32);
}

TEST(ConfigMetadata, OperatorBackendAutoClearsATopLevelPreference) {
  const Config c = parse_config("backend: [native]\noperators: {flash_attn2: {backend: auto}}\n");
  EXPECT_EQ(c.metadata_for("flash_attn2", {}, flash_defaults()).backends, std::vector<Backend>{});
  EXPECT_EQ(c.metadata_for("blocksparse", {}, flash_defaults()).backends,
            std::vector<Backend>{Backend::native});
}

TEST(ConfigMetadata, FallbackOverridesChangeOnlyWhatTheySet) {
  const Config c = parse_config("operators:\n  blocksparse:\n    fallbacks: {non_causal: false}\n");
  const OperationMetadata md = c.metadata_for("blocksparse", kSplash, blocksparse_defaults());
  EXPECT_TRUE(md.fallbacks.decode);
  EXPECT_FALSE(md.fallbacks.non_causal);
  EXPECT_TRUE(md.fallbacks.seq_multiple);
  EXPECT_EQ(md.fallbacks.seq_multiple_of, 128);
  EXPECT_EQ(md.blocksize_q, 128);  // the operator's measured default survives

  const Config on = parse_config("operators: {flash_attn2: {fallbacks: {seq_multiple: true}}}");
  const OperationMetadata fa = on.metadata_for("flash_attn2", {"flash"}, flash_defaults());
  EXPECT_EQ(fa.fallbacks, (FallbackPolicy{true, false, true, 128}));
}

TEST(ConfigMetadata, AliasSectionAppliesToTheCanonicalOperator) {
  const Config c = parse_config(
      "operators:\n"
      "  splash:\n"
      "    blocksize_q: 512\n"
      "    fallbacks: {decode: false}\n");
  const OperationMetadata md = c.metadata_for("blocksparse", kSplash, blocksparse_defaults());
  EXPECT_EQ(md.blocksize_q, 512);
  EXPECT_FALSE(md.fallbacks.decode);
  EXPECT_TRUE(md.fallbacks.non_causal);
  // Another operator does not pick it up.
  EXPECT_EQ(c.metadata_for("flash_attn2", {"flash"}, flash_defaults()), flash_defaults());
}

TEST(ConfigMetadata, CanonicalAndAliasTogetherIsAnError) {
  const Config c = parse_config(
      "operators:\n"
      "  blocksparse:\n"
      "    blocksize_q: 64\n"
      "  splash:\n"
      "    blocksize_q: 512\n",
      "conf.yaml");
  try {
    c.metadata_for("blocksparse", kSplash, blocksparse_defaults());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_EQ(
        std::string(e.what()),
        "conf.yaml:4:3: operators: both 'operators.blocksparse' (line 2) and 'operators.splash' (line 4) "
        "configure operator 'blocksparse'; keep one");
  }
  // The conflict concerns blocksparse only.
  EXPECT_EQ(c.metadata_for("flash_attn2", {"flash"}, flash_defaults()), flash_defaults());
}

TEST(ConfigMetadata, TwoAliasesTogetherIsAnError) {
  const Config c = parse_config("operators:\n  flash: {}\n  fa2: {}\n", "c.yaml");
  try {
    c.metadata_for("flash_attn2", {"flash", "fa2"}, flash_defaults());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_THAT(e.what(),
                StartsWith("c.yaml:3:3: operators: both 'operators.flash' (line 2) and 'operators.fa2'"));
  }
  // An alias repeated (or equal to the canonical name) is one name, not a conflict.
  EXPECT_NO_THROW(c.metadata_for("flash", {"flash"}, flash_defaults()));
}

TEST(ConfigMetadata, DefaultYamlGivesTheBuiltInDefaults) {
  const Config c = load_config(kSourceDir + "/config/default.yaml");
  EXPECT_EQ(c.metadata_for("blocksparse", kSplash, blocksparse_defaults()), blocksparse_defaults());
  EXPECT_EQ(c.metadata_for("flash_attn2", {"flash"}, flash_defaults()), flash_defaults());
  EXPECT_EQ(c.metadata_for("vanilla", {}, OperationMetadata{}), OperationMetadata{});
  // From bare metadata, the file alone sets the documented fallbacks.
  EXPECT_EQ(c.metadata_for("blocksparse", kSplash, OperationMetadata{}).fallbacks,
            (FallbackPolicy{true, true, true, 128}));
  EXPECT_EQ(c.metadata_for("flash_attn2", {"flash"}, OperationMetadata{}).fallbacks,
            (FallbackPolicy{true, false, false, 128}));
}

// The same check against the operators as registered: default.yaml must describe what the
// library actually does, so a change to an operator's defaults shows up here.
TEST(ConfigMetadata, DefaultYamlMatchesTheRegisteredOperators) {
  const Config c = load_config(kSourceDir + "/config/default.yaml");
  Registry& r = registry();
  const std::vector<std::string> names = r.list();
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    SCOPED_TRACE(name);
    const OperationEntry e = r.entry(name);
    EXPECT_EQ(c.metadata_for(e.name, e.aliases, e.defaults), e.defaults);
  }
  ASSERT_TRUE(c.attn_mechanism);
  EXPECT_EQ(r.canonical(*c.attn_mechanism), "blocksparse");
}

// End to end: a config reaches the operators the registry builds, and the operator keys'
// positions recorded by the parser end up in the registry's errors.
TEST(ConfigMetadata, RegistryBuildsOperatorsFromTheConfig) {
  const Config c = parse_config(
      "num_threads: 2\n"
      "operators:\n"
      "  splash:\n"
      "    blocksize_q: 64\n"
      "    fallbacks: {seq_multiple: false}\n",
      "e2e.yaml");
  const Attention a = registry().get("blocksparse", c);
  EXPECT_EQ(a.name(), "blocksparse");
  EXPECT_EQ(a.metadata().blocksize_q, 64);
  EXPECT_EQ(a.metadata().num_threads, 2);
  EXPECT_TRUE(a.metadata().fallbacks.decode);
  EXPECT_FALSE(a.metadata().fallbacks.seq_multiple);

  const Config typo = parse_config("backend: cpu\noperators:\n  blocksprase: {}\n", "e2e.yaml");
  try {
    registry().get("blocksparse", typo);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_THAT(e.what(), StartsWith("e2e.yaml:3:3: unknown operator 'blocksprase'"));
  }
}

TEST(ConfigMetadata, ValuesSetInCodeAreCheckedToo) {
  auto error_of = [](const Config& c) -> std::string {
    try {
      c.metadata_for("blocksparse", kSplash, blocksparse_defaults());
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::config_error);
      return e.what();
    }
    return "no error";
  };
  Config c;
  c.softmax_scale = std::numeric_limits<double>::quiet_NaN();
  EXPECT_THAT(error_of(c), StartsWith("<defaults>: softmax_scale: expected a finite number > 0"));
  c = Config{};
  c.num_threads = -2;
  EXPECT_EQ(error_of(c), "<defaults>: num_threads: expected an integer >= 0, got -2");
  c = Config{};
  c.runtime_dtype = DType::i64;
  EXPECT_EQ(error_of(c), "<defaults>: runtime_dtype: 'i64' is not one of f32, f16, bf16");
  c = Config{};
  c.backends = std::vector<Backend>{Backend::cpu, Backend::cpu};
  EXPECT_EQ(error_of(c), "<defaults>: backend: backend 'cpu' is listed twice");
  c = Config{};
  c.operators["splash"].blocksize_k = 0;
  EXPECT_EQ(error_of(c),
            "<defaults>: operators.splash.blocksize_k: expected an integer between 1 and 8192, got 0");
  // A section parsed from a file keeps its position in the message.
  c = parse_config("operators:\n  splash: {blocksize_q: 8}\n", "f.yaml");
  c.operators["splash"].blocksize_q = 9000;
  EXPECT_THAT(error_of(c),
              HasSubstr("f.yaml:2:3: operators.splash.blocksize_q: expected an integer between 1"));
}

}  // namespace
}  // namespace attnops
