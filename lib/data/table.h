// Tabular datasets: scikit-learn's bundled CSV files (first line "n_samples,n_features,class names...", then
// one row of features plus an integer class per line), read into tensors.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace flowrun {

struct Table {
  Tensor x;  // (N, F) f32
  Tensor y;  // (N) i64 class index
  std::vector<std::string> class_names;
};

// Throws input_error naming file:line for anything malformed.
Table load_sklearn_csv(const std::string& path);

// The seeded 80/20 split of the built-in tables: rows in an order shuffled by a fixed stream (the same split
// in every run, whatever train.seed), the last fifth of it the test split. Both must be non-empty: a table of
// fewer than 2 rows is an input_error naming `where`.
std::pair<Table, Table> split_table(const Table& t, const std::string& where);

// Where Debian's python3-sklearn keeps those files.
std::string sklearn_data_dir();

}  // namespace flowrun
