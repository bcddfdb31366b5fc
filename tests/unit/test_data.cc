// Tests of the datasets (conversion of the real data to HDF5, reading, normalisation) and the data loader.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <thread>

#include "data/dataset.h"
#include "data/loader.h"
#include "data/mapped.h"
#include "data/tokens.h"
#include "io/h5.h"

namespace flowrun::testing {
namespace {

namespace fs = std::filesystem;

// A fresh directory for this test binary's files.
const std::string& temp_dir() {
  static const std::string dir = [] {
    const std::string d = cat(::testing::TempDir(), "flowrun-test-data-", getpid());
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

std::string temp_path(const std::string& name) {
  return cat(temp_dir(), "/", name);
}

// Removes this binary's files (Fashion-MNIST alone is 55 MB) when the tests end.
class RemoveTempDir : public ::testing::Environment {
 public:
  void TearDown() override {
    std::error_code ec;
    fs::remove_all(cat(::testing::TempDir(), "flowrun-test-data-", getpid()), ec);
  }
};
const auto* const kRemoveTempDir = ::testing::AddGlobalTestEnvironment(new RemoveTempDir);

// Runs f, expecting an input_error whose message contains every one of `parts`.
template <typename F>
void expect_input_error(F&& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

void write_gz(const std::string& path, const std::vector<uint8_t>& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size())), static_cast<int>(bytes.size()));
  gzclose(f);
}

// An IDX header (magic, big-endian dims) followed by `data`.
std::vector<uint8_t> idx_bytes(uint32_t magic, const std::vector<uint32_t>& dims,
                               const std::vector<uint8_t>& data) {
  std::vector<uint8_t> out;
  for (uint32_t w : [&] {
         std::vector<uint32_t> words{magic};
         words.insert(words.end(), dims.begin(), dims.end());
         return words;
       }())
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<uint8_t>(w >> shift));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

std::vector<uint8_t> iota_bytes(size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i);
  return v;
}

// ---- IDX ----

TEST(DataIdx, ReadsSyntheticFile) {
  const std::string path = temp_path("small-idx3.gz");
  write_gz(path, idx_bytes(0x803, {2, 3, 4}, iota_bytes(24)));
  const Tensor t = read_idx_gz(path, 3);
  EXPECT_EQ(t.shape(), (Shape{2, 3, 4}));
  ASSERT_EQ(t.dtype(), DType::u8);
  for (int i = 0; i < 24; ++i) EXPECT_EQ(t.data<uint8_t>()[i], i);
}

TEST(DataIdx, BadFilesNameTheFile) {
  const std::string labels = temp_path("labels-idx1.gz");
  write_gz(labels, idx_bytes(0x801, {5}, iota_bytes(5)));
  expect_input_error([&] { read_idx_gz(labels, 3); }, {labels, "magic 0x801", "expected 0x803"});
  const std::string truncated = temp_path("truncated-idx3.gz");
  write_gz(truncated, idx_bytes(0x803, {2, 3, 4}, iota_bytes(20)));
  expect_input_error([&] { read_idx_gz(truncated, 3); }, {truncated, "20 of 24 bytes"});
  const std::string trailing = temp_path("trailing-idx1.gz");
  write_gz(trailing, idx_bytes(0x801, {3}, iota_bytes(4)));
  expect_input_error([&] { read_idx_gz(trailing, 1); }, {trailing, "trailing"});
  // A gzip stream with its deflate data overwritten: zlib reports corruption.
  const std::string corrupt = temp_path("corrupt-idx1.gz");
  write_gz(corrupt, idx_bytes(0x801, {4000}, std::vector<uint8_t>(4000, 7)));
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(12);
    const std::string junk(8, '\xff');
    f.write(junk.data(), static_cast<std::streamsize>(junk.size()));
  }
  expect_input_error([&] { read_idx_gz(corrupt, 1); }, {corrupt});
  expect_input_error([&] { read_idx_gz(temp_path("absent.gz"), 1); }, {temp_path("absent.gz")});
}

// ---- Fashion-MNIST (converted once per test binary: a few seconds) ----

const std::string& fashion_path() {
  static const std::string path = [] {
    const std::string p = temp_path("fashion_mnist.h5");
    prepare_fashion_mnist(p);
    return p;
  }();
  return path;
}

TEST(DataFashion, ConvertedFileHasShapesLabelsAndStatistics) {
  const h5::File f(fashion_path(), h5::File::Mode::read);
  EXPECT_EQ(f.shape("train/x"), (Shape{60000, 28, 28}));
  EXPECT_EQ(f.dtype("train/x"), DType::u8);
  EXPECT_EQ(f.shape("train/y"), (Shape{60000}));
  EXPECT_EQ(f.dtype("train/y"), DType::i64);
  EXPECT_EQ(f.shape("test/x"), (Shape{10000, 28, 28}));
  EXPECT_EQ(f.shape("test/y"), (Shape{10000}));
  const Tensor y = f.read("train/y");
  EXPECT_EQ(y.data<int64_t>()[0], 9);  // Ankle boot
  const auto [lo, hi] = std::minmax_element(y.data<int64_t>(), y.data<int64_t>() + y.numel());
  EXPECT_EQ(*lo, 0);
  EXPECT_EQ(*hi, 9);
  EXPECT_NEAR(f.attr_double("", "mean"), 0.2860, 5e-4);
  EXPECT_NEAR(f.attr_double("", "std"), 0.3530, 5e-4);
  EXPECT_NE(f.attr_string("", "classes").find("T-shirt/top,Trouser,"), std::string::npos);
  EXPECT_NE(f.attr_string("", "source").find("Fashion-MNIST"), std::string::npos);
}

TEST(DataFashion, OpenNormalisesWithTheFileStatistics) {
  DataConfig cfg;
  cfg.dataset = "fashion_mnist";
  cfg.path = fashion_path();
  const auto ds = open_dataset(cfg);
  EXPECT_FALSE(ds->spec().text);
  EXPECT_EQ(ds->spec().sample_shape, (Shape{1, 28, 28}));
  EXPECT_EQ(ds->spec().num_classes, 10);
  EXPECT_EQ(ds->size(Split::train), 60000);
  EXPECT_EQ(ds->size(Split::val), 10000);
  // Held in memory: every image's bytes and an int64 label each, of both splits.
  EXPECT_EQ(ds->memory_bytes(), 70000 * (784 + 8));
  const h5::File f(fashion_path(), h5::File::Mode::read);
  const Tensor raw = f.read_rows("test/x", 3, 1);
  const Tensor raw_y = f.read_rows("test/y", 3, 1);
  Tensor x = Tensor::zeros({2, 1, 28, 28}, DType::f32), y = Tensor::zeros({2}, DType::i64);
  ds->fill(Split::val, 3, x, y, 1);
  const double mean = f.attr_double("", "mean"), sd = f.attr_double("", "std");
  for (int p = 0; p < 784; ++p)
    ASSERT_NEAR(x.data<float>()[784 + p], (raw.data<uint8_t>()[p] / 255.0 - mean) / sd, 1e-5) << p;
  EXPECT_EQ(y.data<int64_t>()[1], raw_y.data<int64_t>()[0]);
  EXPECT_EQ(x.data<float>()[0], 0.0f);  // row 0 untouched
}

TEST(DataFashion, MissingSourceNamesTheFile) {
  const std::string dir = temp_path("no-fashion");
  expect_input_error([&] { prepare_fashion_mnist(temp_path("unused.h5"), dir); },
                     {dir, "train-images-idx3-ubyte.gz", "dataset-fashion-mnist"});
  EXPECT_FALSE(fs::exists(temp_path("unused.h5")));
}

// ---- King James Bible ----

TEST(DataKjv, ConvertedTextSplitsNinetyTen) {
  const std::string path = temp_path("kjv.h5");
  prepare_kjv(path);
  const h5::File f(path, h5::File::Mode::read);
  const int64_t n = f.attr_int("", "bytes");
  EXPECT_GT(n, 4000000);
  EXPECT_EQ(f.attr_int("", "train_bytes"), n * 9 / 10);
  EXPECT_EQ(f.attr_int("", "val_bytes"), n - n * 9 / 10);
  const Tensor train = f.read("train"), val = f.read("val");
  ASSERT_EQ(train.numel(), n * 9 / 10);
  ASSERT_EQ(val.numel(), n - n * 9 / 10);
  const std::string start(reinterpret_cast<const char*>(train.data<uint8_t>()), 56);
  EXPECT_EQ(start, "In the beginning God created the heaven and the earth.\nA");
  const std::string text = kjv_text();
  ASSERT_EQ(static_cast<int64_t>(text.size()), n);
  EXPECT_EQ(
      text.compare(static_cast<size_t>(n * 9 / 10), std::string::npos,
                   reinterpret_cast<const char*>(val.data<uint8_t>()), static_cast<size_t>(val.numel())),
      0);
  EXPECT_EQ(text.back(), '\n');

  DataConfig cfg;
  cfg.dataset = "kjv";
  cfg.path = path;
  cfg.seq_len = 64;
  const auto ds = open_dataset(cfg);
  EXPECT_TRUE(ds->spec().text);
  EXPECT_EQ(ds->spec().sample_shape, (Shape{64}));
  EXPECT_EQ(ds->spec().num_classes, 256);
  EXPECT_EQ(ds->size(Split::train), (n * 9 / 10 - 1) / 64);
  EXPECT_EQ(ds->size(Split::val), (val.numel() - 1) / 64);
}

TEST(DataKjv, MissingProgramSaysWhatToInstall) {
  const std::string path = getenv("PATH");
  setenv("PATH", temp_dir().c_str(), 1);  // no `bible` there
  const std::string out = temp_path("kjv-unused.h5");
  expect_input_error([&] { prepare_kjv(out); }, {"bible -f gen1:1-rev22:21", "exit status 127", "bible-kjv"});
  setenv("PATH", path.c_str(), 1);
  EXPECT_FALSE(fs::exists(out));
}

// ---- sklearn tables ----

TEST(DataTable, WineIsSplitAndStandardised) {
  const std::string path = temp_path("wine.h5");
  ensure_dataset("wine", path);
  const h5::File f(path, h5::File::Mode::read);
  EXPECT_EQ(f.shape("train/x"), (Shape{143, 13}));
  EXPECT_EQ(f.shape("test/x"), (Shape{35, 13}));
  EXPECT_EQ(f.shape("test/y"), (Shape{35}));
  EXPECT_EQ(f.shape("feature_mean"), (Shape{13}));
  DataConfig cfg;
  cfg.dataset = "wine";
  cfg.path = path;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->spec().sample_shape, (Shape{13}));
  EXPECT_EQ(ds->spec().num_classes, 3);
  Tensor x = Tensor::empty({143, 13}, DType::f32), y = Tensor::empty({143}, DType::i64);
  for (int64_t i = 0; i < 143; ++i) ds->fill(Split::train, i, x, y, i);
  const FeatureStats s = feature_stats(x);
  for (size_t c = 0; c < 13; ++c) {
    EXPECT_NEAR(s.mean[c], 0.0, 1e-5);
    EXPECT_NEAR(s.std[c], 1.0, 1e-5);
  }
  // The raw train rows, standardised by the stored statistics, are what the dataset yields.
  const Tensor raw = f.read("train/x");
  const auto mean = f.read("feature_mean").to_f64(), sd = f.read("feature_std").to_f64();
  EXPECT_NEAR(x.data<float>()[5 * 13 + 2], (raw.data<float>()[5 * 13 + 2] - mean[2]) / sd[2], 1e-5);
  EXPECT_EQ(y.data<int64_t>()[5], f.read("train/y").data<int64_t>()[5]);
}

TEST(DataTable, ConversionIsDeterministicAndConcurrentSafe) {
  const std::string path = temp_path("iris-concurrent.h5");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([&] { ensure_dataset("iris", path); });
  for (auto& t : threads) t.join();
  const std::string again = temp_path("iris-again.h5");
  prepare_sklearn_table("iris", again);
  const h5::File a(path, h5::File::Mode::read), b(again, h5::File::Mode::read);
  EXPECT_EQ(a.read("train/y").to_f64(), b.read("train/y").to_f64());
  EXPECT_EQ(a.read("test/x").to_f64(), b.read("test/x").to_f64());
  for (const auto& e : fs::directory_iterator(temp_dir()))
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
}

// ---- Custom HDF5 files ----

TEST(DataCustom, ImagesWithChannelsComputeTheirStatistics) {
  const std::string path = temp_path("custom-rgb.h5");
  {
    h5::File f(path, h5::File::Mode::create);
    Tensor x = Tensor::empty({4, 3, 2, 2}, DType::u8);
    for (int64_t i = 0; i < x.numel(); ++i) x.data<uint8_t>()[i] = static_cast<uint8_t>(i * 5);
    f.write("train/x", x);
    f.write("train/y", Tensor::from<int64_t>({4}, {0, 1, 4, 1}));
    f.write("test/x", x);
    f.write("test/y", Tensor::from<int64_t>({4}, {1, 1, 0, 0}));
  }
  DataConfig cfg;
  cfg.dataset = "hdf5";
  cfg.path = path;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->spec().sample_shape, (Shape{3, 2, 2}));
  EXPECT_EQ(ds->spec().num_classes, 5);
  // Each channel of the train split normalises to mean 0, std 1.
  Tensor x = Tensor::empty({4, 3, 2, 2}, DType::f32), y = Tensor::empty({4}, DType::i64);
  for (int64_t i = 0; i < 4; ++i) ds->fill(Split::train, i, x, y, i);
  for (int c = 0; c < 3; ++c) {
    double sum = 0, sq = 0;
    for (int i = 0; i < 4; ++i)
      for (int p = 0; p < 4; ++p) {
        const double v = x.data<float>()[i * 12 + c * 4 + p];
        sum += v;
        sq += v * v;
      }
    EXPECT_NEAR(sum / 16, 0.0, 1e-5);
    EXPECT_NEAR(sq / 16, 1.0, 1e-4);
  }
  // Configured statistics win: one value for every channel.
  cfg.mean = {0.0};
  cfg.std = {1.0};
  const auto plain = open_dataset(cfg);
  plain->fill(Split::val, 2, x, y, 0);
  EXPECT_FLOAT_EQ(x.data<float>()[1], static_cast<float>(25 * 5 % 256 / 255.0));
  cfg.mean = {0.1, 0.2};
  expect_input_error([&] { open_dataset(cfg); }, {"data.mean", "2 values", "3 channel"});
}

TEST(DataCustom, EveryPixelValueNormalisesToItsChannelsFormula) {
  // 2 channels of 5 x 7 pixels: each plane is two 16-pixel vectors and a 3-pixel tail; 8 images cover all
  // 256 byte values in both channels.
  const std::string path = temp_path("custom-all-bytes.h5");
  Tensor raw = Tensor::empty({8, 2, 5, 7}, DType::u8);
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t p = 0; p < 35; ++p)
        raw.data<uint8_t>()[(i * 2 + c) * 35 + p] = static_cast<uint8_t>(i * 35 + p + 91 * c);
  {
    h5::File f(path, h5::File::Mode::create);
    f.write("train/x", raw);
    f.write("train/y", Tensor::zeros({8}, DType::i64));
    f.write("test/x", raw);
    f.write("test/y", Tensor::zeros({8}, DType::i64));
  }
  DataConfig cfg;
  cfg.dataset = "hdf5";
  cfg.path = path;
  cfg.mean = {0.1, 0.7};
  cfg.std = {0.3, 0.05};
  const auto ds = open_dataset(cfg);
  Tensor x = Tensor::empty({8, 2, 5, 7}, DType::f32), y = Tensor::empty({8}, DType::i64);
  for (int64_t i = 0; i < 8; ++i) {
    ds->prefetch(Split::train, 7 - i);
    ds->fill(Split::train, 7 - i, x, y, i);
  }
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t c = 0; c < 2; ++c)
      for (int64_t p = 0; p < 35; ++p) {
        const double v = raw.data<uint8_t>()[((7 - i) * 2 + c) * 35 + p];
        const float want = static_cast<float>((v / 255.0 - cfg.mean[static_cast<size_t>(c)]) /
                                              cfg.std[static_cast<size_t>(c)]);
        ASSERT_EQ(x.data<float>()[(i * 2 + c) * 35 + p], want)
            << "image " << i << " channel " << c << " pixel " << p;
      }
}

TEST(DataCustom, BadFilesNameFileAndDataset) {
  const std::string path = temp_path("custom-bad.h5");
  {
    h5::File f(path, h5::File::Mode::create);
    f.write("train/x", Tensor::zeros({4, 3}, DType::f64));
    f.write("train/y", Tensor::zeros({4}, DType::i64));
  }
  DataConfig cfg;
  cfg.dataset = "hdf5";
  cfg.path = path;
  expect_input_error([&] { open_dataset(cfg); }, {path, "/train/x", "f64"});
  const std::string no_test = temp_path("custom-no-test.h5");
  {
    h5::File f(no_test, h5::File::Mode::create);
    f.write("train/x", Tensor::zeros({4, 3}, DType::f32));
    f.write("train/y", Tensor::zeros({4}, DType::i64));
  }
  cfg.path = no_test;
  expect_input_error([&] { open_dataset(cfg); }, {no_test, "/test/x"});
  // A separate validation file with /x and /y at its root.
  const std::string val = temp_path("custom-val.h5");
  {
    h5::File f(val, h5::File::Mode::create);
    f.write("x", Tensor::zeros({2, 3}, DType::f32));
    f.write("y", Tensor::from<int64_t>({2}, {0, 7}));
  }
  cfg.val_path = val;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->size(Split::val), 2);
  EXPECT_EQ(ds->spec().num_classes, 8);
  cfg.path = temp_path("absent.h5");
  expect_input_error([&] { open_dataset(cfg); }, {temp_path("absent.h5"), "not found"});
}

// A small text file: bytes 0, 1, 2, ... in /train and /val.
std::string text_file(int64_t train_bytes, int64_t val_bytes) {
  const std::string path = temp_path(cat("text-", train_bytes, "-", val_bytes, ".h5"));
  h5::File f(path, h5::File::Mode::create);
  const auto train = iota_bytes(static_cast<size_t>(train_bytes)),
             val = iota_bytes(static_cast<size_t>(val_bytes));
  f.write_bytes("train", train.data(), train.size());
  f.write_bytes("val", val.data(), val.size(), true);
  return path;
}

TEST(DataText, SeqLenLongerThanValIsAnError) {
  DataConfig cfg;
  cfg.dataset = "hdf5";
  cfg.path = text_file(100, 8);
  cfg.seq_len = 8;
  expect_input_error([&] { open_dataset(cfg); }, {cfg.path, "/val", "8 bytes", "data.seq_len 8"});
  cfg.seq_len = 7;
  EXPECT_EQ(open_dataset(cfg)->size(Split::val), 1);
}

// ---- The user's own files: text, tokens, csv ----

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  ASSERT_TRUE(f.good()) << path;
}

// Little-endian uint16 tokens, after llm.c's header when `llmc` (magic, version, count, zeros to 1024 bytes).
std::string token_bytes(const std::vector<uint16_t>& tokens, bool llmc, int32_t magic = kLlmcMagic,
                        int32_t version = 1, int64_t count = -1) {
  std::string out;
  const auto put = [&](uint32_t v, int bytes) {
    for (int b = 0; b < bytes; ++b) out.push_back(static_cast<char>(v >> (8 * b)));
  };
  if (llmc) {
    put(static_cast<uint32_t>(magic), 4);
    put(static_cast<uint32_t>(version), 4);
    put(static_cast<uint32_t>(count < 0 ? static_cast<int64_t>(tokens.size()) : count), 4);
    out.resize(kLlmcHeaderBytes, '\0');
  }
  for (uint16_t t : tokens) put(t, 2);
  return out;
}

// Token k = k * 37 % 1000: values above 255 (both bytes matter) and no two neighbours equal.
std::vector<uint16_t> test_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t k = 0; k < n; ++k) t[k] = static_cast<uint16_t>(k * 37 % 1000);
  return t;
}

TEST(DataMapped, UnmappedReadsEqualTheMappingAndBadPathsNameTheFile) {
  const std::string path = temp_path("mapped.bin");
  std::string bytes;
  for (int k = 0; k < 10000; ++k) bytes.push_back(static_cast<char>(k * 13));
  write_file(path, bytes);
  const MappedFile mapped(path), read(path, true);
  EXPECT_TRUE(mapped.whole());
  EXPECT_FALSE(read.whole());
  ASSERT_EQ(read.size(), 10000);
  for (const auto& [offset, len] :
       std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {4095, 3}, {9000, 1000}}) {
    std::string a, b;
    mapped.with_range(offset, len,
                      [&](const uint8_t* p) { a.assign(reinterpret_cast<const char*>(p), len); });
    read.with_range(offset, len, [&](const uint8_t* p) { b.assign(reinterpret_cast<const char*>(p), len); });
    EXPECT_EQ(a, bytes.substr(static_cast<size_t>(offset), static_cast<size_t>(len)));
    EXPECT_EQ(b, a);
  }
  expect_input_error([] { MappedFile f(temp_path("absent.bin")); }, {temp_path("absent.bin"), "cannot open"});
  expect_input_error([] { MappedFile f(temp_dir()); }, {temp_dir(), "a directory"});
}

TEST(DataTokens, FlatAndLlmcFilesGiveTheSameShiftedWindows) {
  const auto tokens = test_tokens(1000);
  const std::string flat = temp_path("tokens-flat.bin"), llmc = temp_path("tokens-llmc.bin");
  write_file(flat, token_bytes(tokens, false));
  write_file(llmc, token_bytes(tokens, true));
  DataConfig cfg;
  cfg.dataset = "tokens";
  cfg.seq_len = 16;
  cfg.vocab_size = 1000;
  for (const std::string& path : {flat, llmc}) {
    cfg.path = path;
    const auto ds = open_dataset(cfg);
    EXPECT_TRUE(ds->spec().text);
    EXPECT_EQ(ds->spec().num_classes, 1000);
    // The last 10% (tokens 900..999) are the validation split.
    EXPECT_EQ(ds->size(Split::train), (900 - 1) / 16);
    EXPECT_EQ(ds->size(Split::val), (100 - 1) / 16);
    // Both splits are one mapping of the file, counted once.
    EXPECT_EQ(ds->memory_bytes(), static_cast<int64_t>(std::filesystem::file_size(path)));
    Tensor x = Tensor::zeros({2, 16}, DType::i64), y = Tensor::zeros({2, 16}, DType::i64);
    ds->fill(Split::train, 3, x, y, 1);
    ds->fill(Split::val, 5, x, y, 0);
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(x.data<int64_t>()[16 + t], tokens[static_cast<size_t>(3 * 16 + t)]) << path;
      EXPECT_EQ(y.data<int64_t>()[16 + t], tokens[static_cast<size_t>(3 * 16 + t + 1)]) << path;
      EXPECT_EQ(x.data<int64_t>()[t], tokens[static_cast<size_t>(900 + 5 * 16 + t)]) << path;
      EXPECT_EQ(y.data<int64_t>()[t], tokens[static_cast<size_t>(900 + 5 * 16 + t + 1)]) << path;
    }
  }
  // llm.c's file without data.vocab_size: GPT-2's vocabulary; a flat file needs the key.
  cfg.vocab_size = 0;
  cfg.path = llmc;
  EXPECT_EQ(open_dataset(cfg)->spec().num_classes, kGpt2Vocab);
  cfg.path = flat;
  expect_input_error([&] { open_dataset(cfg); }, {flat, "data.vocab_size"});
  // A separate validation file replaces the split; formats may differ per file.
  cfg.vocab_size = 1000;
  cfg.val_path = llmc;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->size(Split::train), 999 / 16);
  EXPECT_EQ(ds->size(Split::val), 999 / 16);
  // Read without mapping: the same tokens.
  const TokenFile a = open_token_file(llmc, "auto"), b = open_token_file(llmc, "llmc", true);
  EXPECT_TRUE(a.llmc && b.llmc);
  ASSERT_EQ(b.tokens.count, 1000);
  b.tokens.with_tokens(990, 10, [&](const uint8_t* p) {
    for (int64_t t = 0; t < 10; ++t) EXPECT_EQ(b.tokens.at(p, t), tokens[static_cast<size_t>(990 + t)]);
  });
}

TEST(DataTokens, MalformedFilesNameFileAndPosition) {
  DataConfig cfg;
  cfg.dataset = "tokens";
  cfg.seq_len = 8;
  cfg.vocab_size = 1000;
  const auto with = [&](const std::string& name, const std::string& bytes) {
    cfg.path = temp_path(name);
    write_file(cfg.path, bytes);
    return cfg.path;
  };
  std::string p = with("odd.bin", token_bytes(test_tokens(100), false) + "x");
  expect_input_error([&] { open_dataset(cfg); }, {p, "201 bytes", "odd", "byte offset 200"});
  cfg.token_format = "llmc";
  p = with("nomagic.bin", token_bytes(test_tokens(600), false));
  expect_input_error([&] { open_dataset(cfg); }, {p, "byte offset 0", "magic", "20240520"});
  p = with("short-header.bin", token_bytes(test_tokens(10), false));
  expect_input_error([&] { open_dataset(cfg); }, {p, "20 bytes", "1024-byte header"});
  cfg.token_format = "auto";
  p = with("v2.bin", token_bytes(test_tokens(100), true, kLlmcMagic, 2));
  expect_input_error([&] { open_dataset(cfg); }, {p, "byte offset 4", "version 2"});
  p = with("count.bin", token_bytes(test_tokens(100), true, kLlmcMagic, 1, 101));
  expect_input_error([&] { open_dataset(cfg); }, {p, "byte offset 8", "token count 101", "1224"});
  // Token 123 is 1000 + 123 = 1123: the first one not below the vocabulary.
  auto tokens = test_tokens(200);
  tokens[123] = 1123;
  p = with("range.bin", token_bytes(tokens, true));
  expect_input_error([&] { open_dataset(cfg); },
                     {p, "token 123 ", cat("byte offset ", 1024 + 246), "1123", "data.vocab_size 1000"});
  // 90 tokens: the train split holds 81, the validation split 9 = one sample of 8 + 1; 80 leave it 8.
  p = with("short.bin", token_bytes(test_tokens(90), false));
  EXPECT_EQ(open_dataset(cfg)->size(Split::val), 1);
  p = with("short.bin", token_bytes(test_tokens(80), false));
  expect_input_error([&] { open_dataset(cfg); }, {p, "last 10%", "8 tokens", "data.seq_len 8"});
}

TEST(DataTextFile, AnyFileAsBytesSplitNinetyTen) {
  const std::string path = temp_path("any.txt");
  const auto bytes = iota_bytes(1000);
  write_file(path, std::string(bytes.begin(), bytes.end()));
  DataConfig cfg;
  cfg.dataset = "text";
  cfg.path = path;
  cfg.seq_len = 10;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->spec().num_classes, 256);
  EXPECT_EQ(ds->size(Split::train), 899 / 10);
  EXPECT_EQ(ds->size(Split::val), 99 / 10);
  EXPECT_EQ(ds->memory_bytes(), 1000);  // mapped once for both splits
  Tensor x = Tensor::zeros({1, 10}, DType::i64), y = Tensor::zeros({1, 10}, DType::i64);
  ds->fill(Split::val, 2, x, y, 0);
  for (int64_t t = 0; t < 10; ++t) {
    EXPECT_EQ(x.data<int64_t>()[t], bytes[static_cast<size_t>(900 + 20 + t)]);
    EXPECT_EQ(y.data<int64_t>()[t], bytes[static_cast<size_t>(900 + 20 + t + 1)]);
  }
  cfg.seq_len = 100;
  expect_input_error([&] { open_dataset(cfg); }, {path, "last 10%", "100 bytes", "data.seq_len 100"});
  cfg.path = temp_path("no-such.txt");
  expect_input_error([&] { open_dataset(cfg); }, {cfg.path, "cannot open"});
}

TEST(DataCsv, IntegerAndTextLabelsSplitAndStandardise) {
  // 50 rows: x0 = r, x1 = 2r + 1 in a quoted cell, label r % 3 in the middle column.
  std::string ints = "x0,label,\"x 1\"\n", texts = "x0,kind,x1\r\n";
  const std::vector<std::string> names{"setosa", "virginica", "versicolor"};
  for (int r = 0; r < 50; ++r) {
    ints += cat(r, ",", r % 3, ",\"", 2 * r + 1, "\"\n");
    texts += cat(r, ", ", names[static_cast<size_t>(r % 3)], " ,", 2 * r + 1, "\r\n");
  }
  texts += "\n";  // a blank last line is no row
  DataConfig cfg;
  cfg.dataset = "csv";
  cfg.path = temp_path("ints.csv");
  write_file(cfg.path, ints);
  cfg.label = "label";
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->spec().sample_shape, (Shape{2}));
  EXPECT_EQ(ds->spec().num_classes, 3);
  EXPECT_EQ(ds->size(Split::train), 40);
  EXPECT_EQ(ds->size(Split::val), 10);
  // Standardised with the train split's statistics: the train features have mean 0 and std 1, and each
  // sample's label is its row's (x0 = r recovered through x1 = 2r + 1, which standardises alike).
  double sum = 0, sq = 0;
  std::set<int64_t> rows;
  for (int64_t i = 0; i < 40; ++i) {
    Tensor x = Tensor::zeros({1, 2}, DType::f32), y = Tensor::zeros({1}, DType::i64);
    ds->fill(Split::train, i, x, y, 0);
    sum += x.data<float>()[0];
    sq += x.data<float>()[0] * x.data<float>()[0];
    EXPECT_NEAR(x.data<float>()[0], x.data<float>()[1], 1e-5);
    rows.insert(y.data<int64_t>()[0]);
  }
  EXPECT_NEAR(sum / 40, 0.0, 1e-5);
  EXPECT_NEAR(sq / 40, 1.0, 1e-4);
  EXPECT_EQ(rows, (std::set<int64_t>{0, 1, 2}));
  // Text labels: classes in sorted order (setosa 0, versicolor 1, virginica 2), so row 1 is class 2.
  cfg.path = temp_path("texts.csv");
  write_file(cfg.path, texts);
  cfg.label = "kind";
  cfg.val_path = cfg.path;
  const auto td = open_dataset(cfg);
  EXPECT_EQ(td->spec().num_classes, 3);
  EXPECT_EQ(td->size(Split::val), 50);
  Tensor x = Tensor::zeros({1, 2}, DType::f32), y = Tensor::zeros({1}, DType::i64);
  td->fill(Split::val, 1, x, y, 0);
  EXPECT_EQ(y.data<int64_t>()[0], 2);
  td->fill(Split::val, 2, x, y, 0);
  EXPECT_EQ(y.data<int64_t>()[0], 1);
}

TEST(DataCsv, MalformedTablesNameFileLineAndColumn) {
  DataConfig cfg;
  cfg.dataset = "csv";
  cfg.label = "class";
  const auto with = [&](const std::string& name, const std::string& text) {
    cfg.path = temp_path(name);
    write_file(cfg.path, text);
    return cfg.path;
  };
  std::string p = with("cell.csv", "a,b,class\n1,2,0\n3,4,1\n5, x7 ,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":4:3", "column 'b'", "\"x7\"", "not a finite number"});
  p = with("nan.csv", "a,b,class\n1,,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":2:3", "column 'b'"});
  p = with("label.csv", "a,b,klass\n1,2,0\n3,4,1\n");
  expect_input_error([&] { open_dataset(cfg); },
                     {p, "no column 'class'", "a, b, klass", "did you mean 'klass'"});
  p = with("ragged.csv", "a,b,class\n1,2,0\n\n3,4\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":4:", "2 cells", "3 columns"});
  p = with("quote.csv", "a,b,class\n1,\"2,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":2:3", "closing quote"});
  p = with("negative.csv", "a,class\n1,0\n2,-1\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":3:3", "label -1", "negative"});
  p = with("header.csv", "a,class\n");
  expect_input_error([&] { open_dataset(cfg); }, {p, "no samples"});
  p = with("one.csv", "a,class\n1,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {p, "1 row(s)", "too few"});
  p = with("twice.csv", "a,a,class\n1,2,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {p + ":1:3", "'a' appears twice"});
  // A validation file with other feature columns.
  with("train.csv", "a,b,class\n1,2,0\n3,4,1\n");
  cfg.val_path = temp_path("val.csv");
  write_file(cfg.val_path, "a,c,class\n1,2,0\n");
  expect_input_error([&] { open_dataset(cfg); }, {cfg.val_path, "(a, c)", "(a, b)"});
}

// ---- Loader ----

// Sample i is x = (i, -i) and y = i: batches show exactly which samples they hold. Optionally fails on one.
class CountingDataset final : public Dataset {
 public:
  CountingDataset(int64_t train, int64_t val, int64_t fail_at = -1) : fail_at_(fail_at) {
    spec_.sample_shape = {2};
    spec_.num_classes = train;
    spec_.train_size = train;
    spec_.val_size = val;
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  void fill(Split, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    if (i == fail_at_) throw input_error(cat("sample ", i, " is unreadable"));
    x.data<float>()[row * 2] = static_cast<float>(i);
    x.data<float>()[row * 2 + 1] = static_cast<float>(-i);
    y.data<int64_t>()[row] = i;
  }
  int64_t memory_bytes() const override { return 0; }  // samples are computed

 private:
  DataSpec spec_;
  int64_t fail_at_;
};

std::vector<int64_t> ids(const Batch& b) {
  return {b.y.data<int64_t>(), b.y.data<int64_t>() + b.y.numel()};
}

// The sample ids of the next `n` batches.
std::vector<std::vector<int64_t>> take(Loader& l, int n) {
  std::vector<std::vector<int64_t>> out;
  for (int k = 0; k < n; ++k) out.push_back(ids(l.next()));
  return out;
}

TEST(LoaderTrain, SameSeedSameBatchesAndEpochsDiffer) {
  const CountingDataset data(50, 10);
  Loader a(data, Split::train, 10, true, 7, 2), b(data, Split::train, 10, true, 7, 2);
  Loader c(data, Split::train, 10, true, 8, 2);
  const auto ea = take(a, 10), eb = take(b, 10), ec = take(c, 10);
  EXPECT_EQ(ea, eb);
  EXPECT_NE(ea, ec);
  const std::vector<std::vector<int64_t>> epoch0(ea.begin(), ea.begin() + 5),
      epoch1(ea.begin() + 5, ea.end());
  EXPECT_NE(epoch0, epoch1);
}

TEST(LoaderTrain, EverySampleOncePerEpoch) {
  const CountingDataset data(100, 10);
  Loader l(data, Split::train, 10, true, 3, 1);
  EXPECT_EQ(l.batches_per_epoch(), 10);
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int64_t> seen;
    for (const auto& b : take(l, 10)) seen.insert(seen.end(), b.begin(), b.end());
    std::sort(seen.begin(), seen.end());
    for (int64_t i = 0; i < 100; ++i) ASSERT_EQ(seen[static_cast<size_t>(i)], i) << "epoch " << epoch;
  }
  // With a remainder, an epoch's full batches still hold distinct samples.
  const CountingDataset odd(103, 10);
  Loader lo(odd, Split::train, 10, true, 3, 0);
  std::set<int64_t> distinct;
  for (const auto& b : take(lo, 10)) distinct.insert(b.begin(), b.end());
  EXPECT_EQ(distinct.size(), 100u);
  EXPECT_EQ(lo.position().epoch, 1);
  EXPECT_EQ(lo.position().index, 0);
}

// The micro-batches of one step (3 of 4 samples) see, joined, the samples of the unsplit batch of 12 in every
// epoch: of 46 samples an epoch is 3 steps, so 9 micro-batches, not floor(46 / 4) = 11 (which made the fourth
// step take 2 micro-batches of one epoch and 1 of the next).
TEST(LoaderTrain, AStepsMicroBatchesNeverStraddleEpochs) {
  const CountingDataset data(46, 10);
  Loader whole(data, Split::train, 12, true, 9, 0);
  Loader micro(data, Split::train, 4, true, 9, 2, {}, 0, 1, 3);
  EXPECT_EQ(whole.batches_per_epoch(), 3);
  EXPECT_EQ(micro.batches_per_epoch(), 9);
  for (int step = 0; step < 10; ++step) {
    std::vector<int64_t> joined;
    for (const auto& b : take(micro, 3)) joined.insert(joined.end(), b.begin(), b.end());
    ASSERT_EQ(joined, take(whole, 1).front()) << "step " << step;
  }
  expect_input_error([&] { Loader(data, Split::train, 16, true, 0, 0, {}, 0, 1, 3); }, {"batch size 48"});
}

TEST(LoaderTrain, WithoutShuffleTheOrderIsTheIdentity) {
  const CountingDataset data(7, 1);
  Loader l(data, Split::train, 3, false, 5, 2);
  EXPECT_EQ(take(l, 3), (std::vector<std::vector<int64_t>>{{0, 1, 2}, {3, 4, 5}, {0, 1, 2}}));
}

TEST(LoaderTrain, ResumeFromPositionEqualsContinuing) {
  const CountingDataset data(35, 10);
  for (int64_t prefetch : {0, 2}) {
    Loader straight(data, Split::train, 8, true, 11, prefetch);  // 4 batches per epoch
    const auto all = take(straight, 10);
    Loader first(data, Split::train, 8, true, 11, prefetch);
    EXPECT_EQ(take(first, 4), std::vector<std::vector<int64_t>>(all.begin(), all.begin() + 4));
    const LoaderPosition at = first.position();
    EXPECT_EQ(at.epoch, 1);
    EXPECT_EQ(at.index, 0);
    Loader resumed(data, Split::train, 8, true, 11, prefetch, at);
    EXPECT_EQ(resumed.position().epoch, 1);
    EXPECT_EQ(take(resumed, 6), std::vector<std::vector<int64_t>>(all.begin() + 4, all.end()));
    // And from the middle of an epoch.
    Loader mid(data, Split::train, 8, true, 11, prefetch, {1, 2});
    EXPECT_EQ(take(mid, 4), std::vector<std::vector<int64_t>>(all.begin() + 6, all.end()));
  }
}

TEST(LoaderTrain, PrefetchMatchesSynchronousAndKeepsTheCurrentBatch) {
  const CountingDataset data(64, 10);
  Loader sync(data, Split::train, 4, true, 1, 0), ahead(data, Split::train, 4, true, 1, 3);
  for (int k = 0; k < 40; ++k) {
    const Batch& s = sync.next();
    const Batch& a = ahead.next();
    const std::vector<int64_t> expected = ids(s);
    // Give the worker time to fill every free slot: the returned batch must not be among them.
    if (k % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(ids(a), expected) << "batch " << k;
    EXPECT_EQ(a.x.to_f64(), s.x.to_f64());
    EXPECT_EQ(a.position.epoch, s.position.epoch);
    EXPECT_EQ(a.position.index, s.position.index);
    EXPECT_EQ(ahead.position().index, a.position.index);
  }
}

// Samples of 1024 values (sample i: i + k / 1024), wide enough that a synchronous loader's batch of 64 rows
// is filled on the OpenMP team; each fill records the OpenMP thread that ran it. `fail_at` as
// CountingDataset's.
class WideDataset final : public Dataset {
 public:
  static constexpr int64_t kWidth = 1024;
  explicit WideDataset(int64_t fail_at = -1) : fail_at_(fail_at) {
    spec_.sample_shape = {kWidth};
    spec_.num_classes = 256;
    spec_.train_size = 256;
    spec_.val_size = 100;
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  void fill(Split, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    if (i == fail_at_) throw input_error(cat("sample ", i, " is unreadable"));
    for (int64_t k = 0; k < kWidth; ++k)
      x.data<float>()[row * kWidth + k] = static_cast<float>(i) + static_cast<float>(k) / kWidth;
    y.data<int64_t>()[row] = i;
#pragma omp critical(wide_dataset_threads)
    threads_.insert(omp_get_thread_num());
  }
  int64_t memory_bytes() const override {
    return 0;
  }
  // The OpenMP thread numbers that have filled a row since the last call.
  std::set<int> take_threads() const {
    std::set<int> t;
#pragma omp critical(wide_dataset_threads)
    t.swap(threads_);
    return t;
  }

 private:
  DataSpec spec_;
  int64_t fail_at_;
  mutable std::set<int> threads_;
};

// A synchronous loader fills a wide batch's rows on the OpenMP team, and its batches (train, and validation
// with its padded last batch) are bitwise those a prefetching worker fills row by row on its own thread; a
// row that fails there is an input_error from next().
TEST(LoaderTrain, SynchronousTeamFillMatchesTheWorkersRows) {
  const WideDataset data;
  const int saved = omp_get_max_threads();
  omp_set_num_threads(3);
  for (Split split : {Split::train, Split::val}) {
    Loader sync(data, split, 64, true, 7, 0), ahead(data, split, 64, true, 7, 2);
    for (int k = 0; k < 6; ++k) {
      data.take_threads();
      const Batch& s = sync.next();
      EXPECT_EQ(data.take_threads().size(), 3u) << "batch " << k;  // the team filled it
      const Batch& a = ahead.next();
      ASSERT_EQ(ids(a), ids(s)) << "batch " << k;
      ASSERT_EQ(a.valid, s.valid);
      ASSERT_EQ(0, std::memcmp(a.x.raw(), s.x.raw(), s.x.nbytes())) << "batch " << k;
    }
  }
  const WideDataset failing(70);
  Loader l(failing, Split::train, 64, false, 0, 0);
  EXPECT_EQ(ids(l.next()).back(), 63);
  expect_input_error([&] { l.next(); }, {"sample 70 is unreadable"});
  omp_set_num_threads(saved);
}

TEST(LoaderVal, InOrderWithPaddedLastBatchThenWraps) {
  const CountingDataset data(40, 25);
  for (int64_t prefetch : {0, 2}) {
    Loader l(data, Split::val, 10, true, 9, prefetch);
    EXPECT_EQ(l.batches_per_epoch(), 3);
    EXPECT_EQ(ids(l.next()), (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
    l.next();
    const Batch& last = l.next();
    EXPECT_EQ(last.valid, 5);
    EXPECT_EQ(ids(last), (std::vector<int64_t>{20, 21, 22, 23, 24, -100, -100, -100, -100, -100}));
    const auto x = last.x.to_f64();
    EXPECT_EQ(x[9], -24.0);
    EXPECT_TRUE(std::all_of(x.begin() + 10, x.end(), [](double v) { return v == 0.0; }));
    EXPECT_EQ(l.position().epoch, 1);
    const Batch& wrapped = l.next();
    EXPECT_EQ(wrapped.valid, 10);
    EXPECT_EQ(ids(wrapped).front(), 0);
  }
}

TEST(LoaderText, TargetsAreInputsShiftedByOne) {
  DataConfig cfg;
  cfg.dataset = "hdf5";
  cfg.path = text_file(200, 50);
  cfg.seq_len = 16;
  const auto ds = open_dataset(cfg);
  EXPECT_EQ(ds->size(Split::train), 199 / 16);
  Loader l(*ds, Split::train, 4, false, 0, 1);
  l.next();
  const Batch& b = l.next();  // samples 4..7
  ASSERT_EQ(b.x.shape(), (Shape{4, 16}));
  ASSERT_EQ(b.y.shape(), (Shape{4, 16}));
  for (int64_t r = 0; r < 4; ++r)
    for (int64_t t = 0; t < 16; ++t) {
      EXPECT_EQ(b.x.data<int64_t>()[r * 16 + t], (4 + r) * 16 + t);
      EXPECT_EQ(b.y.data<int64_t>()[r * 16 + t], (4 + r) * 16 + t + 1);
    }
  Loader v(*ds, Split::val, 2, false, 0, 0);  // 3 samples: the second batch has one padded row
  v.next();
  const Batch& pad = v.next();
  EXPECT_EQ(pad.valid, 1);
  EXPECT_EQ(pad.y.data<int64_t>()[16], -100);
  EXPECT_EQ(pad.y.data<int64_t>()[31], -100);
  EXPECT_EQ(pad.x.data<int64_t>()[16], 0);
}

TEST(LoaderErrors, BadSizesAndWorkerFailures) {
  const CountingDataset data(10, 3);
  expect_input_error([&] { Loader(data, Split::train, 11, true, 0, 0); }, {"batch size 11", "10 samples"});
  expect_input_error([&] { Loader(data, Split::train, 5, true, 0, 0, {0, 2}); }, {"batch 2", "2 batches"});
  const CountingDataset failing(10, 3, 5);
  for (int64_t prefetch : {0, 3}) {
    Loader l(failing, Split::train, 5, false, 0, prefetch);
    EXPECT_EQ(ids(l.next()), (std::vector<int64_t>{0, 1, 2, 3, 4}));
    expect_input_error([&] { l.next(); }, {"sample 5 is unreadable"});
  }
}

}  // namespace
}  // namespace flowrun::testing
