// The HDF5 layer: tensor and attribute round trips, row reads, listings, compression, CRC-32C, errors.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "io/h5.h"

namespace flowrun::testing {
namespace {

namespace fs = std::filesystem;

// A fresh directory per test, removed afterwards.
class H5Test : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) /
        cat("flowrun-h5-", ::getpid(), "-", ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string file(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

// Distinct, exactly representable values for every dtype (u8 wraps at 256, so stay below).
Tensor sample(const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = static_cast<double>(i % 200) * (is_floating(dtype) ? 0.5 : 1.0) - (dtype == DType::u8 ? 0 : 7);
  t.fill_from(v);
  return t;
}

void expect_same(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.dtype(), b.dtype());
  ASSERT_EQ(a.shape(), b.shape());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}

// Expects `fn` to throw a flowrun::Error of `code` whose message contains every string in `parts`.
template <typename Fn>
void expect_error(Fn fn, ExitCode code, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

TEST_F(H5Test, TensorsOfEveryDTypeRoundTrip) {
  const std::vector<Shape> shapes = {{3, 4}, {}, {0, 5}, {7}};
  {
    h5::File f(file("t.h5"), h5::File::Mode::create);
    for (DType t : kAllDTypes)
      for (size_t s = 0; s < shapes.size(); ++s)
        f.write(cat("g/", dtype_name(t), "/", s), sample(shapes[s], t));
  }
  const h5::File f(file("t.h5"), h5::File::Mode::read);
  for (DType t : kAllDTypes) {
    for (size_t s = 0; s < shapes.size(); ++s) {
      const std::string name = cat("g/", dtype_name(t), "/", s);
      SCOPED_TRACE(name);
      EXPECT_EQ(f.dtype(name), t);
      EXPECT_EQ(f.shape(name), shapes[s]);
      expect_same(f.read(name), sample(shapes[s], t));
    }
  }
}

TEST_F(H5Test, RewritingADatasetReplacesIt) {
  h5::File f(file("t.h5"), h5::File::Mode::create);
  f.write("x", sample({2}, DType::f32));
  f.write("x", sample({3}, DType::i64));
  expect_same(f.read("x"), sample({3}, DType::i64));
}

TEST_F(H5Test, AttributesOfEachKindRoundTrip) {
  const std::string big(200000, 'y');  // above the 64 KiB compact-attribute limit
  {
    h5::File f(file("a.h5"), h5::File::Mode::create);
    f.write("d/x", sample({2}, DType::f32));
    for (const std::string obj : {"", "/", "d", "d/x"}) {
      f.set_attr(obj, cat("s", obj), std::string("hello: world\nline2"));
      f.set_attr(obj, cat("e", obj), std::string());
      f.set_attr(obj, cat("i", obj), int64_t{-1234567890123});
      f.set_attr(obj, cat("f", obj), 0.1);
      f.set_attr(obj, cat("v", obj), std::vector<int64_t>{1, -2, int64_t{1} << 40});
      f.set_attr(obj, cat("ve", obj), std::vector<int64_t>{});
    }
    f.set_attr("", "big", big);
    f.set_attr("", "tiny", 1e-300);
    f.set_attr("", "n", int64_t{1});
    f.set_attr("", "n", int64_t{2});  // replaces
  }
  const h5::File f(file("a.h5"), h5::File::Mode::read);
  for (const std::string obj : {"", "/", "d", "d/x"}) {
    SCOPED_TRACE(obj);
    EXPECT_EQ(f.attr_string(obj, cat("s", obj)), "hello: world\nline2");
    EXPECT_EQ(f.attr_string(obj, cat("e", obj)), "");
    EXPECT_EQ(f.attr_int(obj, cat("i", obj)), -1234567890123);
    EXPECT_EQ(f.attr_double(obj, cat("f", obj)), 0.1);
    EXPECT_EQ(f.attr_ints(obj, cat("v", obj)), (std::vector<int64_t>{1, -2, int64_t{1} << 40}));
    EXPECT_TRUE(f.attr_ints(obj, cat("ve", obj)).empty());
    EXPECT_TRUE(f.has_attr(obj, cat("s", obj)));
    EXPECT_FALSE(f.has_attr(obj, "absent"));
  }
  EXPECT_EQ(f.attrs("d/x"), (std::vector<std::string>{"ed/x", "fd/x", "id/x", "sd/x", "vd/x", "ved/x"}));
  EXPECT_EQ(f.attr_string("", "big"), big);
  EXPECT_EQ(f.attr_double("", "tiny"), 1e-300);
  EXPECT_EQ(f.attr_int("", "n"), 2);
  EXPECT_EQ(f.attr_double("", "n"), 2.0);  // an integer reads as a number
  expect_error([&] { f.attr_int("", "s"); }, ExitCode::bad_input, {"a.h5", "attribute s", "not an integer"});
  expect_error([&] { f.attr_string("d", "absent"); }, ExitCode::bad_input,
               {"a.h5", "no attribute absent on d"});
}

TEST_F(H5Test, ReadRowsTakesAHyperslabAlongDimZero) {
  const Tensor all = sample({10, 3, 2}, DType::i32);
  {
    h5::File f(file("r.h5"), h5::File::Mode::create);
    f.write("x", all);
  }
  const h5::File f(file("r.h5"), h5::File::Mode::read);
  const Tensor rows = f.read_rows("x", 4, 3);
  ASSERT_EQ(rows.shape(), (Shape{3, 3, 2}));
  EXPECT_EQ(std::memcmp(rows.raw(), all.data<int32_t>() + 4 * 6, rows.nbytes()), 0);
  EXPECT_EQ(f.read_rows("x", 10, 0).shape(), (Shape{0, 3, 2}));
  expect_error([&] { f.read_rows("x", 8, 3); }, ExitCode::bad_input,
               {"r.h5", "dataset x", "[8, 11)", "10 rows"});
}

TEST_F(H5Test, DatasetsListsRecursivelyInSortedOrder) {
  h5::File f(file("l.h5"), h5::File::Mode::create);
  for (const char* n : {"z", "b/y", "b/a/x", "a", "b/a/w", "c/d/e/f"}) f.write(n, sample({1}, DType::u8));
  EXPECT_EQ(f.datasets(), (std::vector<std::string>{"a", "b/a/w", "b/a/x", "b/y", "c/d/e/f", "z"}));
  EXPECT_EQ(f.datasets("b"), (std::vector<std::string>{"b/a/w", "b/a/x", "b/y"}));
  EXPECT_EQ(f.datasets("/b/a/"), (std::vector<std::string>{"b/a/w", "b/a/x"}));
  EXPECT_TRUE(f.exists("b/a"));
  EXPECT_TRUE(f.exists("b/a/x"));
  EXPECT_FALSE(f.exists("b/q/x"));
  EXPECT_FALSE(f.exists("nothing"));
}

TEST_F(H5Test, CompressedBytesRoundTripAndShrink) {
  std::vector<uint8_t> text;
  const std::string line = "In the beginning God created the heaven and the earth.\n";
  while (text.size() < 3u << 20) text.insert(text.end(), line.begin(), line.end());
  {
    h5::File f(file("c.h5"), h5::File::Mode::create);
    f.write_bytes("text", text.data(), text.size(), true);
    f.write_bytes("plain", text.data(), 1000, false);
    f.write_bytes("empty", nullptr, 0, true);
  }
  EXPECT_LT(fs::file_size(file("c.h5")), text.size() / 20);
  const h5::File f(file("c.h5"), h5::File::Mode::read);
  const Tensor t = f.read("text");
  ASSERT_EQ(t.dtype(), DType::u8);
  ASSERT_EQ(t.shape(), (Shape{static_cast<int64_t>(text.size())}));
  EXPECT_EQ(std::memcmp(t.raw(), text.data(), text.size()), 0);
  EXPECT_EQ(std::memcmp(f.read_rows("text", 1234567, 100).raw(), text.data() + 1234567, 100), 0);
  EXPECT_EQ(f.read("plain").numel(), 1000);
  EXPECT_EQ(f.read("empty").shape(), (Shape{0}));
}

// Bit-at-a-time CRC-32C, the definition the table-driven version must match.
uint32_t crc32c_reference(const uint8_t* p, size_t n) {
  uint32_t c = ~0u;
  for (size_t i = 0; i < n; ++i) {
    c ^= p[i];
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
  }
  return ~c;
}

TEST(H5Crc32c, MatchesCheckValueReferenceAndChains) {
  EXPECT_EQ(h5::crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(h5::crc32c("", 0), 0u);
  std::vector<uint8_t> bytes(1000);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);
  for (size_t n : {1u, 7u, 8u, 9u, 63u, 64u, 999u, 1000u})
    EXPECT_EQ(h5::crc32c(bytes.data() + 1, n - 1), crc32c_reference(bytes.data() + 1, n - 1)) << n;
  EXPECT_EQ(h5::crc32c(bytes.data() + 300, 700, h5::crc32c(bytes.data(), 300)),
            h5::crc32c(bytes.data(), 1000));
}

TEST_F(H5Test, ErrorsNameTheFileAndObject) {
  expect_error([&] { h5::File(file("missing.h5"), h5::File::Mode::read); }, ExitCode::bad_input,
               {"missing.h5", "no such file"});
  std::ofstream(file("text.h5")) << "this is not an HDF5 file\n";
  expect_error([&] { h5::File(file("text.h5"), h5::File::Mode::read); }, ExitCode::bad_input,
               {"text.h5", "not a readable HDF5 file", "HDF5:"});
  {
    h5::File f(file("d.h5"), h5::File::Mode::create);
    f.write("params/w", sample({2}, DType::f32));
  }
  const h5::File f(file("d.h5"), h5::File::Mode::read);
  expect_error([&] { f.read("params/v"); }, ExitCode::bad_input, {"d.h5", "no dataset params/v"});
  expect_error([&] { f.read_rows("params/v", 0, 1); }, ExitCode::bad_input, {"d.h5", "params/v"});
  expect_error([&] { f.shape("nope"); }, ExitCode::bad_input, {"d.h5", "nope"});
  expect_error([&] { f.attr_ints("params/w", "shape"); }, ExitCode::bad_input, {"d.h5", "shape", "params/w"});
  // The failed calls left nothing open: only the file itself.
  EXPECT_EQ(H5Fget_obj_count(H5F_OBJ_ALL, H5F_OBJ_ALL), 1);
  expect_error([&] { h5::File(file("no/such/dir/x.h5"), h5::File::Mode::create); }, ExitCode::runtime,
               {"no/such/dir/x.h5", "cannot create"});
}

TEST_F(H5Test, CloseIsIdempotentAndMoveKeepsTheFileOpen) {
  h5::File a(file("m.h5"), h5::File::Mode::create);
  h5::File b(std::move(a));
  b.write("x", sample({2}, DType::f64));
  b.flush();
  b.close();
  b.close();
  const h5::File r(file("m.h5"), h5::File::Mode::read);
  expect_same(r.read("x"), sample({2}, DType::f64));
}

}  // namespace
}  // namespace flowrun::testing
