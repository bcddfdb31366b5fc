// Checkpoints: bitwise round trip, pruning, ordering, damaged-file detection and fallback, stale temporary
// files, the inspect report, and crash safety under SIGKILL at random points of a save.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "ckpt/checkpoint.h"
#include "io/h5.h"

namespace flowrun::testing {
namespace {

namespace fs = std::filesystem;

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ =
        fs::path(::testing::TempDir()) / cat("flowrun-ckpt-", ::getpid(), "-",
                                             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir() const { return dir_.string(); }
  std::string at(const std::string& name) const { return (dir_ / name).string(); }

  fs::path dir_;
};

Tensor ramp(const Shape& shape, DType dtype, double offset) {
  Tensor t = Tensor::empty(shape, dtype);
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = offset + static_cast<double>(i % 97) * 0.25;
  t.fill_from(v);
  return t;
}

CheckpointData sample(int64_t step, int64_t elements = 64) {
  CheckpointData d;
  d.step = step;
  d.seed = (uint64_t{1} << 63) + 5;  // above int64's range: the bit pattern must survive
  d.config_yaml = "model: mlp\noptimizer:\n  lr: 0.1\n";
  d.loader_epoch = 3;
  d.loader_index = 320 + step;
  d.params["fc1/w"] = ramp({elements / 8, 8}, DType::f32, static_cast<double>(step));
  d.params["fc1/b"] = ramp({8}, DType::bf16, 1);
  d.params["emb"] = ramp({4, 2}, DType::f16, 2);
  d.params["count"] = ramp({}, DType::i64, 3);
  d.state["opt/fc1/w/m"] = ramp({elements / 8, 8}, DType::f64, -1);
  d.state["bn/empty"] = ramp({0, 3}, DType::f32, 0);
  d.scalars["loss_scale"] = 65536.0;
  d.scalars["lr"] = 0.1;
  return d;
}

void expect_same_tensors(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(b.count(name));
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.dtype(), u.dtype());
    ASSERT_EQ(t.shape(), u.shape());
    EXPECT_EQ(std::memcmp(t.raw(), u.raw(), t.nbytes()), 0);
  }
}

template <typename Fn>
void expect_input_error(Fn fn, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    for (const auto& p : parts) EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
  }
}

// Flips one byte inside the stored data of a contiguous dataset (found with H5Dget_offset).
void flip_data_byte(const std::string& file, const std::string& dataset) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  const hid_t d = H5Dopen2(f, dataset.c_str(), H5P_DEFAULT);
  ASSERT_GE(d, 0);
  const haddr_t offset = H5Dget_offset(d);
  H5Dclose(d);
  H5Fclose(f);
  ASSERT_NE(offset, HADDR_UNDEF);
  std::fstream io(file, std::ios::in | std::ios::out | std::ios::binary);
  io.seekg(static_cast<std::streamoff>(offset + 5));
  char c = 0;
  io.read(&c, 1);
  c = static_cast<char>(c ^ 0x10);
  io.seekp(static_cast<std::streamoff>(offset + 5));
  io.write(&c, 1);
}

// A pid that is certainly not running: a child that has exited and been reaped.
pid_t dead_pid() {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(0);
  ::waitpid(pid, nullptr, 0);
  return pid;
}

TEST_F(CheckpointTest, RoundTripIsBitwiseInEveryField) {
  const CheckpointData d = sample(42);
  const std::string path = save_checkpoint(dir(), d, 0);
  EXPECT_EQ(path, at("step_00000042.h5"));
  const CheckpointData r = load_checkpoint(path);
  EXPECT_EQ(r.step, d.step);
  EXPECT_EQ(r.seed, d.seed);
  EXPECT_EQ(r.config_yaml, d.config_yaml);
  EXPECT_EQ(r.loader_epoch, d.loader_epoch);
  EXPECT_EQ(r.loader_index, d.loader_index);
  EXPECT_EQ(r.scalars, d.scalars);
  expect_same_tensors(d.params, r.params);
  expect_same_tensors(d.state, r.state);
  const h5::File f(path, h5::File::Mode::read);
  EXPECT_EQ(f.attr_string("", "format"), "flowrun-checkpoint");
  EXPECT_EQ(f.attr_int("", "complete"), 1);
  EXPECT_EQ(f.attr_int("params/fc1/w", "crc32c"),
            h5::crc32c(d.params.at("fc1/w").raw(), d.params.at("fc1/w").nbytes()));
}

TEST_F(CheckpointTest, KeepsTheNewestKAndListsByStep) {
  for (int64_t s : {9, 10, 100, 2}) save_checkpoint(dir(), sample(s), 0);
  EXPECT_EQ(list_checkpoints(dir()),
            (std::vector<std::string>{at("step_00000002.h5"), at("step_00000009.h5"), at("step_00000010.h5"),
                                      at("step_00000100.h5")}));
  save_checkpoint(dir(), sample(101), 2);
  EXPECT_EQ(list_checkpoints(dir()),
            (std::vector<std::string>{at("step_00000100.h5"), at("step_00000101.h5")}));
  EXPECT_EQ(find_latest_checkpoint(dir()), at("step_00000101.h5"));
}

TEST_F(CheckpointTest, MissingDirectoryHasNoCheckpoints) {
  EXPECT_TRUE(list_checkpoints(at("nothing")).empty());
  EXPECT_EQ(find_latest_checkpoint(at("nothing")), "");
  expect_input_error([&] { load_checkpoint(at("step_00000001.h5")); },
                     {"step_00000001.h5", "does not exist"});
}

TEST_F(CheckpointTest, AnUnwritableDirectoryIsARuntimeError) {
  fs::create_directories(dir_);
  std::ofstream(at("file")) << "a file, not a directory";
  try {
    save_checkpoint(at("file"), sample(1), 0);
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::runtime);
    EXPECT_NE(std::string(e.what()).find(at("file")), std::string::npos) << e.what();
  }
}

TEST_F(CheckpointTest, FindLatestSkipsATruncatedNewestFile) {
  for (int64_t s : {1, 2, 3}) save_checkpoint(dir(), sample(s, 4096), 0);
  const std::string newest = at("step_00000003.h5");
  fs::resize_file(newest, fs::file_size(newest) / 2);
  EXPECT_EQ(find_latest_checkpoint(dir()), at("step_00000002.h5"));
  expect_input_error([&] { load_checkpoint(newest); },
                     {newest, "not a readable HDF5 file (damaged or incomplete)"});
}

TEST_F(CheckpointTest, FindLatestSkipsAFlippedDataByteAndLoadNamesTheDataset) {
  for (int64_t s : {1, 2}) save_checkpoint(dir(), sample(s, 4096), 0);
  const std::string newest = at("step_00000002.h5");
  flip_data_byte(newest, "params/fc1/w");
  EXPECT_EQ(find_latest_checkpoint(dir()), at("step_00000001.h5"));
  expect_input_error(
      [&] { load_checkpoint(newest); },
      {"checkpoint " + newest, "dataset params/fc1/w: checksum mismatch (stored 0x", "damaged"});
  EXPECT_NO_THROW(load_checkpoint(newest, false));  // without verification the bytes load as they are
  ::testing::internal::CaptureStdout();
  expect_input_error([&] { describe_checkpoint(newest); }, {newest, "params/fc1/w"});
  const std::string printed = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(printed.find("step:             2"), std::string::npos) << printed;
  EXPECT_NE(printed.find("MISMATCH"), std::string::npos) << printed;
  EXPECT_NE(printed.find("integrity: FAILED"), std::string::npos) << printed;
}

TEST_F(CheckpointTest, StaleTemporaryFilesAreNeverListedAndCleanedOnSave) {
  fs::create_directories(dir_);
  const std::string stale = at(cat("step_00000007.h5.tmp.", dead_pid()));
  const std::string mine = at(cat("step_00000008.h5.tmp.", ::getpid()));
  const std::string live = at("step_00000009.h5.tmp.1");  // pid 1 is always running
  for (const auto& p : {stale, mine, live}) std::ofstream(p) << "partial";
  std::ofstream(at("notes.txt")) << "not a checkpoint";
  EXPECT_TRUE(list_checkpoints(dir()).empty());
  EXPECT_EQ(find_latest_checkpoint(dir()), "");
  save_checkpoint(dir(), sample(1), 0);
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_FALSE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_TRUE(fs::exists(at("notes.txt")));
  EXPECT_EQ(list_checkpoints(dir()), std::vector<std::string>{at("step_00000001.h5")});
}

TEST_F(CheckpointTest, RejectsForeignIncompleteAndFutureFiles) {
  fs::create_directories(dir_);
  {
    h5::File f(at("foreign.h5"), h5::File::Mode::create);
    f.set_attr("", "format", std::string("something-else"));
  }
  expect_input_error([&] { load_checkpoint(at("foreign.h5")); }, {"foreign.h5", "not a flowrun checkpoint"});
  for (const auto& [name, version, complete] :
       {std::tuple{"future.h5", 99, 1}, std::tuple{"partial.h5", 1, 0}}) {
    h5::File f(at(name), h5::File::Mode::create);
    f.set_attr("", "format", std::string("flowrun-checkpoint"));
    f.set_attr("", "format_version", int64_t{version});
    if (complete) f.set_attr("", "complete", int64_t{1});
  }
  expect_input_error([&] { load_checkpoint(at("future.h5")); },
                     {"future.h5", "format_version 99", "reads format_version 1"});
  expect_input_error([&] { load_checkpoint(at("partial.h5")); }, {"partial.h5", "incomplete"});
  std::ofstream(at("text.h5")) << "hello";
  expect_input_error([&] { load_checkpoint(at("text.h5")); }, {"text.h5", "not a readable HDF5 file"});
}

TEST_F(CheckpointTest, DescribeReportsEveryFieldAndTensor) {
  const std::string path = save_checkpoint(dir(), sample(12), 0);
  const std::string report = describe_checkpoint(path);
  for (const std::string& part : std::vector<std::string>{
           "file:             " + path, "format:           flowrun-checkpoint v1", "step:             12",
           "seed:             9223372036854775813", "loader position:  epoch 3, index 332",
           "loss_scale=65536", "lr=0.10000000000000001", "fc1/w", "[8,8]", "bf16", "opt/fc1/w/m", "bn/empty",
           "params (4 tensors)", "state (2 tensors)",
           "total:            " + std::to_string(64 + 8 + 8 + 1) + " parameters", "  lr: 0.1",
           "integrity: OK (6 datasets verified)"})
    EXPECT_NE(report.find(part), std::string::npos) << part << "\n" << report;
}

// Each trial forks a child that saves ~4 MB checkpoints in a loop and kills it at a random moment; every
// checkpoint the parent can then see must load and verify.
TEST_F(CheckpointTest, SurvivesSigkillAtRandomPointsOfASave) {
  std::mt19937 rng(20240601);
  std::uniform_int_distribution<int> delay_ms(0, 50);
  for (int trial = 0; trial < 10; ++trial) {
    const pid_t child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      try {
        for (int64_t i = 0; i < 1000; ++i) save_checkpoint(dir(), sample(trial * 1000 + i, 1 << 18), 2);
      } catch (...) {
        ::_exit(3);
      }
      ::_exit(0);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms(rng)));
    ::kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the child stopped by itself with status " << status;
    const std::vector<std::string> listed = list_checkpoints(dir());
    for (const auto& p : listed) {
      SCOPED_TRACE(p);
      EXPECT_NO_THROW(load_checkpoint(p));
    }
    EXPECT_EQ(find_latest_checkpoint(dir()), listed.empty() ? "" : listed.back()) << "trial " << trial;
  }
  // Every writer is gone, so the next save leaves only the kept checkpoints.
  save_checkpoint(dir(), sample(100000), 2);
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir_)) {
    EXPECT_EQ(e.path().string().find(".tmp."), std::string::npos) << e.path();
    ++files;
  }
  EXPECT_LE(files, 2u);
}

}  // namespace
}  // namespace flowrun::testing
