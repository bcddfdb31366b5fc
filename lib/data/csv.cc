// The CSV reader for data.dataset csv (see csv.h).
#include "data/csv.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>
#include <optional>

#include "config/schema.h"
#include "core/error.h"
#include "data/mapped.h"

namespace flowrun {

namespace {

struct Cell {
  std::string text;
  int64_t column = 0;  // 1-based byte column of the cell's start in its line
};

// One line's cells: split at commas; a cell in double quotes may hold commas, "" is a quote in it.
// Unquoted cells lose surrounding spaces.
std::vector<Cell> split_line(const std::string& line, const std::string& where) {
  std::vector<Cell> out;
  size_t i = 0;
  while (true) {
    Cell c;
    c.column = static_cast<int64_t>(i) + 1;
    size_t j = i;
    while (j < line.size() && line[j] == ' ') ++j;
    if (j < line.size() && line[j] == '"') {
      for (++j;; ++j) {
        if (j >= line.size())
          throw input_error(cat(where, ":", c.column, ": a quoted cell has no closing quote"));
        if (line[j] == '"') {
          if (j + 1 < line.size() && line[j + 1] == '"') {
            c.text.push_back('"');
            ++j;
          } else {
            break;
          }
        } else {
          c.text.push_back(line[j]);
        }
      }
      ++j;
      while (j < line.size() && line[j] == ' ') ++j;
      if (j < line.size() && line[j] != ',')
        throw input_error(cat(where, ":", j + 1, ": text after a quoted cell's closing quote"));
    } else {
      const size_t end = std::min(line.find(',', j), line.size());
      c.text = line.substr(j, end - j);
      while (!c.text.empty() && c.text.back() == ' ') c.text.pop_back();
      j = end;
    }
    out.push_back(std::move(c));
    if (j >= line.size()) return out;
    i = j + 1;  // past the comma
  }
}

// A file's lines with their 1-based numbers, without line ends ("\n" or "\r\n") and without empty lines.
std::vector<std::pair<int64_t, std::string>> read_lines(const std::string& path) {
  const MappedFile f(path);
  std::string text;
  f.with_range(0, f.size(),
               [&](const uint8_t* p) { text.assign(reinterpret_cast<const char*>(p), f.size()); });
  std::vector<std::pair<int64_t, std::string>> lines;
  int64_t number = 0;
  for (size_t at = 0; at < text.size();) {
    size_t end = text.find('\n', at);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(at, end - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    ++number;
    if (!line.empty()) lines.emplace_back(number, std::move(line));
    at = end + 1;
  }
  return lines;
}

// A file's cells before the labels become classes.
struct RawTable {
  std::string path;
  std::vector<std::string> features;  // the feature columns' names, in file order
  Tensor x;                           // (N, F) f32
  std::vector<Cell> labels;           // per row
  std::vector<int64_t> lines;         // per row: its line number
};

RawTable read_raw(const std::string& path, const std::string& label) {
  const auto lines = read_lines(path);
  if (lines.empty()) throw input_error(cat(path, ": empty file (a CSV table needs a header row and rows)"));
  const std::string head_where = cat(path, ":", lines[0].first);
  std::vector<std::string> names;
  for (const Cell& c : split_line(lines[0].second, head_where)) {
    if (std::find(names.begin(), names.end(), c.text) != names.end())
      throw input_error(
          cat(head_where, ":", c.column, ": column name '", c.text, "' appears twice in the header"));
    names.push_back(c.text);
  }
  const auto label_at = std::find(names.begin(), names.end(), label);
  if (label_at == names.end())
    throw input_error(cat(path, ": no column '", label, "' (data.label) in the header (line ", lines[0].first,
                          ": ", join(names), ")", config::did_you_mean(label, names)));
  const auto label_col = static_cast<size_t>(label_at - names.begin());
  if (names.size() < 2)
    throw input_error(cat(head_where, ": the header has only the label column '", label, "': no features"));
  RawTable t;
  t.path = path;
  for (size_t c = 0; c < names.size(); ++c)
    if (c != label_col) t.features.push_back(names[c]);
  const auto rows = static_cast<int64_t>(lines.size()) - 1;
  if (rows == 0) throw input_error(cat(path, ": only a header row, no samples"));
  const auto nf = static_cast<int64_t>(t.features.size());
  t.x = Tensor::empty({rows, nf}, DType::f32);
  float* x = t.x.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const auto& [number, line] = lines[static_cast<size_t>(r) + 1];
    const std::string where = cat(path, ":", number);
    const auto cells = split_line(line, where);
    if (cells.size() != names.size())
      throw input_error(
          cat(where, ": ", cells.size(), " cells, but the header has ", names.size(), " columns"));
    int64_t f = 0;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (c == label_col) continue;
      const std::string& s = cells[c].text;
      double v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size() || !std::isfinite(v))
        throw input_error(cat(where, ":", cells[c].column, ": column '", names[c], "': \"", s,
                              "\" is not a finite number (every column but data.label '", label,
                              "' is a numeric feature)"));
      x[r * nf + f++] = static_cast<float>(v);
    }
    t.labels.push_back(cells[label_col]);
    t.lines.push_back(number);
  }
  return t;
}

std::optional<int64_t> as_integer(const std::string& s) {
  int64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
  return v;
}

}  // namespace

std::vector<Table> read_csv_tables(const std::vector<std::string>& paths, const std::string& label) {
  FR_CHECK(!paths.empty(), "no CSV files");
  std::vector<RawTable> raw;
  for (const auto& p : paths) {
    raw.push_back(read_raw(p, label));
    if (raw.back().features != raw[0].features)
      throw input_error(cat(p, ": its feature columns (", join(raw.back().features), ") differ from ",
                            paths[0], "'s (", join(raw[0].features), ")"));
  }
  bool integer = true;
  for (const auto& t : raw)
    for (const Cell& c : t.labels) integer = integer && as_integer(c.text).has_value();
  // Class of each label text.
  std::map<std::string, int64_t> classes;
  std::vector<std::string> names;
  if (integer) {
    int64_t largest = -1;
    for (const auto& t : raw)
      for (size_t r = 0; r < t.labels.size(); ++r) {
        const int64_t v = *as_integer(t.labels[r].text);
        if (v < 0)
          throw input_error(cat(t.path, ":", t.lines[r], ":", t.labels[r].column, ": label ", v,
                                " of column '", label,
                                "' is negative (integer labels are classes 0, 1, ...)"));
        largest = std::max(largest, v);
      }
    for (int64_t k = 0; k <= largest; ++k) names.push_back(cat(k));
  } else {
    for (const auto& t : raw)
      for (const Cell& c : t.labels) classes.emplace(c.text, 0);
    for (auto& [text, k] : classes) {
      k = static_cast<int64_t>(names.size());
      names.push_back(text);
    }
    std::string listed;
    for (size_t k = 0; k < names.size() && k < 20; ++k) listed += cat(k ? ", " : "", names[k], "=", k);
    spdlog::info("{}: label column '{}' holds text: {} classes in sorted order ({}{})", paths[0], label,
                 names.size(), listed, names.size() > 20 ? ", ..." : "");
  }
  std::vector<Table> out;
  for (auto& t : raw) {
    Table table;
    table.x = t.x;
    table.y = Tensor::empty({t.x.shape()[0]}, DType::i64);
    for (size_t r = 0; r < t.labels.size(); ++r)
      table.y.data<int64_t>()[r] = integer ? *as_integer(t.labels[r].text) : classes.at(t.labels[r].text);
    table.class_names = names;
    out.push_back(std::move(table));
  }
  return out;
}

}  // namespace flowrun
