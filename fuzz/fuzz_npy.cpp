// libFuzzer target: the .npy reader (cli/npy.h, parse_npy on an in-memory image).
// Contract: parse, or Error(io_error) naming the file; a parsed tensor serialises and reads back
// to the same dtype, shape and bytes (the reader never returns what it cannot describe).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

#include "attnops/tensor.h"
#include "cli/npy.h"
#include "fuzz/fuzz_contract.h"

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
  if (back.dtype() != t.dtype() || back.shape() != t.shape() || back.nbytes() != t.nbytes() ||
      (t.nbytes() > 0 && std::memcmp(back.data(), t.data(), t.nbytes()) != 0))
    fuzz::contract_violation("round trip changed the tensor", shape_string(t.shape()));
  return 0;
}
