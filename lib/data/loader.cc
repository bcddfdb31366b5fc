// The data loader: per-epoch shuffled train order, padded in-order validation, a background prefetch ring.
#include "data/loader.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "ops/cpu/parallel.h"

namespace flowrun {

namespace {

// Mixed with the epoch into the stream id, so the loader's shuffles are independent of other uses of the
// seed.
constexpr uint64_t kLoaderStream = 0x10AD3Eull;
// Targets of padded rows: the value cross-entropy ignores.
constexpr int64_t kIgnoreIndex = -100;
// How many rows ahead of the one it fills a training batch asks the dataset to prefetch (Dataset::prefetch):
// 2 to 8 gave the same fill time on a shuffled Fashion-MNIST batch, 16 was slower.
constexpr int64_t kPrefetchRows = 4;
// Batch elements (rows x sample elements) from which a synchronous loader fills its rows on the OpenMP team.
constexpr int64_t kTeamFillElements = 1 << 15;

}  // namespace

void shuffle_permutation(std::vector<int64_t>& idx, const RngStream& rng) {
  const auto n = static_cast<int64_t>(idx.size());
  for (int64_t i = 0; i < n; ++i) idx[static_cast<size_t>(i)] = i;
  for (int64_t i = n - 1; i > 0; --i) {
    const auto b = rng.block(static_cast<uint64_t>(i));
    // 64 random bits: the modulo bias is below 2^-40 for any dataset size.
    const uint64_t r = (uint64_t{b[0]} << 32) | b[1];
    std::swap(idx[static_cast<size_t>(i)], idx[r % static_cast<uint64_t>(i + 1)]);
  }
}

struct Loader::Impl {
  const Dataset& data;
  Split split;
  int64_t batch;
  bool shuffle;
  uint64_t seed;
  int64_t size = 0, per_epoch = 0;
  std::vector<Batch> ring;  // prefetch + 1 slots (one when synchronous)

  // Producer state: the worker thread's, or the caller's when synchronous.
  LoaderPosition produce_at;
  std::vector<int64_t> perm;  // this epoch's order (train with shuffle)
  int64_t perm_epoch = -1;

  LoaderPosition next_at;  // consumer: position of the next batch next() returns

  // Ring state shared with the worker. Slots first_ready .. first_ready+ready-1 hold prepared batches; when
  // `held`, the slot before first_ready is the caller's current batch and must not be overwritten.
  std::mutex mu;
  std::condition_variable cv;
  size_t first_ready = 0, ready = 0;
  bool held = false, stop = false;
  std::exception_ptr error;
  std::thread worker;

  int64_t rows = 0, first_row = 0;  // this shard's rows of each batch (all of it when unsharded)
  bool team_fill = false;           // synchronous: rows are filled on the OpenMP team (fill_rows)

  Impl(const Dataset& d, Split s, int64_t b, bool sh, uint64_t sd)
      : data(d), split(s), batch(b), shuffle(sh && s == Split::train), seed(sd) {}

  void advance(LoaderPosition& p) const {
    if (++p.index == per_epoch) {
      ++p.epoch;
      p.index = 0;
    }
  }

  void fill_train(Batch& b, const LoaderPosition& at) {
    if (shuffle && perm_epoch != at.epoch) {
      shuffle_permutation(perm, RngStream{seed, mix_stream(static_cast<uint64_t>(at.epoch), kLoaderStream)});
      perm_epoch = at.epoch;
    }
    const int64_t first = at.index * batch + first_row;
    auto sample = [&](int64_t r) { return shuffle ? perm[static_cast<size_t>(first + r)] : first + r; };
    fill_rows(rows, b, [&](int64_t s, int64_t e) {
      for (int64_t r = s; r < std::min(e, s + kPrefetchRows); ++r) data.prefetch(split, sample(r));
      for (int64_t r = s; r < e; ++r) {
        if (r + kPrefetchRows < e) data.prefetch(split, sample(r + kPrefetchRows));
        data.fill(split, sample(r), b.x, b.y, r);
      }
    });
    b.valid = rows;
  }

  // fill(s, e) over the rows [0, n) of b. A synchronous loader (the training thread waits for the batch)
  // splits them over the OpenMP team as the kernels split their work (cpu::parallel_for), whose other threads
  // would otherwise spin idle meanwhile: the bench MLP's batch took about 3% of its step on one thread. A
  // worker thread fills in order on its own: a team started from it would be a second one beside the
  // trainer's. Each row is the same bytes either way.
  template <typename F>
  void fill_rows(int64_t n, const Batch& b, F&& fill) {
    if (!team_fill) {
      fill(int64_t{0}, n);
      return;
    }
    const int64_t per_row = std::max<int64_t>(1, b.x.numel() / b.x.shape()[0]);
    // A failed row (a short read) is rethrown here: an exception must not leave an OpenMP region.
    std::exception_ptr failed;
    cpu::parallel_for(n, (kTeamFillElements - 1) / per_row, [&](int64_t s, int64_t e) {
      try {
        fill(s, e);
      } catch (...) {
#pragma omp critical(flowrun_loader_fill_error)
        if (!failed) failed = std::current_exception();
      }
    });
    if (failed) std::rethrow_exception(failed);
  }

  // In order; rows past the end of the split are zeros with ignored targets.
  void fill_val(Batch& b, const LoaderPosition& at) {
    const int64_t first = at.index * batch;
    b.valid = std::min(batch, size - first);
    fill_rows(b.valid, b, [&](int64_t s, int64_t e) {
      for (int64_t r = s; r < e; ++r) data.fill(split, first + r, b.x, b.y, r);
    });
    const size_t x_row = b.x.nbytes() / static_cast<size_t>(batch);
    std::memset(static_cast<char*>(b.x.raw()) + x_row * static_cast<size_t>(b.valid), 0,
                x_row * static_cast<size_t>(batch - b.valid));
    const int64_t y_row = b.y.numel() / batch;
    std::fill(b.y.data<int64_t>() + y_row * b.valid, b.y.data<int64_t>() + b.y.numel(), kIgnoreIndex);
  }

  void produce(Batch& b) {
    if (split == Split::train)
      fill_train(b, produce_at);
    else
      fill_val(b, produce_at);
    advance(produce_at);
    b.position = produce_at;
  }

  // The worker: fills free slots in ring order until stopped; an exception ends it and is handed to next().
  void run() {
    try {
      for (;;) {
        size_t slot = 0;
        {
          std::unique_lock<std::mutex> lk(mu);
          cv.wait(lk, [&] { return stop || ready + (held ? 1 : 0) < ring.size(); });
          if (stop) return;
          slot = (first_ready + ready) % ring.size();
        }
        produce(ring[slot]);
        {
          std::lock_guard<std::mutex> lk(mu);
          ++ready;
        }
        cv.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu);
      error = std::current_exception();
      cv.notify_all();
    }
  }

  const Batch& take() {
    std::unique_lock<std::mutex> lk(mu);
    if (held) {
      held = false;  // the caller's previous batch may be refilled now
      cv.notify_all();
    }
    cv.wait(lk, [&] { return ready > 0 || error; });
    // Batches prepared before a failure are still returned in order; then the failure.
    if (ready == 0) std::rethrow_exception(error);
    const Batch& b = ring[first_ready];
    first_ready = (first_ready + 1) % ring.size();
    --ready;
    held = true;
    return b;
  }
};

Loader::Loader(const Dataset& data, Split split, int64_t batch, bool shuffle, uint64_t seed, int64_t prefetch,
               LoaderPosition start, int shard, int shards, int64_t group)
    : impl_(std::make_unique<Impl>(data, split, batch, shuffle, seed)) {
  Impl& m = *impl_;
  FR_CHECK(shards >= 1 && shard >= 0 && shard < shards && (shards == 1 || split == Split::train),
           "loader shard ", shard, " of ", shards);
  if (batch % shards != 0)
    throw input_error(
        cat("batch size ", batch, " does not split evenly over ", shards, " data-parallel ranks"));
  m.rows = batch / shards;
  m.first_row = shard * m.rows;
  const char* name = split == Split::train ? "train" : "validation";
  m.size = data.size(split);
  if (batch < 1) throw input_error(cat("batch size ", batch, " must be at least 1"));
  if (prefetch < 0) throw input_error(cat("data.prefetch is ", prefetch, ", must be at least 0"));
  if (m.size < 1) throw input_error(cat("the ", name, " split is empty"));
  if (group < 1) throw input_error(cat("micro-batches per step ", group, " must be at least 1"));
  if (split == Split::train && batch * group > m.size)
    throw input_error(cat("batch size ", batch * group, " is larger than the ", m.size,
                          " samples of the train split: an epoch needs at least one full batch"));
  m.per_epoch = split == Split::train ? m.size / (batch * group) * group : (m.size + batch - 1) / batch;
  if (start.epoch < 0 || start.index < 0 || start.index >= m.per_epoch)
    throw input_error(cat("loader position (epoch ", start.epoch, ", batch ", start.index,
                          ") is outside the ", m.per_epoch, " batches per epoch of the ", name,
                          " split (batch size ", batch, ")"));
  m.produce_at = m.next_at = start;
  if (m.shuffle) m.perm.resize(static_cast<size_t>(m.size));

  const DataSpec& spec = data.spec();
  Shape x_shape{m.rows};
  x_shape.insert(x_shape.end(), spec.sample_shape.begin(), spec.sample_shape.end());
  const Shape y_shape = spec.text ? x_shape : Shape{m.rows};
  m.ring.resize(static_cast<size_t>(prefetch) + 1);
  for (Batch& b : m.ring) {
    b.x = Tensor::zeros(x_shape, spec.text ? DType::i64 : DType::f32);
    b.y = Tensor::zeros(y_shape, DType::i64);
  }
  m.team_fill = prefetch == 0;
  if (prefetch > 0) m.worker = std::thread([&m] { m.run(); });
}

Loader::~Loader() {
  if (!impl_->worker.joinable()) return;
  {
    std::lock_guard<std::mutex> lk(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv.notify_all();
  impl_->worker.join();
}

const Batch& Loader::next() {
  Impl& m = *impl_;
  if (!m.worker.joinable()) {
    m.produce(m.ring[0]);  // synchronous: one slot, refilled in place
    m.next_at = m.ring[0].position;
    return m.ring[0];
  }
  const Batch& b = m.take();
  m.next_at = b.position;
  return b;
}

LoaderPosition Loader::position() const {
  return impl_->next_at;
}

int64_t Loader::batches_per_epoch() const {
  return impl_->per_epoch;
}

}  // namespace flowrun
