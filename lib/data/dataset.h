// Datasets for training: real data converted to HDF5 by the project's own code, and the batches a model
// sees. Two kinds: images (x (N, H, W) or (N, C, H, W) u8 + labels y (N) i64, normalised to f32 on load) and
// byte-level text (a u8 stream; samples are seq_len+1 windows, input = first seq_len, target = shifted by 1).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "config/config.h"
#include "core/tensor.h"

namespace flowrun {

// ---- Conversion (what `flowrun data` and the first training run do) ----
// Fashion-MNIST from Debian's dataset-fashion-mnist (gzipped IDX in `src_dir`, default
// /usr/share/datasets/fashion-mnist) -> one HDF5 with /train/x (60000,28,28 u8), /train/y (60000 i64),
// /test/x, /test/y, and attributes (source, classes). Written atomically (tmp + rename). `limit` > 0 keeps
// only the first `limit` images of each split (the pixel statistics are then those of the kept images).
void prepare_fashion_mnist(const std::string& out_path, const std::string& src_dir = "", int64_t limit = 0);
// The King James Bible from Debian's bible-kjv (`bible -f gen1:1-rev22:21`, verse references stripped,
// one verse per line) -> HDF5 with /train (first 90% of the bytes, u8) and /val (last 10%), attributes.
void prepare_kjv(const std::string& out_path);
// A CSV from sklearn's data folder (wine_data.csv, iris.csv, breast_cancer.csv) -> /train/x f32, /train/y,
// /test/x, /test/y (last 20% of a seeded shuffle as test).
void prepare_sklearn_table(const std::string& name, const std::string& out_path);
// Converts the built-in dataset `dataset` into `path` (logging what it reads); `limit` as for
// prepare_fashion_mnist (Fashion-MNIST only).
void prepare_dataset(const std::string& dataset, const std::string& path, int64_t limit = 0);
// Builds `path` for a built-in dataset name when it does not exist yet (prepare_dataset).
void ensure_dataset(const std::string& dataset, const std::string& path);
// Fashion-MNIST shaped like CIFAR for the ResNet configs: each image zero-padded by 2 pixels to 32x32 and
// repeated to 3 channels, /train/x (60000,3,32,32 u8) and /test/x, labels as Fashion-MNIST's. No pixel
// statistics are stored: training normalises with the train split's.
void prepare_fashion_mnist_3x32(const std::string& out_path, const std::string& src_dir = "");
// The built-in datasets' names (data.dataset and `flowrun data`), in the order the help lists them.
const std::vector<std::string>& builtin_datasets();
// The user's data cache, where converted datasets live: $FLOWRUN_DATA, else $XDG_CACHE_HOME/flowrun, else
// ~/.cache/flowrun (never the source tree: a checkout stays clean, and every build shares one cache).
std::string data_cache_dir();
// Where a dataset lives when data.path is empty: data_cache_dir() / NAME.h5.
std::string default_dataset_path(const std::string& dataset);

// ---- Conversion helpers (exposed for tests) ----
// A gzipped IDX file of unsigned bytes (magic 0x0800 | rank) as a u8 tensor of its dimensions; anything
// else (bad magic, rank, truncated or trailing data, broken gzip) is an input_error naming the file.
Tensor read_idx_gz(const std::string& path, int rank);
// The KJV from `bible -f gen1:1-rev22:21`: one verse per line, its leading reference removed.
std::string kjv_text();
// Per-channel mean and population standard deviation of x / 255 over a u8 (N, H, W) (one channel) or
// (N, C, H, W) tensor: the default image normalisation.
std::vector<std::pair<double, double>> pixel_stats(const Tensor& x);
// Per-feature mean and population standard deviation of an (N, F) f32 table: its standardisation.
struct FeatureStats {
  std::vector<double> mean, std;
};
FeatureStats feature_stats(const Tensor& x);

// ---- Reading ----
enum class Split { train, val };

// What a model's input looks like, for building the graph before any batch is read.
struct DataSpec {
  bool text = false;
  Shape sample_shape;       // per sample: (C, H, W) f32 for images, (seq_len) i64 for text
  int64_t num_classes = 0;  // classes, or the vocabulary (256) for text
  const char* token_unit = "byte";  // text: what a token is ("byte", or "token" for token files): bits per it
  int64_t train_size = 0;   // samples per epoch in the train split
  int64_t val_size = 0;     // samples in the validation split
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual const DataSpec& spec() const = 0;
  virtual int64_t size(Split s) const = 0;
  // Writes sample `i` of split `s` into row `row` of the batch tensors: x (B, sample_shape...) f32 or i64,
  // y (B) i64 for images or (B, seq_len) i64 for text.
  virtual void fill(Split s, int64_t i, Tensor& x, Tensor& y, int64_t row) const = 0;
  // A hint that sample `i` of split `s` is filled soon: a dataset whose samples sit in memory starts loading
  // them into the cache, so that a shuffled batch does not wait on each sample's cache misses in turn.
  virtual void prefetch(Split /*s*/, int64_t /*i*/) const {}
  // The bytes this dataset keeps resident: what it read into memory, and the mapped bytes of a file it reads
  // through a mapping (in the page cache as they are read, counted whole). For `flowrun plan`.
  virtual int64_t memory_bytes() const = 0;
};

// Opens the dataset a config names (building a built-in one first if its file is missing). Bad files,
// missing datasets and wrong shapes are input_errors naming the file.
std::unique_ptr<Dataset> open_dataset(const DataConfig& cfg);

}  // namespace flowrun
