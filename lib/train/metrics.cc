// JSON lines and the metrics file.
#include "train/metrics.h"

#include <cerrno>
#include <cmath>
#include <cstring>

#include "core/error.h"

namespace flowrun {

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

void JsonLine::key(const std::string& k) {
  if (!body_.empty()) body_ += ", ";
  body_ += cat('"', json_escape(k), "\": ");
}

JsonLine& JsonLine::add(const std::string& k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    body_ += buf;
  }
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}

JsonLine& JsonLine::add(const std::string& k, const std::string& v) {
  key(k);
  body_ += cat('"', json_escape(v), '"');
  return *this;
}

MetricsWriter::MetricsWriter(const std::string& path) : path_(path), f_(std::fopen(path.c_str(), "a")) {
  if (!f_)
    throw runtime_error(cat("cannot open metrics file ", path, " for writing: ", std::strerror(errno)));
}

MetricsWriter::~MetricsWriter() {
  std::fclose(f_);
}

void MetricsWriter::write(const JsonLine& line) {
  const std::string s = line.str() + "\n";
  if (std::fwrite(s.data(), 1, s.size(), f_) != s.size() || std::fflush(f_) != 0)
    throw runtime_error(cat("cannot write metrics file ", path_, ": ", std::strerror(errno)));
}

std::string fmt_num(double v, int digits) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.*g", digits, v);
  return buf;
}

}  // namespace flowrun
