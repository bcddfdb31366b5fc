// Metrics sinks: one JSON object per line (metrics.jsonl), flushed as written so a crash loses nothing
// already logged; and number formatting for the progress line.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace flowrun {

// Builds one JSON object. Doubles are written with 17 significant digits (they round-trip exactly),
// non-finite values as null.
class JsonLine {
 public:
  JsonLine& add(const std::string& key, double v);
  JsonLine& add(const std::string& key, int64_t v);
  JsonLine& add(const std::string& key, int v) { return add(key, static_cast<int64_t>(v)); }
  JsonLine& add(const std::string& key, const std::string& v);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string json_escape(const std::string& s);

// Appends lines to a file, flushing each.
class MetricsWriter {
 public:
  explicit MetricsWriter(const std::string& path);
  ~MetricsWriter();
  MetricsWriter(const MetricsWriter&) = delete;
  MetricsWriter& operator=(const MetricsWriter&) = delete;
  void write(const JsonLine& line);

 private:
  std::string path_;
  std::FILE* f_;
};

// `v` with `digits` significant digits ("%.*g").
std::string fmt_num(double v, int digits);

}  // namespace flowrun
