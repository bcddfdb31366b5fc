// Reader for scikit-learn's bundled CSV tables.
#include "data/table.h"

#include <charconv>
#include <fstream>
#include <sstream>

#include "core/error.h"

namespace flowrun {

namespace {

std::vector<std::string> split_commas(const std::string& line) {
  std::vector<std::string> out;
  std::string cell;
  std::istringstream is(line);
  while (std::getline(is, cell, ',')) {
    while (!cell.empty() && (cell.back() == '\r' || cell.back() == ' ')) cell.pop_back();
    out.push_back(cell);
  }
  return out;
}

double parse_number(const std::string& s, const std::string& where) {
  double v = 0;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, v);
  if (ec != std::errc() || ptr != end) throw input_error(cat(where, ": expected a number, got \"", s, "\""));
  return v;
}

}  // namespace

std::string sklearn_data_dir() { return "/usr/lib/python3/dist-packages/sklearn/datasets/data"; }

Table load_sklearn_csv(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw input_error(cat(path, ": cannot open (on Debian: apt-get install python3-sklearn)"));
  std::string line;
  if (!std::getline(in, line)) throw input_error(cat(path, ":1: empty file"));
  const auto head = split_commas(line);
  if (head.size() < 3) throw input_error(cat(path, ":1: expected \"n_samples,n_features,class names...\""));
  const auto n = static_cast<int64_t>(parse_number(head[0], path + ":1:1"));
  const auto f = static_cast<int64_t>(parse_number(head[1], path + ":1:2"));
  if (n <= 0 || f <= 0) throw input_error(cat(path, ":1: sample and feature counts must be positive"));
  Table t;
  t.class_names.assign(head.begin() + 2, head.end());
  t.x = Tensor::empty({n, f}, DType::f32);
  t.y = Tensor::empty({n}, DType::i64);
  for (int64_t r = 0; r < n; ++r) {
    const std::string where = cat(path, ":", r + 2);
    if (!std::getline(in, line)) throw input_error(cat(where, ": file ends after ", r, " of ", n, " rows"));
    const auto cells = split_commas(line);
    if (static_cast<int64_t>(cells.size()) != f + 1)
      throw input_error(cat(where, ": expected ", f + 1, " values, got ", cells.size()));
    for (int64_t c = 0; c < f; ++c)
      t.x.data<float>()[r * f + c] = static_cast<float>(parse_number(cells[static_cast<size_t>(c)], cat(where, ":", c + 1)));
    const double label = parse_number(cells.back(), cat(where, ":", f + 1));
    if (label < 0 || label >= static_cast<double>(t.class_names.size()) || label != static_cast<int64_t>(label))
      throw input_error(cat(where, ": class ", cells.back(), " is not one of the ", t.class_names.size(), " classes"));
    t.y.data<int64_t>()[r] = static_cast<int64_t>(label);
  }
  return t;
}

}  // namespace flowrun
