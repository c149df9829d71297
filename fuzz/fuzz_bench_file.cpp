// libFuzzer target: the bench-file parser (benchkit/bench_spec.h: parse_bench_text, the YAML walk
// behind `attnops bench --file`) and the --shapes parser on the same bytes.
// Contract: parse into a spec that satisfies the documented ranges, or throw Error naming the
// input (config_error for the file, invalid_argument for --shapes).
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "attnops/dtype.h"
#include "benchkit/bench_spec.h"
#include "fuzz/fuzz_contract.h"

namespace {

void check_shape(const attnops::benchkit::BenchShape& s) {
  if (s.B < 1 || s.Hq < 1 || s.Hkv < 1 || s.Tq < 1 || s.Tk < 1 || s.D < 1 || s.Hq % s.Hkv != 0)
    attnops::fuzz::contract_violation("accepted a shape outside the documented range", s.label());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnops;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const benchkit::BenchSpec spec = benchkit::parse_bench_text(text, "fuzz.yaml");
    for (const benchkit::BenchShape& s : spec.shapes) check_shape(s);
    for (DType d : spec.dtypes)
      if (!is_float(d)) fuzz::contract_violation("accepted a non-float dtype", dtype_name(d));
    if (spec.causal.empty()) fuzz::contract_violation("accepted an empty causal mode", "");
    if (spec.repeats < 1 || spec.sgemm < 0) fuzz::contract_violation("accepted repeats < 1 or sgemm < 0", "");
  } catch (const Error& e) {
    // "bench file 'fuzz.yaml': ..." or "fuzz.yaml:LINE:COL: key: ...".
    fuzz::check_error(e, ErrorCode::config_error, "fuzz.yaml");
  }
  // The same bytes as a --shapes value ("B,H,T,D[,Hkv];..."); the message quotes the shape.
  try {
    for (const benchkit::BenchShape& s : benchkit::parse_bench_shapes(text)) check_shape(s);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::invalid_argument) fuzz::contract_violation("unexpected error code", e.what());
  }
  return 0;
}
