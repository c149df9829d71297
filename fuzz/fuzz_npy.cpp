// libFuzzer target: the .npy reader (cli/npy.h, parse_npy on an in-memory image).
// Contract: parse, or Error(io_error) naming the file; a parsed tensor serialises and reads back
// to the same dtype, shape and values (the reader never returns what it cannot describe).
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "attnops/dtype.h"
#include "attnops/tensor.h"
#include "cli/npy.h"
#include "fuzz/fuzz_contract.h"

namespace {

// Bitwise equal, except that any NaN equals any NaN: a NaN's payload (the f16 bits 0xffff, say)
// need not survive the float conversion that serialisation goes through.
bool same_values(const attnops::Tensor& a, const attnops::Tensor& b) {
  if (!attnops::is_float(a.dtype()))
    return a.nbytes() == 0 || std::memcmp(a.data(), b.data(), a.nbytes()) == 0;
  for (std::size_t i = 0; i < static_cast<std::size_t>(a.numel()); ++i) {
    const float x = a.at(i), y = b.at(i);
    if (std::isnan(x) && std::isnan(y)) continue;
    if (std::bit_cast<std::uint32_t>(x) != std::bit_cast<std::uint32_t>(y)) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace attnops;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  Tensor t;
  try {
    t = cli::parse_npy(bytes, "fuzz.npy");
  } catch (const Error& e) {
    fuzz::check_error(e, ErrorCode::io_error, "fuzz.npy");
    return 0;
  }
  const std::string image = cli::serialize_npy(t);
  Tensor back;
  try {
    back = cli::parse_npy(image, "roundtrip.npy");
  } catch (const Error& e) {
    fuzz::contract_violation("a serialised tensor does not read back", e.what());
  }
  if (back.dtype() != t.dtype() || back.shape() != t.shape() || back.nbytes() != t.nbytes())
    fuzz::contract_violation("round trip changed the dtype or shape", shape_string(t.shape()));
  if (!same_values(t, back)) fuzz::contract_violation("round trip changed a value", shape_string(t.shape()));
  return 0;
}
