// Datasets held in memory after reading their HDF5 file: images, feature tables and byte-level text.
#include "data/dataset.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>

#include "io/h5.h"

namespace flowrun {

namespace {

constexpr const char* kImages = "u8 images (N, H, W) or (N, C, H, W)";
constexpr const char* kFeatures = "f32 features (N, F)";

// One split's samples and labels, with where they came from for error messages.
struct Labelled {
  Tensor x;           // (N, ...) as stored
  Tensor y;           // (N) i64
  std::string where;  // "file: /train"
};

size_t split_index(Split s) {
  return s == Split::train ? 0 : 1;
}

bool has_dataset(const h5::File& f, const std::string& name) {
  const auto all = f.datasets("");
  return std::find(all.begin(), all.end(), name) != all.end();
}

std::string describe(const h5::File& f, const std::string& ds) {
  return cat(dtype_name(f.dtype(ds)), " ", shape_str(f.shape(ds)));
}

void require(const h5::File& f, const std::string& ds, const std::string& what) {
  if (!has_dataset(f, ds)) throw input_error(cat(f.path(), ": missing dataset /", ds, " (", what, ")"));
}

// Reads `prefix`x and `prefix`y, checking x against the accepted dtype/ranks and y against x's length.
Labelled read_labelled(const h5::File& f, const std::string& prefix, DType x_dtype,
                       const std::vector<size_t>& ranks, const std::string& expected) {
  const std::string xs = cat(prefix, "x"), ys = cat(prefix, "y");
  require(f, xs, expected);
  const Shape shape = f.shape(xs);
  if (f.dtype(xs) != x_dtype || std::find(ranks.begin(), ranks.end(), shape.size()) == ranks.end() ||
      shape[0] == 0)
    throw input_error(cat(f.path(), ": /", xs, " is ", describe(f, xs), ", expected ", expected));
  require(f, ys, "labels (N) of integers");
  const DType yt = f.dtype(ys);
  if ((yt != DType::i64 && yt != DType::i32 && yt != DType::u8) || f.shape(ys) != Shape{shape[0]})
    throw input_error(
        cat(f.path(), ": /", ys, " is ", describe(f, ys), ", expected integer labels (", shape[0], ")"));
  Tensor y = f.read(ys);
  return {f.read(xs), yt == DType::i64 ? y : y.to(DType::i64), cat(f.path(), ": /", ys)};
}

// The validation split's group: /test in the main file; in a separate data.val_path file /test or the root.
std::string val_prefix(const h5::File& vf, bool separate) {
  return !separate || has_dataset(vf, "test/x") ? "test/" : "";
}

// Classes: the names in the "classes" attribute, else the largest label + 1; every label must be one.
int64_t count_classes(const h5::File& f, const std::array<Labelled, 2>& splits) {
  int64_t n = 0;
  if (f.has_attr("", "classes")) {
    const std::string names = f.attr_string("", "classes");
    n = 1 + std::count(names.begin(), names.end(), ',');
  } else {
    for (const auto& s : splits)
      for (int64_t i = 0; i < s.y.numel(); ++i) n = std::max(n, s.y.data<int64_t>()[i] + 1);
  }
  for (const auto& s : splits)
    for (int64_t i = 0; i < s.y.numel(); ++i) {
      const int64_t v = s.y.data<int64_t>()[i];
      if (v < 0 || v >= n)
        throw input_error(cat(s.where, ": label ", v, " of sample ", i, " is not a class 0..", n - 1));
    }
  return n;
}

// ---- Images ----

// data.mean / data.std (one value or one per channel), else the file's attribute, else the train split's.
std::vector<double> image_stat(const std::vector<double>& configured, const char* key, const h5::File& f,
                               int64_t channels, const std::function<double(size_t)>& computed) {
  const auto c = static_cast<size_t>(channels);
  std::vector<double> out(c);
  if (!configured.empty()) {
    if (configured.size() != 1 && configured.size() != c)
      throw input_error(cat("data.", key, " has ", configured.size(), " values, but ", f.path(), " has ",
                            channels, " channel(s)"));
    for (size_t i = 0; i < c; ++i) out[i] = configured.size() == 1 ? configured[0] : configured[i];
  } else if (f.has_attr("", key)) {
    std::fill(out.begin(), out.end(), f.attr_double("", key));
  } else {
    for (size_t i = 0; i < c; ++i) out[i] = computed(i);
  }
  return out;
}

class ImageDataset final : public Dataset {
 public:
  ImageDataset(std::array<Labelled, 2> splits, const std::vector<double>& mean, const std::vector<double>& sd,
               int64_t num_classes)
      : splits_(std::move(splits)) {
    const Shape& s = splits_[0].x.shape();
    spec_.sample_shape = s.size() == 3 ? Shape{1, s[1], s[2]} : Shape{s[1], s[2], s[3]};
    spec_.num_classes = num_classes;
    spec_.train_size = s[0];
    spec_.val_size = splits_[1].x.shape()[0];
    sample_ = numel(spec_.sample_shape);
    plane_ = sample_ / spec_.sample_shape[0];
    // A lookup table per channel: normalising a pixel is one load.
    lut_.resize(mean.size());
    for (size_t c = 0; c < mean.size(); ++c)
      for (int v = 0; v < 256; ++v) lut_[c][v] = static_cast<float>((v / 255.0 - mean[c]) / sd[c]);
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  void fill(Split s, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    const Labelled& d = splits_[split_index(s)];
    FR_CHECK(i >= 0 && i < size(s) && row >= 0 && row < x.shape()[0], "sample ", i, " row ", row);
    const uint8_t* in = d.x.data<uint8_t>() + i * sample_;
    float* out = x.data<float>() + row * sample_;
    for (size_t c = 0; c < lut_.size(); ++c) {
      const float* lut = lut_[c].data();
      const int64_t base = static_cast<int64_t>(c) * plane_;
      for (int64_t p = base; p < base + plane_; ++p) out[p] = lut[in[p]];
    }
    y.data<int64_t>()[row] = d.y.data<int64_t>()[i];
  }

 private:
  std::array<Labelled, 2> splits_;
  DataSpec spec_;
  int64_t sample_ = 0, plane_ = 0;
  std::vector<std::array<float, 256>> lut_;
};

std::unique_ptr<Dataset> open_images(const DataConfig& cfg, const h5::File& f, const h5::File& vf,
                                     bool separate) {
  const std::string expected = cat(kImages, " (or ", kFeatures, ")");
  std::array<Labelled, 2> splits{read_labelled(f, "train/", DType::u8, {3, 4}, expected),
                                 read_labelled(vf, val_prefix(vf, separate), DType::u8, {3, 4}, expected)};
  const Shape& ts = splits[0].x.shape();
  const Shape& vs = splits[1].x.shape();
  if (!std::equal(ts.begin() + 1, ts.end(), vs.begin() + 1, vs.end()))
    throw input_error(
        cat(vf.path(), ": validation images are ", shape_str(vs), ", the train images ", shape_str(ts)));
  const int64_t channels = ts.size() == 3 ? 1 : ts[1];
  std::optional<std::vector<std::pair<double, double>>> stats;
  const auto computed = [&](size_t c, bool want_std) {
    if (!stats) stats = pixel_stats(splits[0].x);
    return want_std ? (*stats)[c].second : (*stats)[c].first;
  };
  const auto mean = image_stat(cfg.mean, "mean", f, channels, [&](size_t c) { return computed(c, false); });
  const auto sd = image_stat(cfg.std, "std", f, channels, [&](size_t c) { return computed(c, true); });
  for (double v : sd)
    if (!(v > 0))
      throw input_error(cat(f.path(), ": image standard deviation ", v, " (data.std) must be positive"));
  const int64_t classes = count_classes(f, splits);
  return std::make_unique<ImageDataset>(std::move(splits), mean, sd, classes);
}

// ---- Tables ----

class TableDataset final : public Dataset {
 public:
  TableDataset(std::array<Labelled, 2> splits, int64_t num_classes) : splits_(std::move(splits)) {
    spec_.sample_shape = {splits_[0].x.shape()[1]};
    spec_.num_classes = num_classes;
    spec_.train_size = splits_[0].x.shape()[0];
    spec_.val_size = splits_[1].x.shape()[0];
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  void fill(Split s, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    const Labelled& d = splits_[split_index(s)];
    const int64_t f = spec_.sample_shape[0];
    FR_CHECK(i >= 0 && i < size(s) && row >= 0 && row < x.shape()[0], "sample ", i, " row ", row);
    std::copy_n(d.x.data<float>() + i * f, f, x.data<float>() + row * f);
    y.data<int64_t>()[row] = d.y.data<int64_t>()[i];
  }

 private:
  std::array<Labelled, 2> splits_;
  DataSpec spec_;
};

// Per-feature (mean, std): the file's /feature_mean and /feature_std when present, else the train split's.
FeatureStats table_stats(const h5::File& f, const Tensor& train) {
  const int64_t nf = train.shape()[1];
  if (!has_dataset(f, "feature_mean") || !has_dataset(f, "feature_std")) return feature_stats(train);
  for (const char* ds : {"feature_mean", "feature_std"})
    if (f.dtype(ds) != DType::f64 || f.shape(ds) != Shape{nf})
      throw input_error(cat(f.path(), ": /", ds, " is ", describe(f, ds), ", expected f64 (", nf, ")"));
  return {f.read("feature_mean").to_f64(), f.read("feature_std").to_f64()};
}

// In place: (x - mean) / std per feature; a constant feature (std 0) is only centred.
void standardise(Tensor& x, const std::vector<double>& mean, const std::vector<double>& sd) {
  const size_t nf = mean.size();
  float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t c = static_cast<size_t>(i) % nf;
    p[i] = static_cast<float>((p[i] - mean[c]) / (sd[c] > 0 ? sd[c] : 1.0));
  }
}

std::unique_ptr<Dataset> open_table(const h5::File& f, const h5::File& vf, bool separate) {
  const std::string expected = cat(kFeatures, " (or ", kImages, ")");
  std::array<Labelled, 2> splits{read_labelled(f, "train/", DType::f32, {2}, expected),
                                 read_labelled(vf, val_prefix(vf, separate), DType::f32, {2}, expected)};
  if (splits[1].x.shape()[1] != splits[0].x.shape()[1])
    throw input_error(cat(vf.path(), ": validation features are ", shape_str(splits[1].x.shape()),
                          ", the train ", shape_str(splits[0].x.shape())));
  const FeatureStats stats = table_stats(f, splits[0].x);
  for (auto& s : splits) standardise(s.x, stats.mean, stats.std);
  const int64_t classes = count_classes(f, splits);
  return std::make_unique<TableDataset>(std::move(splits), classes);
}

// ---- Text ----

class TextDataset final : public Dataset {
 public:
  TextDataset(std::array<Tensor, 2> bytes, int64_t seq_len) : bytes_(std::move(bytes)), seq_len_(seq_len) {
    spec_.text = true;
    spec_.sample_shape = {seq_len};
    spec_.num_classes = 256;
    spec_.train_size = (bytes_[0].numel() - 1) / seq_len;
    spec_.val_size = (bytes_[1].numel() - 1) / seq_len;
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  // Sample i: input bytes [iT, iT+T), target bytes [iT+1, iT+T+1) (the next byte at every position).
  void fill(Split s, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    FR_CHECK(i >= 0 && i < size(s) && row >= 0 && row < x.shape()[0], "sample ", i, " row ", row);
    const uint8_t* in = bytes_[split_index(s)].data<uint8_t>() + i * seq_len_;
    int64_t* xo = x.data<int64_t>() + row * seq_len_;
    int64_t* yo = y.data<int64_t>() + row * seq_len_;
    for (int64_t t = 0; t < seq_len_; ++t) {
      xo[t] = in[t];
      yo[t] = in[t + 1];
    }
  }

 private:
  std::array<Tensor, 2> bytes_;
  int64_t seq_len_;
  DataSpec spec_;
};

Tensor read_text(const h5::File& f, const std::string& ds, int64_t seq_len) {
  require(f, ds, "u8 bytes (n)");
  const Shape s = f.shape(ds);
  if (f.dtype(ds) != DType::u8 || s.size() != 1)
    throw input_error(cat(f.path(), ": /", ds, " is ", describe(f, ds), ", expected u8 bytes (n)"));
  if (s[0] < seq_len + 1)
    throw input_error(cat(f.path(), ": /", ds, " has ", s[0],
                          " bytes, fewer than one sample of data.seq_len ", seq_len, " + 1"));
  return f.read(ds);
}

std::unique_ptr<Dataset> open_text(const DataConfig& cfg, const h5::File& f, const h5::File& vf) {
  if (cfg.seq_len < 1) throw input_error(cat("data.seq_len is ", cfg.seq_len, ", must be at least 1"));
  return std::make_unique<TextDataset>(
      std::array<Tensor, 2>{read_text(f, "train", cfg.seq_len), read_text(vf, "val", cfg.seq_len)},
      cfg.seq_len);
}

}  // namespace

std::vector<std::pair<double, double>> pixel_stats(const Tensor& x) {
  FR_CHECK(x.dtype() == DType::u8 && (x.shape().size() == 3 || x.shape().size() == 4), "images ",
           shape_str(x.shape()));
  const int64_t channels = x.shape().size() == 3 ? 1 : x.shape()[1];
  const int64_t plane = x.shape().end()[-1] * x.shape().end()[-2];
  // Exact sums from a byte histogram per channel.
  std::vector<std::array<int64_t, 256>> hist(static_cast<size_t>(channels), std::array<int64_t, 256>{});
  const uint8_t* p = x.data<uint8_t>();
  for (int64_t s = 0; s < x.shape()[0]; ++s)
    for (auto& h : hist)
      for (int64_t q = 0; q < plane; ++q) ++h[*p++];
  std::vector<std::pair<double, double>> out;
  for (const auto& h : hist) {
    double n = 0, sum = 0, sq = 0;
    for (int v = 0; v < 256; ++v) {
      n += static_cast<double>(h[v]);
      sum += static_cast<double>(h[v]) * (v / 255.0);
    }
    const double mean = sum / n;
    for (int v = 0; v < 256; ++v) sq += static_cast<double>(h[v]) * std::pow(v / 255.0 - mean, 2);
    out.emplace_back(mean, std::sqrt(sq / n));
  }
  return out;
}

FeatureStats feature_stats(const Tensor& x) {
  FR_CHECK(x.dtype() == DType::f32 && x.shape().size() == 2, "features ", shape_str(x.shape()));
  const int64_t n = x.shape()[0];
  const auto nf = static_cast<size_t>(x.shape()[1]);
  FeatureStats s{std::vector<double>(nf, 0.0), std::vector<double>(nf, 0.0)};
  const float* p = x.data<float>();
  for (int64_t i = 0; i < x.numel(); ++i) s.mean[static_cast<size_t>(i) % nf] += p[i];
  for (auto& v : s.mean) v /= static_cast<double>(n);
  for (int64_t i = 0; i < x.numel(); ++i) {
    const size_t c = static_cast<size_t>(i) % nf;
    s.std[c] += (p[i] - s.mean[c]) * (p[i] - s.mean[c]);
  }
  for (auto& v : s.std) v = std::sqrt(v / static_cast<double>(n));
  return s;
}

std::unique_ptr<Dataset> open_dataset(const DataConfig& cfg) {
  const std::string path = cfg.path.empty() ? default_dataset_path(cfg.dataset) : cfg.path;
  ensure_dataset(cfg.dataset, path);
  const h5::File f(path, h5::File::Mode::read);
  const bool separate = !cfg.val_path.empty();
  std::optional<h5::File> val_file;
  if (separate) val_file.emplace(cfg.val_path, h5::File::Mode::read);
  const h5::File& vf = separate ? *val_file : f;
  // The layout tells the kind: /train a byte stream (text), or /train/x u8 images or f32 features.
  if (has_dataset(f, "train")) return open_text(cfg, f, vf);
  require(f, "train/x", cat(kImages, ", ", kFeatures, ", or /train as u8 text"));
  if (f.dtype("train/x") == DType::f32) return open_table(f, vf, separate);
  return open_images(cfg, f, vf, separate);
}

}  // namespace flowrun
