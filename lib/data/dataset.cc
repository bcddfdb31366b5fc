// Datasets: images, feature tables and byte-level text held in memory after reading their HDF5 file;
// the user's own text and token files (mapped, see mapped.h) and CSV tables.
#include "data/dataset.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <optional>
#include <set>

#include "data/csv.h"
#include "data/tokens.h"
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

// Starts loading [p, p + bytes) into the cache: a shuffled sample's bytes are a few lines at a random place,
// too short for the hardware prefetcher, and filling them one after another waited on each miss (a shuffled
// Fashion-MNIST sample took 0.7 us to fill, 0.3 with the next samples' bytes requested ahead).
void prefetch_bytes(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t o = 0; o < bytes; o += 64) __builtin_prefetch(c + o);
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
      const int64_t end = static_cast<int64_t>(c + 1) * plane_;
      int64_t p = static_cast<int64_t>(c) * plane_;
#if defined(__AVX512F__)
      // 16 table loads at a time (a gather): the same values, in about two thirds of the time on cached
      // bytes.
      for (; p + 16 <= end; p += 16) {
        const __m512i v =
            _mm512_maskz_cvtepu8_epi32(0xffff, _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + p)));
        _mm512_storeu_ps(out + p, _mm512_mask_i32gather_ps(_mm512_setzero_ps(), 0xffff, v, lut, 4));
      }
#endif
      for (; p < end; ++p) out[p] = lut[in[p]];
    }
    y.data<int64_t>()[row] = d.y.data<int64_t>()[i];
  }
  void prefetch(Split s, int64_t i) const override {
    prefetch_bytes(splits_[split_index(s)].x.data<uint8_t>() + i * sample_, sample_);
  }

  int64_t memory_bytes() const override {
    int64_t n = 0;
    for (const Labelled& d : splits_) n += static_cast<int64_t>(d.x.nbytes() + d.y.nbytes());
    return n;
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
  void prefetch(Split s, int64_t i) const override {
    const int64_t f = spec_.sample_shape[0];
    prefetch_bytes(splits_[split_index(s)].x.data<float>() + i * f, f * static_cast<int64_t>(sizeof(float)));
  }

  int64_t memory_bytes() const override {
    int64_t n = 0;
    for (const Labelled& d : splits_) n += static_cast<int64_t>(d.x.nbytes() + d.y.nbytes());
    return n;
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

// Language-model samples from a token stream (bytes of an HDF5 file or of any file, uint16 token files).
class TextDataset final : public Dataset {
 public:
  TextDataset(std::array<TokenSpan, 2> tokens, int64_t seq_len, int64_t vocab, const char* unit)
      : tokens_(std::move(tokens)), seq_len_(seq_len) {
    spec_.text = true;
    spec_.token_unit = unit;
    spec_.sample_shape = {seq_len};
    spec_.num_classes = vocab;
    spec_.train_size = (tokens_[0].count - 1) / seq_len;
    spec_.val_size = (tokens_[1].count - 1) / seq_len;
  }
  const DataSpec& spec() const override { return spec_; }
  int64_t size(Split s) const override { return s == Split::train ? spec_.train_size : spec_.val_size; }
  // Sample i: input tokens [iT, iT+T), target tokens [iT+1, iT+T+1) (the next token at every position).
  void fill(Split s, int64_t i, Tensor& x, Tensor& y, int64_t row) const override {
    FR_CHECK(i >= 0 && i < size(s) && row >= 0 && row < x.shape()[0], "sample ", i, " row ", row);
    const TokenSpan& span = tokens_[split_index(s)];
    int64_t* xo = x.data<int64_t>() + row * seq_len_;
    int64_t* yo = y.data<int64_t>() + row * seq_len_;
    span.with_tokens(i * seq_len_, seq_len_ + 1, [&](const uint8_t* in) {
      for (int64_t t = 0; t < seq_len_; ++t) {
        xo[t] = span.at(in, t);
        yo[t] = span.at(in, t + 1);
      }
    });
  }
  // The splits may share one file or one buffer: each is counted once. A file read per sample (pread, when
  // it cannot be mapped) keeps nothing.
  int64_t memory_bytes() const override {
    std::set<const void*> seen;
    int64_t n = 0;
    for (const TokenSpan& t : tokens_) {
      if (t.file ? seen.insert(t.file.get()).second && t.file->whole() : seen.insert(t.bytes.raw()).second)
        n += t.file ? t.file->size() : static_cast<int64_t>(t.bytes.nbytes());
    }
    return n;
  }

 private:
  std::array<TokenSpan, 2> tokens_;
  int64_t seq_len_;
  DataSpec spec_;
};

void check_seq_len(const DataConfig& cfg) {
  if (cfg.seq_len < 1) throw input_error(cat("data.seq_len is ", cfg.seq_len, ", must be at least 1"));
}

// A split must hold one sample: seq_len + 1 tokens.
void require_one_sample(const TokenSpan& s, int64_t seq_len, const char* unit) {
  if (s.count < seq_len + 1)
    throw input_error(cat(s.where, " has ", s.count, " ", unit, ", fewer than one sample of data.seq_len ",
                          seq_len, " + 1"));
}

TokenSpan read_text(const h5::File& f, const std::string& ds, int64_t seq_len) {
  require(f, ds, "u8 bytes (n)");
  const Shape s = f.shape(ds);
  if (f.dtype(ds) != DType::u8 || s.size() != 1)
    throw input_error(cat(f.path(), ": /", ds, " is ", describe(f, ds), ", expected u8 bytes (n)"));
  TokenSpan span;
  span.count = s[0];
  span.where = cat(f.path(), ": /", ds);
  require_one_sample(span, seq_len, "bytes");
  span.bytes = f.read(ds);
  return span;
}

std::unique_ptr<Dataset> open_text(const DataConfig& cfg, const h5::File& f, const h5::File& vf) {
  check_seq_len(cfg);
  return std::make_unique<TextDataset>(
      std::array<TokenSpan, 2>{read_text(f, "train", cfg.seq_len), read_text(vf, "val", cfg.seq_len)},
      cfg.seq_len, 256, "byte");
}

// Train and validation streams of a user's file: data.val_path's, else the last 10% of data.path's (as
// prepare_kjv splits the Bible).
std::array<TokenSpan, 2> train_and_val(const DataConfig& cfg, const TokenSpan& train,
                                       const std::function<TokenSpan(const std::string&)>& open,
                                       const char* unit) {
  std::array<TokenSpan, 2> out{train, TokenSpan()};
  if (!cfg.val_path.empty()) {
    out[1] = open(cfg.val_path);
  } else {
    const int64_t n_train = train.count * 9 / 10;
    auto [head, tail] = cut_tokens(train, n_train);
    head.where = cat(train.where, " (its first 90%: ", unit, " [0, ", n_train, "), the train split)");
    tail.where = cat(train.where, " (its last 10%: ", unit, " [", n_train, ", ", train.count,
                     "), the validation split; or set data.val_path)");
    out = {head, tail};
  }
  for (const auto& s : out) require_one_sample(s, cfg.seq_len, unit);
  return out;
}

// data.dataset text: any file's bytes, vocabulary 256.
std::unique_ptr<Dataset> open_byte_text(const DataConfig& cfg) {
  check_seq_len(cfg);
  const auto open = [](const std::string& p) { return open_byte_file(p); };
  return std::make_unique<TextDataset>(train_and_val(cfg, open(cfg.path), open, "bytes"), cfg.seq_len, 256,
                                       "byte");
}

// data.dataset tokens: uint16 token files; every token checked against the vocabulary in one pass.
std::unique_ptr<Dataset> open_tokens(const DataConfig& cfg) {
  check_seq_len(cfg);
  const TokenFile train = open_token_file(cfg.path, cfg.token_format);
  int64_t vocab = cfg.vocab_size;
  std::string key = cat("data.vocab_size ", vocab);
  if (vocab == 0) {
    if (!train.llmc)
      throw input_error(cat(cfg.path,
                            ": a flat uint16 token file has no vocabulary size: set data.vocab_size "
                            "(your tokenizer's; 65536 holds any uint16 token)"));
    vocab = kGpt2Vocab;
    key = cat("GPT-2's, the default of llm.c's header version 1; set data.vocab_size for another tokenizer");
  }
  const auto open = [&](const std::string& p) {
    TokenSpan s = open_token_file(p, cfg.token_format).tokens;
    check_tokens_below(s, vocab, key);
    return s;
  };
  check_tokens_below(train.tokens, vocab, key);
  return std::make_unique<TextDataset>(train_and_val(cfg, train.tokens, open, "tokens"), cfg.seq_len, vocab,
                                       "token");
}

// ---- CSV ----

// data.dataset csv: the table (and data.val_path's, else a seeded 80/20 split), standardised with the
// train split's statistics.
std::unique_ptr<Dataset> open_csv(const DataConfig& cfg) {
  std::vector<std::string> paths{cfg.path};
  if (!cfg.val_path.empty()) paths.push_back(cfg.val_path);
  std::vector<Table> tables = read_csv_tables(paths, cfg.label);
  const int64_t classes = static_cast<int64_t>(tables[0].class_names.size());
  if (tables.size() == 1) {
    auto [train, val] = split_table(tables[0], cfg.path);
    tables = {std::move(train), std::move(val)};
  }
  std::array<Labelled, 2> splits{Labelled{tables[0].x, tables[0].y, cfg.path},
                                 Labelled{tables[1].x, tables[1].y, paths.back()}};
  const FeatureStats stats = feature_stats(splits[0].x);
  for (auto& s : splits) standardise(s.x, stats.mean, stats.std);
  return std::make_unique<TableDataset>(std::move(splits), classes);
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
  // The user's own files (fill_derived requires data.path for them).
  if (cfg.dataset == "text") return open_byte_text(cfg);
  if (cfg.dataset == "tokens") return open_tokens(cfg);
  if (cfg.dataset == "csv") return open_csv(cfg);
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
