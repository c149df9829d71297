// .npy files (NumPy's array format, versions 1.0, 2.0 and 3.0), read into attnops::Tensor.
//
// Read: little-endian, C order only.  '<f4' -> f32, '<f2' -> f16, '<f8' -> f32 (converted),
// '<i4' -> i32, '<i8' -> i64, '|i1' -> int8, '|u1' / '|b1' -> i32. Rank 0..4 (attnops tensors are at most
// 4-D). Anything else - Fortran order, big-endian, another dtype, a header whose length or content is wrong,
// a shape whose byte count overflows or disagrees with the file size, a truncated file - is an
// attnops::Error(io_error) whose message names the file and what is wrong (text from the header is shown with
// control bytes escaped). The reader never reads past the data it has checked is there. Write: version 1.0
// (2.0 only if the header would not fit), f32, f16 and i32 (bf16 is written as f32, since .npy has no bf16;
// i64 as '<i8'; int8 as '|i1'; fp8_e4m3 codes as '|u1').
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "attnops/tensor.h"

namespace attnops::cli {

// What a header says (exposed for tests and for messages).
struct NpyHeader {
  int major = 1, minor = 0;
  std::string descr;  // e.g. "<f4"
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes before the array data
};

// Parses and validates the header of an in-memory .npy image. `name` is used in messages.
NpyHeader parse_npy_header(std::string_view bytes, const std::string& name);

// Reads a whole .npy image (e.g. a file's content) into a tensor.
Tensor parse_npy(std::string_view bytes, const std::string& name);

// Reads the .npy file at `path`: preamble and header first (a header is at most 65535 bytes),
// then the declared size is checked against the file's size before anything is allocated, then
// the data is read straight into the tensor (no intermediate copy for <f4 <f2 <i4 <i8). Never
// reads more than the header declares (a pipe or device holding more is an error after one
// extra byte), so /dev/zero or a truncated header fails at once.
Tensor read_npy(const std::string& path);

// Serialises `t` (f32, f16, bf16 -> f32, i32, i64) as a .npy image.
std::string serialize_npy(const TensorView& t);
// Writes `t` as a .npy file to an open descriptor (`name` for messages): the header, then the
// data straight from t's memory when contiguous.
void write_npy(int fd, const std::string& name, const TensorView& t);
// Writes `path` all or nothing (a temporary file renamed into place; see output_set.h).
void write_npy(const std::string& path, const TensorView& t);

}  // namespace attnops::cli
