// The data loader: batches of a split in a per-epoch order shuffled from (seed, epoch), prepared ahead by
// one background thread. Its position (epoch, index of the next batch in the epoch) is the whole state:
// a loader restored to a position yields exactly the batches the original would have.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/rng.h"
#include "data/dataset.h"

namespace flowrun {

struct LoaderPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // batches already taken in this epoch
};

struct Batch {
  Tensor x, y;
  int64_t valid = 0;        // rows holding real samples (eval: the last batch is padded; padded y = -100)
  LoaderPosition position;  // the position *after* this batch
};

class Loader {
 public:
  // Train split: full batches only (an epoch has floor(size / batch) batches, the rest wait for the next
  // epoch's order); shuffled when `shuffle`. Val split: in order, every sample once, last batch padded.
  // Sharded (shards > 1, train split only): `batch` is the global batch, and this loader yields rows
  // [shard * batch / shards, (shard + 1) * batch / shards) of each, so data-parallel ranks see exactly the
  // samples one process would, split between them. A train epoch's batch count is a multiple of `group`:
  // the micro-batches of one optimizer step (gradient accumulation, pipeline micro-batches) never straddle
  // two epochs, so each step sees the samples of the unsplit batch.
  Loader(const Dataset& data, Split split, int64_t batch, bool shuffle, uint64_t seed, int64_t prefetch,
         LoaderPosition start = {}, int shard = 0, int shards = 1, int64_t group = 1);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  // The next batch (blocks until prefetched). It is one of the loader's ring buffers, returned by reference
  // so that taking it allocates nothing: valid until the next call to next(). Train loaders never end; val
  // loaders wrap to the start. An error of the background thread is rethrown here.
  const Batch& next();
  LoaderPosition position() const;  // of the next batch to be returned
  int64_t batches_per_epoch() const;

 private:
  // implementation-defined members (thread, queue, mutex, permutation cache)
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Overwrites `idx` with a uniformly random permutation of 0..size-1 (Fisher-Yates driven by `rng`): a pure
// function of the stream and the size, allocating nothing.
void shuffle_permutation(std::vector<int64_t>& idx, const RngStream& rng);

}  // namespace flowrun
