// Unit tests of the .npy reader/writer: round trips, every supported version and dtype, and one
// test per malformed input (each must be an io_error naming the file, never a crash).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "attnops/attnops.h"
#include "cli/npy.h"
#include "tests/cli/npy_image.h"

namespace attnops::cli {
namespace {

using ::testing::HasSubstr;

using testing::npy_image;

std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// Expects parse_npy to throw io_error whose message names the file and contains `what`.
void expect_io_error(const std::string& bytes, const std::string& what) {
  try {
    parse_npy(bytes, "case.npy");
    ADD_FAILURE() << "no error; expected one mentioning '" << what << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
    EXPECT_THAT(e.what(), HasSubstr("case.npy"));
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
}

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/attnops_npy_XXXXXX";
    path_ = ::mkdtemp(tmpl);
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

TEST(Npy, RoundTripF32) {
  TempDir dir;
  Tensor t(DType::f32, {2, 3, 1, 4});
  for (std::size_t i = 0; i < 24; ++i) t.set(i, 0.25f * static_cast<float>(i) - 3.f);
  write_npy(dir.file("a.npy"), t);
  const Tensor r = read_npy(dir.file("a.npy"));
  ASSERT_EQ(r.dtype(), DType::f32);
  ASSERT_EQ(r.shape(), t.shape());
  EXPECT_EQ(std::memcmp(r.data(), t.data(), t.nbytes()), 0);
}

TEST(Npy, RoundTripF16I32I64) {
  Tensor h(DType::f16, {5});
  for (std::size_t i = 0; i < 5; ++i) h.set(i, 0.5f * static_cast<float>(i));
  Tensor rh = parse_npy(serialize_npy(h), "h.npy");
  ASSERT_EQ(rh.dtype(), DType::f16);
  EXPECT_EQ(std::memcmp(rh.data(), h.data(), h.nbytes()), 0);

  Tensor i32(DType::i32, {2, 2});
  for (int i = 0; i < 4; ++i) i32.data_as<std::int32_t>()[i] = -7 + 5 * i;
  Tensor ri = parse_npy(serialize_npy(i32), "i.npy");
  ASSERT_EQ(ri.dtype(), DType::i32);
  ASSERT_EQ(ri.shape(), i32.shape());
  EXPECT_EQ(std::memcmp(ri.data(), i32.data(), i32.nbytes()), 0);

  Tensor i64(DType::i64, {3});
  i64.data_as<std::int64_t>()[2] = std::int64_t{1} << 40;
  Tensor rl = parse_npy(serialize_npy(i64), "l.npy");
  ASSERT_EQ(rl.dtype(), DType::i64);
  EXPECT_EQ(rl.data_as<std::int64_t>()[2], std::int64_t{1} << 40);
}

TEST(Npy, Bf16IsWrittenAsF32) {
  Tensor b(DType::bf16, {3});
  b.set(0, 1.5f);
  b.set(1, -2.f);
  b.set(2, 0.f);
  const std::string img = serialize_npy(b);
  EXPECT_THAT(img, HasSubstr("'<f4'"));
  const Tensor r = parse_npy(img, "b.npy");
  ASSERT_EQ(r.dtype(), DType::f32);
  EXPECT_EQ(r.at(0), 1.5f);
  EXPECT_EQ(r.at(1), -2.f);
}

TEST(Npy, WrittenHeaderIsNumpyStyle) {
  Tensor t(DType::f32, {7});
  const std::string img = serialize_npy(t);
  EXPECT_EQ(img[6], 1);  // version 1.0
  EXPECT_EQ(img[7], 0);
  EXPECT_THAT(img, HasSubstr("'shape': (7,)"));
  const NpyHeader h = parse_npy_header(img, "t.npy");
  EXPECT_EQ(h.data_offset % 64, 0u);
  EXPECT_EQ(img.size(), h.data_offset + 28);
}

TEST(Npy, ScalarAndEmptyShapes) {
  const Tensor s =
      parse_npy(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (), }", floats({4.f})), "s");
  EXPECT_EQ(s.rank(), 0);
  EXPECT_EQ(s.at(0), 4.f);
  const Tensor e =
      parse_npy(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 3), }", ""), "e");
  EXPECT_EQ(e.numel(), 0);
  EXPECT_EQ(parse_npy(serialize_npy(e), "e2").shape(), (std::vector<std::int64_t>{0, 3}));
}

TEST(Npy, Versions2And3) {
  for (int major : {2, 3}) {
    const Tensor t = parse_npy(
        npy_image(major, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1.f, 2.f})),
        "v");
    ASSERT_EQ(t.numel(), 2) << "version " << major;
    EXPECT_EQ(t.at(1), 2.f);
  }
}

TEST(Npy, KeysInAnyOrderDoubleQuotesNoTrailingComma) {
  const Tensor t = parse_npy(
      npy_image(1, R"({"shape": (1, 2), "fortran_order": False, "descr": "<f4"})", floats({1.f, 2.f})), "k");
  EXPECT_EQ(t.shape(), (std::vector<std::int64_t>{1, 2}));
}

TEST(Npy, F64IsConvertedToF32) {
  std::string data(16, '\0');
  const double v[2] = {0.1, -3.5};
  std::memcpy(data.data(), v, 16);
  const Tensor t =
      parse_npy(npy_image(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (2,), }", data), "d");
  ASSERT_EQ(t.dtype(), DType::f32);
  EXPECT_EQ(t.at(0), 0.1f);
  EXPECT_EQ(t.at(1), -3.5f);
}

TEST(Npy, BytesAndBoolsBecomeI32) {
  for (const char* d : {"|u1", "|b1"}) {
    const Tensor t =
        parse_npy(npy_image(1, std::string("{'descr': '") + d + "', 'fortran_order': False, 'shape': (3,), }",
                            std::string("\x01\x00\xff", 3)),
                  "u");
    ASSERT_EQ(t.dtype(), DType::i32);
    EXPECT_EQ(t.data_as<std::int32_t>()[0], 1);
    EXPECT_EQ(t.data_as<std::int32_t>()[2], 255);
  }
}

TEST(NpyMalformed, FortranOrder) {
  expect_io_error(npy_image(1, "{'descr': '<f4', 'fortran_order': True, 'shape': (2,), }", floats({1, 2})),
                  "Fortran");
}

TEST(NpyMalformed, BigEndian) {
  expect_io_error(npy_image(1, "{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2})),
                  "big-endian");
}

TEST(NpyMalformed, UnsupportedDtype) {
  expect_io_error(npy_image(1, "{'descr': '<c8', 'fortran_order': False, 'shape': (1,), }", floats({1, 2})),
                  "unsupported dtype '<c8'");
  expect_io_error(npy_image(1, "{'descr': '|O', 'fortran_order': False, 'shape': (1,), }", floats({1, 2})),
                  "unsupported dtype");
}

TEST(NpyMalformed, HeaderLengthLies) {
  std::string img = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2}));
  img[8] = '\xff';
  img[9] = '\xff';  // claims 65535 header bytes
  expect_io_error(img, "header claims 65535 bytes");
  std::string img2 =
      npy_image(2, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2}));
  img2[11] = '\x7f';  // ~2 GiB header: refused by the header limit before anything is read
  expect_io_error(img2, "exceeds the 65535-byte limit");
}

TEST(NpyMalformed, HeaderLengthTooShortCutsTheDictionary) {
  std::string img = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2}));
  img[8] = 20;  // header ends inside the dictionary
  img[9] = 0;
  expect_io_error(img, "malformed header");
}

TEST(NpyMalformed, ShapeByteCountOverflows) {
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4611686018427387904, 4), }", ""),
      "64 bits");
  expect_io_error(
      npy_image(1, "{'descr': '<f8', 'fortran_order': False, 'shape': (3074457345618258602, 1), }", ""),
      "64 bits");
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,), }", ""),
      "too large");
}

TEST(NpyMalformed, ShapeDisagreesWithFileSize) {
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", floats({1, 2, 3, 4})),
      "trailing bytes");
}

TEST(NpyMalformed, TruncatedData) {
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1000, 1000), }", floats({1, 2})),
      "truncated");
}

TEST(NpyMalformed, TruncatedPreambleAndEmpty) {
  expect_io_error(std::string("\x93NUMPY\x02\x00\x10", 9), "not a .npy");
  expect_io_error(std::string("\x93NUMPY\x02\x00\x10\x00", 10), "truncated in the header length");
  expect_io_error("", "not a .npy");
}

TEST(NpyMalformed, Garbage) {
  expect_io_error("this is not an array, just text that goes on for a while", "not a .npy");
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), } junk", floats({1, 2})),
      "unexpected text");
  expect_io_error(npy_image(1, "{'descr': '<f4', 'fortran_order': Maybe, 'shape': (2,), }", floats({1, 2})),
                  "True or False");
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2, -1), }", floats({1, 2})),
      "non-negative");
  expect_io_error(npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2), }", floats({1, 2})),
                  "trailing comma");
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1}", floats({1, 2})),
      "unexpected key 'x'");
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (2,)}", floats({1, 2})),
      "duplicate key");
  expect_io_error(npy_image(1, "{'descr': '<f4, 'fortran_order': False, 'shape': (2,)}", floats({1, 2})),
                  "malformed header");
}

TEST(NpyMalformed, MissingKey) {
  expect_io_error(npy_image(1, "{'descr': '<f4', 'shape': (2,), }", floats({1, 2})), "no 'fortran_order'");
  expect_io_error(npy_image(1, "{'fortran_order': False, 'shape': (2,), }", floats({1, 2})), "no 'descr'");
  expect_io_error(npy_image(1, "{'descr': '<f4', 'fortran_order': False}", floats({1, 2})), "no 'shape'");
}

TEST(NpyMalformed, UnsupportedVersion) {
  std::string img = npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (2,), }", floats({1, 2}));
  img[6] = 9;
  expect_io_error(img, "version 9.0");
}

TEST(NpyMalformed, RankAboveFour) {
  expect_io_error(
      npy_image(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (1, 1, 1, 1, 2), }", floats({1, 2})),
      "rank 5");
}

TEST(NpyMalformed, EveryTruncationOfAValidFileFails) {
  // Cutting a valid file anywhere must give an io_error, never a crash or a short read.
  Tensor t(DType::f32, {2, 3});
  const std::string img = serialize_npy(t);
  for (std::size_t n = 0; n < img.size(); ++n) {
    EXPECT_THROW(parse_npy(img.substr(0, n), "cut.npy"), Error) << "cut at " << n;
  }
}

TEST(NpyMalformed, RandomCorruptionsAreIoErrorsOrValidArrays) {
  // Flip bytes of a valid image (header and data) with a fixed generator: every result must be
  // either an array whose data fits the image or an io_error, never a crash or an overread
  // (this test also runs under AddressSanitizer).
  Tensor t(DType::f32, {2, 3, 4});
  const std::string valid = serialize_npy(t);
  std::uint64_t s = 42;
  int errors = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    std::string img = valid;
    for (int flips = 0; flips < 3; ++flips) {
      s = s * 6364136223846793005ull + 1442695040888963407ull;
      const std::size_t at = (s >> 33) % 80;  // the preamble and the header
      img[at] = static_cast<char>(s >> 25);
    }
    try {
      const Tensor r = parse_npy(img, "fuzz.npy");
      EXPECT_LE(static_cast<std::size_t>(r.numel()), img.size());  // >= 1 file byte per element
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::io_error);
      ++errors;
    }
  }
  EXPECT_GT(errors, 1000);  // most corruptions of the header are caught
}

TEST(NpyFiles, MissingFileAndDirectory) {
  TempDir dir;
  try {
    read_npy(dir.file("nope.npy"));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
    EXPECT_THAT(e.what(), HasSubstr("nope.npy"));
    EXPECT_THAT(e.what(), HasSubstr("cannot open"));
  }
  try {
    read_npy(dir.file(""));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("directory"));
  }
  EXPECT_THROW(write_npy(dir.file("no/such/dir/x.npy"), Tensor(DType::f32, {1})), Error);
}

// A shape number of 19+ digits overflowed the signed multiply in the header parser (UBSan) and
// came out as a negative dimension in a message naming no file.
TEST(NpyHeaderNumbers, HugeDimensionsAreRejectedBeforeOverflowing) {
  for (const char* n : {"4611686018427387905", "9223372036854775807", "18446744073709551617",
                        "99999999999999999999999999999"}) {
    SCOPED_TRACE(n);
    expect_io_error(
        npy_image(1, std::string("{'descr': '<f4', 'fortran_order': False, 'shape': (") + n + ", 2), }", ""),
        "dimension too large");
  }
}

// Header text in messages has its control bytes escaped (an ESC sequence in descr or in a key
// must not reach the terminal).
TEST(NpyHeaderText, ControlBytesAreEscapedInMessages) {
  for (const std::string& header :
       {std::string("{'descr': '\x1b]0;pwned\x07', 'fortran_order': False, 'shape': (1,), }"),
        std::string("{'\x1b[2J': 1, 'descr': '<f4', 'fortran_order': False, 'shape': (1,), }")}) {
    try {
      parse_npy(npy_image(1, header, std::string(4, '\0')), "esc.npy");
      ADD_FAILURE() << "no error";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.find('\x1b'), std::string::npos) << what;
      EXPECT_THAT(what, HasSubstr("\\x1b"));
    }
  }
}

// read_npy reads the preamble and header first and never more than the header declares: an
// endless stream fails at once, a stream with more data than declared fails after one byte.
TEST(NpyFiles, StreamsAreReadOnlyAsFarAsDeclared) {
  try {
    read_npy("/dev/zero");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::io_error);
    EXPECT_THAT(e.what(), HasSubstr("magic"));
  }
  TempDir dir;
  const std::string fifo = dir.file("pipe.npy");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const bool extra : {false, true}) {
    Tensor t(DType::f32, {2, 3});
    for (std::size_t i = 0; i < 6; ++i) t.set(i, static_cast<float>(i));
    const std::string img = serialize_npy(t) + (extra ? std::string(100, 'x') : std::string());
    std::thread writer([&] {
      std::ofstream(fifo, std::ios::binary) << img;  // blocks until read_npy opens the FIFO
    });
    try {
      const Tensor r = read_npy(fifo);
      EXPECT_FALSE(extra);
      EXPECT_EQ(std::memcmp(r.data(), t.data(), t.nbytes()), 0);
    } catch (const Error& e) {
      EXPECT_TRUE(extra) << e.what();
      EXPECT_THAT(e.what(), HasSubstr("trailing bytes"));
    }
    writer.join();
  }
}

// Writing goes through a temporary file renamed into place: no partial file on failure.
TEST(NpyFiles, WriteReplacesAtomically) {
  TempDir dir;
  const std::string path = dir.file("a.npy");
  write_npy(path, Tensor(DType::f32, {3}));
  write_npy(path, Tensor(DType::f16, {5}));
  EXPECT_EQ(read_npy(path).dtype(), DType::f16);
  std::size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.file(""))) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary left behind
}

}  // namespace
}  // namespace attnops::cli
