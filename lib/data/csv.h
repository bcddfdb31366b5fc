// User tables as CSV: a header row of column names, then one row per sample; the column named by
// data.label holds the class, every other column is a numeric feature.
#pragma once

#include <string>
#include <vector>

#include "data/table.h"

namespace flowrun {

// Reads each of `paths` (train first, then validation if any) as a Table with the same columns and classes.
// Labels: integers 0, 1, ... when every label cell of every file is a non-negative integer (classes 0 to
// the largest); otherwise the distinct label strings of all files, sorted, are classes 0, 1, ... (their
// names are class_names). Every error is an input_error naming the file: a non-numeric feature cell
// (file:line:column and the column's name), a missing label column (the header's names, did-you-mean),
// ragged rows (file:line), a validation header unlike the train header, an empty table.
std::vector<Table> read_csv_tables(const std::vector<std::string>& paths, const std::string& label);

}  // namespace flowrun
