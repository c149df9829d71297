// parse_config / load_config: every schema key lands in the right Config field.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "attnops/config.h"
#include "attnops/error.h"

namespace attnops {
namespace {

using ::testing::IsEmpty;

const std::string kSourceDir = ATTNOPS_SOURCE_DIR;

// A Config with nothing set, as an empty file must give.
void expect_unset(const Config& c) {
  EXPECT_FALSE(c.attn_mechanism);
  EXPECT_FALSE(c.backends);
  EXPECT_FALSE(c.disabled_backends);
  EXPECT_FALSE(c.runtime_dtype);
  EXPECT_FALSE(c.softmax_scale);
  EXPECT_FALSE(c.blocksize_q);
  EXPECT_FALSE(c.blocksize_k);
  EXPECT_FALSE(c.num_threads);
  EXPECT_FALSE(c.gpu_device);
  EXPECT_FALSE(c.gpu_allow_software);
  EXPECT_FALSE(c.gpu_pipeline_cache);
  EXPECT_THAT(c.operators, IsEmpty());
}

TEST(ConfigParse, EmptyAndCommentOnlyTextsAreEmptyConfigs) {
  for (const char* text : {"", "\n\n", "   \n", "# only a comment\n", "# one\n  # two\n\n", "---\n", "~\n",
                           "---\n# comment\n...\n", "---\n---\n"}) {
    SCOPED_TRACE(std::string("text: ") + text);
    const Config c = parse_config(text, "empty.yaml");
    EXPECT_EQ(c.source, "empty.yaml");
    expect_unset(c);
  }
}

TEST(ConfigParse, DefaultSourceNames) {
  EXPECT_EQ(Config{}.source, "<defaults>");
  EXPECT_EQ(parse_config("").source, "<string>");
}

TEST(ConfigParse, EveryKeyFromFile) {
  const std::string path = kSourceDir + "/tests/config/data/full.yaml";
  const Config c = load_config(path);
  EXPECT_EQ(c.source, path);
  EXPECT_EQ(c.attn_mechanism, "flash_attn2");
  EXPECT_EQ(c.backends, (std::vector<Backend>{Backend::gpu, Backend::cpu}));
  EXPECT_EQ(c.disabled_backends, std::vector<Backend>{Backend::tpu});
  EXPECT_EQ(c.runtime_dtype, DType::bf16);
  EXPECT_EQ(c.softmax_scale, 0.125);
  EXPECT_EQ(c.blocksize_q, 64);
  EXPECT_EQ(c.blocksize_k, 256);
  EXPECT_EQ(c.num_threads, 4);
  EXPECT_EQ(c.gpu_device, "1");
  EXPECT_EQ(c.gpu_allow_software, true);
  EXPECT_EQ(c.gpu_pipeline_cache, "/tmp/attnops-pipelines.bin");

  ASSERT_EQ(c.operators.size(), 2u);
  const OperatorConfig& bs = c.operators.at("blocksparse");
  EXPECT_EQ(bs.backends, std::vector<Backend>{Backend::cpu});
  EXPECT_EQ(bs.disabled_backends, (std::vector<Backend>{Backend::gpu, Backend::native}));
  EXPECT_EQ(bs.blocksize_q, 512);
  EXPECT_EQ(bs.blocksize_k, 1024);
  EXPECT_EQ(bs.fallbacks.decode, false);
  EXPECT_EQ(bs.fallbacks.non_causal, true);
  EXPECT_EQ(bs.fallbacks.seq_multiple, false);
  EXPECT_EQ(bs.line, 15);
  EXPECT_EQ(bs.column, 3);

  // Keys are kept as written (an alias here); the registry resolves them.
  const OperatorConfig& fl = c.operators.at("flash");
  EXPECT_EQ(fl.backends, std::vector<Backend>{});  // auto
  EXPECT_FALSE(fl.disabled_backends);
  EXPECT_FALSE(fl.blocksize_q);
  EXPECT_FALSE(fl.blocksize_k);
  EXPECT_FALSE(fl.fallbacks.decode);
  EXPECT_EQ(fl.fallbacks.non_causal, true);
  EXPECT_FALSE(fl.fallbacks.seq_multiple);
  EXPECT_EQ(fl.line, 21);
  EXPECT_EQ(fl.column, 3);
}

TEST(ConfigParse, BackendForms) {
  EXPECT_EQ(parse_config("backend: auto").backends, std::vector<Backend>{});
  EXPECT_EQ(parse_config("backend: native").backends, std::vector<Backend>{Backend::native});
  EXPECT_EQ(parse_config("backend: tpu").backends, std::vector<Backend>{Backend::tpu});
  EXPECT_EQ(parse_config("backend: [tpu, native, cpu, gpu]").backends,
            (std::vector<Backend>{Backend::tpu, Backend::native, Backend::cpu, Backend::gpu}));
  EXPECT_EQ(parse_config("backend:\n  - cpu\n  - native\n").backends,
            (std::vector<Backend>{Backend::cpu, Backend::native}));
  // An empty preference list is the auto order too.
  EXPECT_EQ(parse_config("backend: []").backends, std::vector<Backend>{});
  EXPECT_EQ(parse_config("backend: 'gpu'").backends, std::vector<Backend>{Backend::gpu});

  EXPECT_EQ(parse_config("disabled_backends: []").disabled_backends, std::vector<Backend>{});
  EXPECT_EQ(parse_config("disabled_backends: gpu").disabled_backends, std::vector<Backend>{Backend::gpu});
  EXPECT_EQ(parse_config("disabled_backends: [gpu, tpu]").disabled_backends,
            (std::vector<Backend>{Backend::gpu, Backend::tpu}));
}

TEST(ConfigParse, RuntimeDtypes) {
  EXPECT_EQ(parse_config("runtime_dtype: f32").runtime_dtype, DType::f32);
  EXPECT_EQ(parse_config("runtime_dtype: f16").runtime_dtype, DType::f16);
  EXPECT_EQ(parse_config("runtime_dtype: bf16").runtime_dtype, DType::bf16);
}

TEST(ConfigParse, BooleanSpellings) {
  for (const char* t : {"true", "True", "TRUE", "yes", "on"}) {
    EXPECT_EQ(parse_config(std::string("gpu: {allow_software: ") + t + "}").gpu_allow_software, true) << t;
  }
  for (const char* f : {"false", "False", "FALSE", "no", "off"}) {
    EXPECT_EQ(parse_config(std::string("gpu: {allow_software: ") + f + "}").gpu_allow_software, false) << f;
  }
}

TEST(ConfigParse, NumbersAtTheirLimits) {
  EXPECT_EQ(parse_config("blocksize_q: 1").blocksize_q, 1);
  EXPECT_EQ(parse_config("blocksize_k: 8192").blocksize_k, 8192);
  EXPECT_EQ(parse_config("blocksize_q: +32").blocksize_q, 32);
  // Decimal, not octal (yaml-cpp's own conversion would read 8).
  EXPECT_EQ(parse_config("blocksize_q: 010").blocksize_q, 10);
  EXPECT_EQ(parse_config("num_threads: 0").num_threads, 0);
  EXPECT_EQ(parse_config("num_threads: 2147483647").num_threads, 2147483647);
  EXPECT_EQ(parse_config("softmax_scale: 1").softmax_scale, 1.0);
  EXPECT_EQ(parse_config("softmax_scale: 2.5e-3").softmax_scale, 2.5e-3);
  EXPECT_EQ(parse_config("softmax_scale: 1e-300").softmax_scale, 1e-300);
}

TEST(ConfigParse, GpuDeviceIsANameOrAnIndex) {
  EXPECT_EQ(parse_config("gpu: {device: 0}").gpu_device, "0");
  EXPECT_EQ(parse_config("gpu: {device: NVIDIA H100}").gpu_device, "NVIDIA H100");
  EXPECT_EQ(parse_config("gpu: {device: \"\"}").gpu_device, "");
  EXPECT_EQ(parse_config("gpu: {device: '-1'}").gpu_device, "-1");  // quoted: a name, however odd
  EXPECT_EQ(parse_config("gpu: {pipeline_cache: ''}").gpu_pipeline_cache, "");
}

TEST(ConfigParse, EmptySectionsAreAllowed) {
  // A section whose keys are all commented out is an empty value, not an error.
  const Config c = parse_config("gpu:\n  # device: 0\noperators:\n  blocksparse:\n    # blocksize_q: 64\n");
  EXPECT_FALSE(c.gpu_device);
  ASSERT_EQ(c.operators.size(), 1u);
  const OperatorConfig& bs = c.operators.at("blocksparse");
  EXPECT_FALSE(bs.backends);
  EXPECT_FALSE(bs.blocksize_q);
  EXPECT_EQ(bs.line, 4);
  EXPECT_EQ(bs.column, 3);
  EXPECT_THAT(parse_config("operators:\n").operators, IsEmpty());
  EXPECT_THAT(parse_config("operators: {}\ngpu: {}\n").operators, IsEmpty());
  const Config f = parse_config("operators: {flash_attn2: {fallbacks: }}");
  EXPECT_FALSE(f.operators.at("flash_attn2").fallbacks.decode);
}

TEST(ConfigParse, OperatorPositionsAreOneBased) {
  const Config c = parse_config("operators:\n    vanilla: {}\n    flash_attn2: {blocksize_q: 64}\n");
  EXPECT_EQ(c.operators.at("vanilla").line, 2);
  EXPECT_EQ(c.operators.at("vanilla").column, 5);
  EXPECT_EQ(c.operators.at("flash_attn2").line, 3);
  EXPECT_EQ(c.operators.at("flash_attn2").column, 5);
  const Config flow = parse_config("operators: {a: {}, b: {}}");
  EXPECT_EQ(flow.operators.at("b").line, 1);
  EXPECT_EQ(flow.operators.at("b").column, 20);
}

TEST(ConfigParse, UnknownOperatorNamesAreKeptForTheRegistry) {
  const Config c = parse_config("operators:\n  no_such_op:\n    blocksize_q: 64\n");
  ASSERT_TRUE(c.operators.contains("no_such_op"));
  EXPECT_EQ(c.operators.at("no_such_op").blocksize_q, 64);
}

TEST(ConfigParse, AnchorsAndAliases) {
  const Config c = parse_config(
      "operators:\n"
      "  blocksparse: &tuned {blocksize_q: 64, fallbacks: {decode: false}}\n"
      "  flash_attn2: *tuned\n");
  EXPECT_EQ(c.operators.at("flash_attn2").blocksize_q, 64);
  EXPECT_EQ(c.operators.at("flash_attn2").fallbacks.decode, false);
  EXPECT_EQ(c.operators.at("blocksparse").blocksize_q, 64);
}

TEST(ConfigParse, DefaultYamlLoads) {
  const Config c = load_config(kSourceDir + "/config/default.yaml");
  EXPECT_EQ(c.attn_mechanism, "blocksparse");
  EXPECT_EQ(c.backends, std::vector<Backend>{});
  EXPECT_EQ(c.disabled_backends.value_or(std::vector<Backend>{Backend::gpu}), std::vector<Backend>{});
  // Values whose default depends on the inputs or the operator must be left out.
  EXPECT_FALSE(c.runtime_dtype);
  EXPECT_FALSE(c.softmax_scale);
  EXPECT_FALSE(c.blocksize_q);
  EXPECT_FALSE(c.blocksize_k);
  EXPECT_EQ(c.num_threads.value_or(0), 0);
  EXPECT_EQ(c.gpu_device.value_or(""), "");
  EXPECT_EQ(c.gpu_allow_software, false);
  EXPECT_EQ(c.gpu_pipeline_cache.value_or(""), "");
  ASSERT_TRUE(c.operators.contains("blocksparse"));
  ASSERT_TRUE(c.operators.contains("flash_attn2"));
  const FallbackOverrides& bs = c.operators.at("blocksparse").fallbacks;
  EXPECT_EQ(bs.decode, true);
  EXPECT_EQ(bs.non_causal, true);
  EXPECT_EQ(bs.seq_multiple, true);
  const FallbackOverrides& fa = c.operators.at("flash_attn2").fallbacks;
  EXPECT_EQ(fa.decode, true);
  EXPECT_EQ(fa.non_causal, false);
  EXPECT_EQ(fa.seq_multiple, false);
}

TEST(ConfigParse, EmptyExtraDocumentsAreIgnored) {
  EXPECT_EQ(parse_config("backend: cpu\n---\n").backends, std::vector<Backend>{Backend::cpu});
  EXPECT_EQ(parse_config("---\n---\nbackend: gpu\n...\n").backends, std::vector<Backend>{Backend::gpu});
}

TEST(ConfigParse, CrLfLineEndings) {
  const Config c = parse_config("backend: cpu\r\noperators:\r\n  blocksparse:\r\n    blocksize_q: 64\r\n");
  EXPECT_EQ(c.backends, std::vector<Backend>{Backend::cpu});
  EXPECT_EQ(c.operators.at("blocksparse").blocksize_q, 64);
  EXPECT_EQ(c.operators.at("blocksparse").line, 3);
}

}  // namespace
}  // namespace attnops
