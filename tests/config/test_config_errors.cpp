// Config errors: each kind is an Error(config_error) "FILE:LINE:COL: ..." that names the key
// path (io_error for files that cannot be read). Messages are compared whole: they are the
// user interface of a config file.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <string_view>

#include "attnops/config.h"
#include "attnops/error.h"

namespace attnops {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kSourceDir = ATTNOPS_SOURCE_DIR;

// The message of the config_error that parsing `text` (as file "x.yaml") must raise.
std::string config_error(std::string_view text, const std::string& source = "x.yaml") {
  try {
    parse_config(text, source);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return "";
}

TEST(ConfigErrors, MalformedYamlReportsTheParserMark) {
  EXPECT_EQ(config_error("backend: [gpu, cpu\nnum_threads: 2\n"),
            "x.yaml:2:12: malformed YAML: end of sequence flow not found");
  EXPECT_EQ(config_error("gpu: {device: 0\n"), "x.yaml:2:1: malformed YAML: end of map flow not found");
  EXPECT_EQ(config_error("attn_mechanism: \"x\\qy\""),
            "x.yaml:1:21: malformed YAML: unknown escape character: q");
  // A raw control byte quoted by yaml-cpp comes out escaped.
  EXPECT_EQ(config_error("attn_mechanism: \"x\\\x01\""),
            "x.yaml:1:21: malformed YAML: unknown escape character: \\x01");

  const std::string path = kSourceDir + "/tests/config/data/bad_indent.yaml";
  try {
    load_config(path);
    ADD_FAILURE() << "bad_indent.yaml loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_EQ(std::string(e.what()), path + ":4:2: malformed YAML: end of map not found");
  }
}

TEST(ConfigErrors, UnknownKeySuggestsTheNearestKey) {
  // The example of the contract, to the character.
  EXPECT_EQ(config_error("operators:\n blocksparse:\n  blocksize_qq: 64\n", "config/x.yaml"),
            "config/x.yaml:3:3: unknown key 'blocksize_qq' in 'operators.blocksparse'; did you mean "
            "'blocksize_q'?");
  EXPECT_EQ(config_error("num_thread: 4\n"),
            "x.yaml:1:1: unknown key 'num_thread' at the top level; did you mean "
            "'num_threads'?");
  // A transposition counts as one edit.
  EXPECT_EQ(config_error("backned: cpu\n"),
            "x.yaml:1:1: unknown key 'backned' at the top level; did you mean 'backend'?");
  EXPECT_EQ(config_error("gpu:\n  allow_sofware: true\n"),
            "x.yaml:2:3: unknown key 'allow_sofware' in 'gpu'; did you mean 'allow_software'?");
  EXPECT_EQ(config_error("operators:\n  flash_attn2:\n    fallbacks: {decode: true, noncausal: false}\n"),
            "x.yaml:3:31: unknown key 'noncausal' in 'operators.flash_attn2.fallbacks'; did you mean "
            "'non_causal'?");
}

TEST(ConfigErrors, UnknownKeyFromFile) {
  const std::string path = kSourceDir + "/tests/config/data/typo.yaml";
  try {
    load_config(path);
    ADD_FAILURE() << "typo.yaml loaded";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::config_error);
    EXPECT_EQ(std::string(e.what()),
              path +
                  ":6:7: unknown key 'non_casual' in 'operators.flash_attn2.fallbacks'; did "
                  "you mean 'non_causal'?");
  }
}

TEST(ConfigErrors, UnknownKeyFarFromEverythingListsTheKnownKeys) {
  EXPECT_EQ(config_error("gpu: {vendor: amd}"),
            "x.yaml:1:7: unknown key 'vendor' in 'gpu'; known keys: device, allow_software, pipeline_cache, cost_rates");
  EXPECT_EQ(config_error("operators: {vanilla: {zz: 1}}"),
            "x.yaml:1:23: unknown key 'zz' in 'operators.vanilla'; known keys: backend, disabled_backends, "
            "blocksize_q, blocksize_k, fallbacks");
}

TEST(ConfigErrors, MisplacedKeyNamesItsSection) {
  EXPECT_EQ(config_error("device: 0\n"),
            "x.yaml:1:1: unknown key 'device' at the top level ('device' belongs in "
            "the 'gpu' section)");
  EXPECT_EQ(
      config_error("fallbacks: {decode: true}\n"),
      "x.yaml:1:1: unknown key 'fallbacks' at the top level ('fallbacks' belongs in an 'operators.<name>' "
      "section)");
  EXPECT_EQ(config_error("operators:\n  blocksparse:\n    decode: false\n"),
            "x.yaml:3:5: unknown key 'decode' in 'operators.blocksparse' ('decode' belongs in an "
            "'operators.<name>.fallbacks' section)");
  EXPECT_EQ(
      config_error("operators:\n  blocksparse:\n    softmax_scale: 0.5\n"),
      "x.yaml:3:5: unknown key 'softmax_scale' in 'operators.blocksparse' ('softmax_scale' is only valid at "
      "the top level)");
  EXPECT_EQ(config_error("gpu:\n  backend: gpu\n"),
            "x.yaml:2:3: unknown key 'backend' in 'gpu' ('backend' belongs at the top level or in an "
            "'operators.<name>' section)");
}

TEST(ConfigErrors, WrongTypes) {
  EXPECT_EQ(config_error("operators:\n  flash_attn2:\n    fallbacks:\n      decode: maybe\n"),
            "x.yaml:4:15: operators.flash_attn2.fallbacks.decode: expected a boolean, got 'maybe'");
  EXPECT_EQ(config_error("gpu: {allow_software: 1}"),
            "x.yaml:1:23: gpu.allow_software: expected a boolean, got '1'");
  EXPECT_EQ(config_error("gpu: {allow_software: 'true'}"),
            "x.yaml:1:23: gpu.allow_software: expected a boolean, got the string 'true'");
  // A quoted number is a string.
  EXPECT_EQ(config_error("blocksize_q: \"128\""),
            "x.yaml:1:14: blocksize_q: expected an integer between 1 and 8192, got the string '128'");
  EXPECT_EQ(config_error("blocksize_k: 1.5"),
            "x.yaml:1:14: blocksize_k: expected an integer between 1 and 8192, got '1.5'");
  EXPECT_EQ(config_error("blocksize_k: 0x40"),
            "x.yaml:1:14: blocksize_k: expected an integer between 1 and 8192, got '0x40'");
  EXPECT_EQ(config_error("num_threads: [4]"),
            "x.yaml:1:14: num_threads: expected an integer >= 0, got a list");
  EXPECT_EQ(config_error("softmax_scale: {a: 1}"),
            "x.yaml:1:16: softmax_scale: expected a finite number > 0, got a map");
  EXPECT_EQ(config_error("attn_mechanism: [blocksparse]"),
            "x.yaml:1:17: attn_mechanism: expected an operator name, got a list");
  EXPECT_EQ(config_error("gpu: {device: [0]}"),
            "x.yaml:1:15: gpu.device: expected a device name or index, got a list");
  EXPECT_EQ(config_error("gpu: {pipeline_cache: {a: b}}"),
            "x.yaml:1:23: gpu.pipeline_cache: expected a file path, got a map");
  EXPECT_EQ(config_error("backend: {gpu: 1}"),
            "x.yaml:1:10: backend: expected auto, a backend name or a list of backend names, got a map");
  EXPECT_EQ(config_error("disabled_backends: {gpu: 1}"),
            "x.yaml:1:20: disabled_backends: expected a backend name or a list of backend names, got a map");
  EXPECT_EQ(config_error("backend: [cpu, [gpu]]"),
            "x.yaml:1:16: backend[1]: expected a backend name, got a list");
}

TEST(ConfigErrors, WrongSectionTypes) {
  EXPECT_EQ(config_error("gpu: 3"),
            "x.yaml:1:6: gpu: expected a map with keys device, allow_software, pipeline_cache, cost_rates, got '3'");
  EXPECT_EQ(config_error("operators: [blocksparse]"),
            "x.yaml:1:12: operators: expected a map of operator names to settings, got a list");
  EXPECT_EQ(
      config_error("operators:\n  blocksparse: fast\n"),
      "x.yaml:2:16: operators.blocksparse: expected a map with keys backend, disabled_backends, blocksize_q, "
      "blocksize_k, fallbacks, got 'fast'");
  EXPECT_EQ(config_error("operators: {blocksparse: {fallbacks: true}}"),
            "x.yaml:1:38: operators.blocksparse.fallbacks: expected a map with keys decode, non_causal, "
            "seq_multiple, got 'true'");
}

TEST(ConfigErrors, EmptyValueIsReportedAtItsKey) {
  // yaml-cpp marks an empty value at the start of the next line; the key is the useful place.
  EXPECT_EQ(config_error("backend: cpu\nblocksize_q:\nnum_threads: 2\n"),
            "x.yaml:2:1: blocksize_q: expected an integer between 1 and 8192, got an empty value");
  EXPECT_EQ(config_error("operators:\n  flash_attn2:\n    fallbacks:\n      decode:\n"),
            "x.yaml:4:7: operators.flash_attn2.fallbacks.decode: expected a boolean, got an empty value");
  EXPECT_EQ(config_error("attn_mechanism: ''"),
            "x.yaml:1:17: attn_mechanism: expected an operator name, got an "
            "empty string");
  EXPECT_EQ(config_error("backend: [cpu, ~]"),
            "x.yaml:1:10: backend[1]: expected a backend name, got an empty value");
}

TEST(ConfigErrors, WrongValues) {
  EXPECT_EQ(config_error("backend: cuda"),
            "x.yaml:1:10: backend: backend 'cuda' is not one of auto, native, cpu, gpu, "
            "tpu");
  EXPECT_EQ(
      config_error("operators:\n  blocksparse:\n    backend: [gpu, cuda]\n"),
      "x.yaml:3:20: operators.blocksparse.backend[1]: backend 'cuda' is not one of native, cpu, gpu, tpu");
  EXPECT_EQ(config_error("disabled_backends: auto"),
            "x.yaml:1:20: disabled_backends: backend 'auto' is not one of native, cpu, gpu, tpu");
  EXPECT_EQ(
      config_error("backend: [gpu, auto]"),
      "x.yaml:1:16: backend[1]: 'auto' cannot be combined with other backends; write 'backend: auto' alone");
  EXPECT_EQ(config_error("backend: [cpu, native, cpu]"),
            "x.yaml:1:24: backend[2]: backend 'cpu' is listed twice");
  EXPECT_EQ(config_error("disabled_backends:\n  - gpu\n  - gpu\n"),
            "x.yaml:3:5: disabled_backends[1]: backend 'gpu' is listed twice");
  EXPECT_EQ(config_error("runtime_dtype: i32"),
            "x.yaml:1:16: runtime_dtype: runtime_dtype 'i32' is not one of f32, "
            "f16, bf16");
  EXPECT_EQ(config_error("runtime_dtype: float32"),
            "x.yaml:1:16: runtime_dtype: runtime_dtype 'float32' is not one of f32, f16, bf16");
  for (const char* bad : {"0", "-0.5", ".inf", "-.inf", ".nan", "inf", "nan", "1e999", "abc", "0.1.2"}) {
    EXPECT_EQ(config_error(std::string("softmax_scale: ") + bad),
              std::string("x.yaml:1:16: softmax_scale: expected a finite number > 0, got '") + bad + "'");
  }
  EXPECT_EQ(config_error("blocksize_q: 0"),
            "x.yaml:1:14: blocksize_q: expected an integer between 1 and 8192, got '0' (out of range)");
  EXPECT_EQ(
      config_error("operators: {flash_attn2: {blocksize_k: 8193}}"),
      "x.yaml:1:40: operators.flash_attn2.blocksize_k: expected an integer between 1 and 8192, got '8193' "
      "(out of range)");
  EXPECT_EQ(
      config_error("blocksize_q: 99999999999999999999999"),
      "x.yaml:1:14: blocksize_q: expected an integer between 1 and 8192, got '99999999999999999999999' (out "
      "of range)");
  EXPECT_EQ(config_error("num_threads: -1"),
            "x.yaml:1:14: num_threads: expected an integer >= 0, got '-1' (out of "
            "range)");
  EXPECT_EQ(config_error("num_threads: 2147483648"),
            "x.yaml:1:14: num_threads: expected an integer >= 0, got '2147483648' (out of range)");
  EXPECT_EQ(config_error("gpu: {device: -1}"),
            "x.yaml:1:15: gpu.device: expected a device name or an index >= 0, got '-1'");
}

TEST(ConfigErrors, DuplicateKeys) {
  EXPECT_EQ(config_error("backend: cpu\nnum_threads: 2\nbackend: gpu\n"),
            "x.yaml:3:1: duplicate key 'backend' (first at line 1, column 1)");
  EXPECT_EQ(config_error("operators:\n  blocksparse:\n    blocksize_q: 64\n    blocksize_q: 128\n"),
            "x.yaml:4:5: duplicate key 'operators.blocksparse.blocksize_q' (first at line 3, column 5)");
  EXPECT_EQ(config_error("operators:\n  blocksparse: {}\n  blocksparse: {}\n"),
            "x.yaml:3:3: duplicate key 'operators.blocksparse' (first at line 2, column 3)");
  EXPECT_EQ(config_error("gpu: {device: 0, device: 1}"),
            "x.yaml:1:18: duplicate key 'gpu.device' (first at line 1, "
            "column 7)");
}

TEST(ConfigErrors, TopLevelMustBeAMap) {
  EXPECT_EQ(config_error("- backend\n- cpu\n"),
            "x.yaml:1:1: the top level must be a map of settings, got a list");
  EXPECT_EQ(config_error("blocksparse"),
            "x.yaml:1:1: the top level must be a map of settings, got 'blocksparse'");
}

TEST(ConfigErrors, OneDocumentOnly) {
  EXPECT_EQ(config_error("backend: cpu\n---\nbackend: gpu\n"),
            "x.yaml:3:1: a config file holds one YAML document, found 2");
  EXPECT_EQ(config_error("---\nbackend: cpu\n---\n---\nnum_threads: 1\n"),
            "x.yaml:5:1: a config file holds one YAML document, found 2");
}

TEST(ConfigErrors, KeysMustBeNames) {
  EXPECT_EQ(config_error("? [a, b]\n: 1\n"),
            "x.yaml:1:3: keys must be plain names, got a list as a key at the top "
            "level");
  EXPECT_EQ(config_error("gpu: {? {a: 1} : 2}"),
            "x.yaml:1:9: keys must be plain names, got a map as a key in 'gpu'");
}

TEST(ConfigErrors, ScalarsInMessagesAreEscapedAndShortened) {
  const std::string msg = config_error("backend: \"a\\tb\"");
  EXPECT_EQ(msg, "x.yaml:1:10: backend: backend 'a\\x09b' is not one of auto, native, cpu, gpu, tpu");
  const std::string long_msg = config_error("backend: " + std::string(500, 'z'));
  EXPECT_THAT(long_msg, HasSubstr("'" + std::string(40, 'z') + "...'"));
  EXPECT_LT(long_msg.size(), 200u);
}

TEST(ConfigErrors, MissingFileIsAnIoError) {
  const std::string path = kSourceDir + "/tests/config/data/no_such_file.yaml";
  try {
    load_config(path);
    ADD_FAILURE() << "loaded a missing file";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
    EXPECT_THAT(e.what(), StartsWith("cannot open config file '" + path + "'"));
    EXPECT_THAT(e.what(), HasSubstr("No such file or directory"));
  }
}

TEST(ConfigErrors, DirectoryIsAnIoError) {
  const std::string path = kSourceDir + "/tests/config/data";
  try {
    load_config(path);
    ADD_FAILURE() << "loaded a directory";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
    EXPECT_EQ(std::string(e.what()), "cannot read config file '" + path + "': it is a directory");
  }
}

}  // namespace
}  // namespace attnops
