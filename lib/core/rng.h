// Counter-based random numbers (Philox4x32-10): every draw is a pure function of (seed, stream, index), so
// dropout, initialisation and shuffling are reproducible and resume without hidden generator state.
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace flowrun {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key);

// Stream ids separate independent consumers of one seed (an op's id and the step, a parameter's index...).
struct RngStream {
  uint64_t seed = 0;
  uint64_t stream = 0;
  // Four independent 32-bit words for block `i`.
  std::array<uint32_t, 4> block(uint64_t i) const;
  // Uniform in [0, 1) with 24 bits, for element i (4 elements per Philox block).
  float uniform(uint64_t i) const;
  // Standard normal for element i (Box-Muller over one block).
  double normal(uint64_t i) const;
};

// Mix several ids into one stream id (e.g. op id and step).
uint64_t mix_stream(uint64_t a, uint64_t b);
// FNV-1a 64: a stable hash of a name (a parameter's, a node's), so that its RNG stream does not depend on
// build order or on the nodes other passes add.
uint64_t name_stream(const std::string& name);

}  // namespace flowrun
