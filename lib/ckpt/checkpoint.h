// HDF5 checkpoints: the parameters, optimizer/BN state, step, resolved config, RNG seed and data-loader
// position of a run, written atomically (temporary name, fsync, rename, fsync of the directory) with a
// CRC-32C per dataset, verified on load. Layout (h5dump shows it):
//   /params/<param name>      one dataset per parameter (its graph name, '/' are groups)
//   /state/<state name>       optimizer state ("opt/<param>/m") and running statistics
//   attributes on the root:   format ("flowrun-checkpoint"), format_version, flowrun_version, step,
//                             seed, config (resolved YAML), loader_epoch, loader_index, complete (=1, last)
//   attribute "crc32c" on every dataset (CRC-32C of its raw little-endian bytes, as int64)
//   root attributes "scalar/<name>" (f64) for CheckpointData::scalars; seed is stored as the int64 with the
//   same bit pattern. Writing: `<final name>.tmp.<pid>` until complete; one saver per directory at a time.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace flowrun {

struct CheckpointData {
  int64_t step = 0;
  uint64_t seed = 0;
  std::string config_yaml;   // the resolved config
  int64_t loader_epoch = 0;  // data-loader position: next batch is (epoch, index)
  int64_t loader_index = 0;
  std::map<std::string, Tensor> params;  // by graph value name
  std::map<std::string, Tensor> state;   // by graph value name
  // Extra numeric run state (e.g. the loss scaler), stored as root attributes "scalar/<name>".
  std::map<std::string, double> scalars;
  // One rank's file of a sharded checkpoint: where each of its tensors sits in the whole, one line per
  // tensor, "<name>\t<ShardInfo::str()>" (root attribute "layout"). Empty in a whole checkpoint.
  std::string layout;
};

// Where one rank's tensor sits in the whole: a piece `part` of `parts` along the tensor axis's SBP (the
// whole shape `whole`), itself possibly cut into `zero` flat ZeRO shards of a `zshape` tensor (this is
// shard `zpart`).
struct ShardInfo {
  std::string tensor = "B";
  int64_t parts = 1, part = 0;
  std::vector<int64_t> whole;
  int64_t zero = 0, zpart = 0;
  std::vector<int64_t> zshape;
  std::string str() const;
};

// Sharded checkpoints: a directory "step_<step>.shards" of one "rank_<r>.h5" per rank (each a checkpoint of
// the tensors that rank holds, with CheckpointData::layout), written without gathering anything.
std::string sharded_checkpoint_name(int64_t step);
// Writes this rank's file into `tmp_dir` (which the caller created), durably.
void write_shard_file(const std::string& tmp_dir, int rank, const CheckpointData& data);
// After every rank wrote its file: renames `tmp_dir` to `<dir>/step_<step>.shards`, then prunes as
// save_checkpoint does. Returns the final path.
std::string commit_sharded_checkpoint(const std::string& dir, const std::string& tmp_dir, int64_t step, int64_t keep);

// Compares the parameters and state of two checkpoints tensor by tensor: for each, the largest |a - b|
// relative to the largest |a| of that tensor (so that entries near zero, e.g. gradients that cancel, do not
// dominate). Returns one line per tensor over `rtol`, or per tensor missing or of another shape on one side;
// empty when they agree. `worst` receives the largest relative difference seen.
std::vector<std::string> compare_checkpoints(const CheckpointData& a, const CheckpointData& b, double rtol,
                                             double* worst = nullptr);

// Whether state value `name` is the model's own (running statistics), not the optimizer's ("opt/...",
// gradient accumulators) or the loss scaler's ("amp/..."): what an export writes and an import restores.
bool is_model_state(const std::string& name);

// "step_<step zero-padded to 8>.h5": the name a checkpoint of `step` gets in its directory.
std::string checkpoint_file_name(int64_t step);

// Writes `final_path` through `write(tmp)` into `<final_path>.tmp.<pid>`, fsyncs it, renames it over
// `final_path` and fsyncs the directory; on any failure the temporary file is removed and `final_path` is
// left as it was (checkpoints, --dump-step files).
void replace_file_atomically(const std::string& final_path,
                             const std::function<void(const std::string&)>& write);

// Writes `<dir>/step_<step zero-padded to 8>.h5` atomically; creates `dir`. Returns the final path.
// Then deletes the oldest complete checkpoints beyond `keep` (0 = keep all) and stale *.tmp files.
std::string save_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep);

// Reads and verifies (format, complete flag, every crc32c). A missing, truncated, or damaged file is an
// input_error naming the file (and dataset). `verify=false` skips the checksum pass (inspect uses true).
// A sharded checkpoint (directory) is read whole: every rank file, the pieces put back together.
CheckpointData load_checkpoint(const std::string& path, bool verify = true);

// The newest checkpoint in `dir` that loads and verifies; skipped damaged/incomplete ones are logged
// (spdlog warn). "" when there is none.
std::string find_latest_checkpoint(const std::string& dir);

// Complete checkpoints in `dir`, oldest first (by step in the file name; *.tmp never listed).
std::vector<std::string> list_checkpoints(const std::string& dir);

// Human-readable report for `flowrun inspect`: step, config, every tensor (name, shape, dtype, crc ok),
// integrity verdict. Throws input_error for a damaged file after printing what it could.
std::string describe_checkpoint(const std::string& path);

}  // namespace flowrun
