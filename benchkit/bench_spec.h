// What `attnops bench` sweeps: operators x backends x shapes x dtypes x causal, from flags or a
// YAML bench file (flags win). Bench file schema (every key optional):
//
//   ops: [vanilla, blocksparse, flash_attn2]   # default: every registered operator
//   backends: [auto]                            # each entry: auto or native|cpu|gpu|tpu
//   shapes: ["1,8,512,64", "1,8,1:2048,64,2"]   # B,Hq,T,D[,Hkv]; T is Tq=Tk or Tq:Tk
//   dtypes: [f32]                               # f32|f16|bf16
//   causal: both                                # true | false | both
//   passes: [forward, backward]                 # forward | backward | both (default forward)
//   repeats: 3                                  # timed runs per row (the median is reported)
//   sgemm: 1024                                 # size n of the n x n x n Eigen SGEMM row; 0 = none
//   serving: [...]                              # paged serving rows (bench_serving_spec.h)
//   read_bandwidth_mib: 1024                    # buffer the serving rows' read-bandwidth loop reads
//                                               # (default: max(256 MiB, 4 x the last-level cache))
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/decision.h"
#include "attnops/dtype.h"
#include "benchkit/bench_serving_spec.h"

namespace attnops::benchkit {

struct BenchShape {
  std::int64_t B = 1, Hq = 8, Hkv = 8, Tq = 512, Tk = 512, D = 64;
  std::string label() const;  // "B1 H8/2 T512:1024 D64" (Hkv and Tk shown when they differ)
};

struct BenchSpec {
  std::vector<std::string> ops;  // empty = every registered operator
  std::vector<std::string> backends{"auto"};
  std::vector<BenchShape> shapes;
  std::vector<DType> dtypes{DType::f32};
  std::vector<bool> causal{true};
  std::vector<Pass> passes{Pass::forward};
  int repeats = 3;
  int sgemm = 1024;
  std::vector<ServingRowSpec> serving;  // ragged batches over a paged cache (bench_serving.h)
  int read_bandwidth_mib = 0;           // the serving rows' yardstick's buffer (read_bandwidth.h);
                                        // 0: sized from the last-level cache
};

// "B,H,T,D[,Hkv]" with T = "Tq" or "Tq:Tk". Error(invalid_argument) naming the text otherwise.
BenchShape parse_bench_shape(std::string_view text);
// "B,H,T,D;B,H,T,D;..."
std::vector<BenchShape> parse_bench_shapes(std::string_view text);
// "true"/"causal" -> {true}; "false"/"non_causal" -> {false}; "both" -> {true, false}.
std::vector<bool> parse_causal_mode(std::string_view text);

// "forward" | "backward" | "both", or a comma-separated list of the first two.
std::vector<Pass> parse_passes(std::string_view text);

// A sweep is sized before anything is allocated or timed (a few KiB of bench file can name a
// million rows, one shape terabytes): at most kMaxBenchRows rows, and no row whose tensors
// alone exceed the machine's memory.
inline constexpr std::int64_t kMaxBenchRows = 100000;

// The bytes of a row's tensors: q, k, v, out, lse, and for a backward row also dout, dq, dk,
// dv; saturating at UINT64_MAX. A lower bound of what the row allocates.
std::uint64_t bench_row_bytes(const BenchShape& s, DType dtype, Pass pass);

// A serving row at one page size: at most seqs * ceil(kv_max / page_size) pages (page ids are
// int32: at most kMaxServingPages), and the bytes of its host tensors (page pools, page ids, q and
// out, the dense copy of `compare: dense`), saturating. Upper bounds, known before the batch is drawn.
inline constexpr std::uint64_t kMaxServingPages = 2147483647;
std::uint64_t serving_row_pages(const ServingRowSpec& r, std::int64_t page_size);
std::uint64_t serving_row_bytes(const ServingRowSpec& r, std::int64_t page_size, DType dtype);

// Checks the sweep of `spec` over `ops` operators: Error(invalid_argument) naming the product
// when it has more than kMaxBenchRows rows; Error(out_of_memory) naming the shape (or the serving
// row) when a row needs more than `memory_bytes` (the physical memory, physical_memory_bytes());
// Error(invalid_argument) naming the serving row whose pages an int32 page table cannot index.
void check_bench_size(const BenchSpec& spec, std::size_t ops, std::uint64_t memory_bytes);
std::uint64_t physical_memory_bytes();

// Reads a bench file; Error(config_error) naming the file and the key for a wrong value.
BenchSpec load_bench_file(const std::string& path);
// The same for a bench file's text already in memory (the fuzz target's entry); `source` names
// it in messages.
BenchSpec parse_bench_text(std::string_view yaml_text, const std::string& source);

}  // namespace attnops::benchkit
