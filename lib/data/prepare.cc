// Conversion of the built-in datasets (Fashion-MNIST, the King James Bible, scikit-learn tables) to HDF5.
#include <spdlog/spdlog.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <tuple>
#include <utility>

#include "core/signals.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/table.h"
#include "io/h5.h"

namespace flowrun {

namespace {

namespace fs = std::filesystem;

constexpr const char* kFashionDir = "/usr/share/datasets/fashion-mnist";
constexpr const char* kFashionClasses =
    "T-shirt/top,Trouser,Pullover,Dress,Coat,Sandal,Shirt,Sneaker,Bag,Ankle boot";
constexpr const char* kBibleCommand = "bible -f gen1:1-rev22:21 </dev/null 2>/dev/null";
// Fixed so that every conversion of a table gives the same train/test split.
constexpr RngStream kTableShuffle{0x7ab1e5eedull, 0};

// Writes an HDF5 file under a name unique to this process and call, then renames it over `path`: readers
// never see a partial file, and concurrent builders of one file (parallel tests) each rename a whole one.
void write_atomically(const std::string& path, const std::function<void(h5::File&)>& fill) {
  const fs::path target(path);
  std::error_code ec;
  if (target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  if (ec) throw runtime_error(cat(path, ": cannot create its directory: ", ec.message()));
  static std::atomic<uint64_t> counter{0};
  const std::string tmp = cat(path, ".tmp.", getpid(), ".", counter++);
  try {
    h5::File f(tmp, h5::File::Mode::create);
    fill(f);
    f.close();
    fs::rename(tmp, target, ec);
    if (ec) throw runtime_error(cat(path, ": cannot rename ", tmp, " to it: ", ec.message()));
  } catch (...) {
    fs::remove(tmp, ec);
    throw;
  }
}

struct ImageSplit {
  Tensor x;  // (N, 28, 28) u8
  Tensor y;  // (N) i64
};

ImageSplit read_fashion_split(const std::string& dir, const std::string& prefix) {
  const std::string images = cat(dir, "/", prefix, "-images-idx3-ubyte.gz");
  const std::string labels = cat(dir, "/", prefix, "-labels-idx1-ubyte.gz");
  for (const auto& f : {images, labels})
    if (!fs::exists(f))
      throw input_error(cat(f, ": not found (on Debian: apt-get install dataset-fashion-mnist)"));
  ImageSplit s{read_idx_gz(images, 3), Tensor()};
  const Shape& xs = s.x.shape();
  if (xs[1] != 28 || xs[2] != 28)
    throw input_error(cat(images, ": images are ", xs[1], "x", xs[2], ", Fashion-MNIST's are 28x28"));
  const Tensor y8 = read_idx_gz(labels, 1);
  if (y8.shape()[0] != xs[0])
    throw input_error(cat(labels, ": ", y8.shape()[0], " labels for the ", xs[0], " images of ", images));
  s.y = Tensor::empty({xs[0]}, DType::i64);
  for (int64_t i = 0; i < xs[0]; ++i) {
    const uint8_t v = y8.data<uint8_t>()[i];
    if (v >= 10) throw input_error(cat(labels, ": label ", int{v}, " of item ", i, " is not a class 0..9"));
    s.y.data<int64_t>()[i] = v;
  }
  return s;
}

// Rows `order[begin, end)` of a table as a new (x, y) pair.
std::pair<Tensor, Tensor> take_rows(const Table& t, const std::vector<int64_t>& order, size_t begin,
                                    size_t end) {
  const int64_t f = t.x.shape()[1];
  const auto n = static_cast<int64_t>(end - begin);
  Tensor x = Tensor::empty({n, f}, DType::f32);
  Tensor y = Tensor::empty({n}, DType::i64);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t src = order[begin + static_cast<size_t>(r)];
    std::copy_n(t.x.data<float>() + src * f, f, x.data<float>() + r * f);
    y.data<int64_t>()[r] = t.y.data<int64_t>()[src];
  }
  return {x, y};
}

std::string table_file(const std::string& name) {
  if (name == "wine") return "wine_data.csv";
  if (name == "iris") return "iris.csv";
  if (name == "breast_cancer") return "breast_cancer.csv";
  throw input_error(cat("unknown table dataset '", name, "' (wine, iris or breast_cancer)"));
}

}  // namespace

namespace {

// The first `limit` images of a split (all of them when limit is 0 or larger than the split).
ImageSplit first_images(ImageSplit s, int64_t limit) {
  const int64_t n = s.x.shape()[0];
  if (limit <= 0 || limit >= n) return s;
  ImageSplit cut{Tensor::empty({limit, 28, 28}, DType::u8), Tensor::empty({limit}, DType::i64)};
  std::memcpy(cut.x.raw(), s.x.raw(), cut.x.nbytes());
  std::memcpy(cut.y.raw(), s.y.raw(), cut.y.nbytes());
  return cut;
}

}  // namespace

void prepare_fashion_mnist(const std::string& out_path, const std::string& src_dir, int64_t limit) {
  const std::string dir = src_dir.empty() ? kFashionDir : src_dir;
  const ImageSplit train = first_images(read_fashion_split(dir, "train"), limit);
  const ImageSplit test = first_images(read_fashion_split(dir, "t10k"), limit);
  const auto [mean, sd] = pixel_stats(train.x)[0];
  write_atomically(out_path, [&](h5::File& f) {
    f.write("train/x", train.x);
    f.write("train/y", train.y);
    f.write("test/x", test.x);
    f.write("test/y", test.y);
    f.set_attr("", "source",
               limit > 0 ? cat("Fashion-MNIST (Zalando), the first ", limit,
                               " images of each split, converted from ", dir)
                         : cat("Fashion-MNIST (Zalando), converted from ", dir));
    f.set_attr("", "classes", std::string(kFashionClasses));
    f.set_attr("", "mean", mean);
    f.set_attr("", "std", sd);
  });
}

std::string kjv_text() {
  FILE* p = nullptr;
  {
    const UnblockedSignals child_mask;  // `bible` ends on Ctrl-C as it would alone
    p = popen(kBibleCommand, "r");
  }
  if (p == nullptr) throw runtime_error("cannot start a shell to run `bible`");
  std::string raw;
  std::array<char, 1 << 16> buf{};
  size_t got = 0;
  while ((got = fread(buf.data(), 1, buf.size(), p)) > 0) raw.append(buf.data(), got);
  const int status = pclose(p);
  if (status != 0 || raw.empty())
    throw input_error(cat("running `bible -f gen1:1-rev22:21` failed (exit status ",
                          WIFEXITED(status) ? WEXITSTATUS(status) : status,
                          "): install the King James Bible with `apt-get install bible-kjv`"));
  std::string text;
  text.reserve(raw.size());
  size_t start = 0;
  while (start < raw.size()) {
    size_t end = raw.find('\n', start);
    if (end == std::string::npos) end = raw.size();
    const size_t space = raw.find(' ', start);
    // "Ge1:1 In the beginning..." -> the verse after its reference; a line of a reference alone has no verse.
    if (space < end) text.append(raw, space + 1, end - space - 1).push_back('\n');
    start = end + 1;
  }
  return text;
}

void prepare_kjv(const std::string& out_path) {
  const std::string text = kjv_text();
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  const size_t n = text.size();
  const size_t n_train = n * 9 / 10;
  write_atomically(out_path, [&](h5::File& f) {
    f.write_bytes("train", bytes, n_train, true);
    f.write_bytes("val", bytes + n_train, n - n_train, true);
    f.set_attr("", "source", std::string("King James Bible (Debian bible-kjv, `bible -f gen1:1-rev22:21`)"));
    f.set_attr("", "bytes", static_cast<int64_t>(n));
    f.set_attr("", "train_bytes", static_cast<int64_t>(n_train));
    f.set_attr("", "val_bytes", static_cast<int64_t>(n - n_train));
  });
}

std::pair<Table, Table> split_table(const Table& t, const std::string& where) {
  const int64_t n = t.x.shape()[0];
  if (n < 2)
    throw input_error(cat(where, ": ", n, " row(s): too few to split into train and validation rows"));
  std::vector<int64_t> order(static_cast<size_t>(n));
  shuffle_permutation(order, kTableShuffle);
  const auto n_train = static_cast<size_t>(n - std::max<int64_t>(n / 5, 1));
  std::pair<Table, Table> out;
  std::tie(out.first.x, out.first.y) = take_rows(t, order, 0, n_train);
  std::tie(out.second.x, out.second.y) = take_rows(t, order, n_train, order.size());
  out.first.class_names = out.second.class_names = t.class_names;
  return out;
}

void prepare_sklearn_table(const std::string& name, const std::string& out_path) {
  const std::string csv = cat(sklearn_data_dir(), "/", table_file(name));
  const Table t = load_sklearn_csv(csv);
  const auto [train, test] = split_table(t, csv);
  const Tensor &train_x = train.x, &train_y = train.y, &test_x = test.x, &test_y = test.y;
  const FeatureStats stats = feature_stats(train_x);
  const auto f64 = [](const std::vector<double>& v) {
    return Tensor::from<double>({static_cast<int64_t>(v.size())}, v);
  };
  write_atomically(out_path, [&](h5::File& f) {
    f.write("train/x", train_x);
    f.write("train/y", train_y);
    f.write("test/x", test_x);
    f.write("test/y", test_y);
    f.write("feature_mean", f64(stats.mean));
    f.write("feature_std", f64(stats.std));
    f.set_attr("", "source", cat("scikit-learn ", csv));
    f.set_attr("", "classes", join(t.class_names, ","));
  });
}

void prepare_fashion_mnist_3x32(const std::string& out_path, const std::string& src_dir) {
  const std::string dir = src_dir.empty() ? kFashionDir : src_dir;
  const auto cifar_shaped = [](const Tensor& x) {
    const int64_t n = x.shape()[0];
    Tensor out = Tensor::zeros({n, 3, 32, 32}, DType::u8);
    const uint8_t* src = x.data<uint8_t>();
    uint8_t* dst = out.data<uint8_t>();
    for (int64_t i = 0; i < n; ++i)
      for (int64_t c = 0; c < 3; ++c)
        for (int64_t r = 0; r < 28; ++r)
          std::memcpy(dst + ((i * 3 + c) * 32 + r + 2) * 32 + 2, src + (i * 28 + r) * 28, 28);
    return out;
  };
  const ImageSplit train = read_fashion_split(dir, "train");
  const ImageSplit test = read_fashion_split(dir, "t10k");
  write_atomically(out_path, [&](h5::File& f) {
    f.write("train/x", cifar_shaped(train.x));
    f.write("train/y", train.y);
    f.write("test/x", cifar_shaped(test.x));
    f.write("test/y", test.y);
    f.set_attr("", "source",
               cat("Fashion-MNIST (Zalando) padded to 32x32, 3 channels, converted from ", dir));
    f.set_attr("", "classes", std::string(kFashionClasses));
  });
}

const std::vector<std::string>& builtin_datasets() {
  static const std::vector<std::string> names{"fashion_mnist", "fashion_mnist_3x32", "kjv", "wine",
                                              "iris",          "breast_cancer"};
  return names;
}

std::string data_cache_dir() {
  const auto env = [](const char* var) -> std::string {
    const char* v = std::getenv(var);
    return v != nullptr ? v : "";
  };
  if (const std::string d = env("FLOWRUN_DATA"); !d.empty()) return d;
  // The XDG base directory rule: a relative $XDG_CACHE_HOME is invalid and ignored.
  if (const std::string x = env("XDG_CACHE_HOME"); !x.empty() && x[0] == '/') return x + "/flowrun";
  const std::string home = env("HOME");
  if (home.empty())
    throw input_error("no data cache: set FLOWRUN_DATA (or HOME or XDG_CACHE_HOME) to a writable directory");
  return home + "/.cache/flowrun";
}

std::string default_dataset_path(const std::string& dataset) {
  return cat(data_cache_dir(), "/", dataset, ".h5");
}

void prepare_dataset(const std::string& dataset, const std::string& path, int64_t limit) {
  if (dataset == "fashion_mnist") {
    spdlog::info("preparing Fashion-MNIST -> {} (from {})", path, kFashionDir);
    prepare_fashion_mnist(path, "", limit);
  } else if (dataset == "fashion_mnist_3x32") {
    spdlog::info("preparing Fashion-MNIST padded to 3x32x32 -> {} (from {})", path, kFashionDir);
    prepare_fashion_mnist_3x32(path);
  } else if (dataset == "kjv") {
    spdlog::info("preparing the King James Bible -> {} (from `bible`)", path);
    prepare_kjv(path);
  } else if (dataset == "wine" || dataset == "iris" || dataset == "breast_cancer") {
    spdlog::info("preparing the {} table -> {} (from {})", dataset, path, sklearn_data_dir());
    prepare_sklearn_table(dataset, path);
  } else {
    std::string names;
    for (const std::string& n : builtin_datasets()) names += cat(n, ", ");
    throw input_error(cat("unknown dataset '", dataset, "' (", names, "or hdf5)"));
  }
}

void ensure_dataset(const std::string& dataset, const std::string& path) {
  if (fs::exists(path)) return;
  if (dataset == "hdf5")
    throw input_error(
        cat(path, ": dataset file not found (data.dataset is hdf5: data.path must name an existing file)"));
  prepare_dataset(dataset, path);
  spdlog::info("wrote {}", path);
}

}  // namespace flowrun
