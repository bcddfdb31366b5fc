// Safetensors reading and writing: the header through nlohmann-json, the data with checked pread/write.
#include "io/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <vector>

#include "core/error.h"

namespace flowrun::safetensors {
namespace {

using json = nlohmann::json;

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; tensors are copied as they are in memory");

// The reference implementation refuses headers over 100 MB: a larger length is a damaged file, not a header.
constexpr uint64_t kMaxHeader = 100'000'000;

// Element sizes of every dtype the format names (flowrun reads some of them).
const std::map<std::string, size_t>& element_sizes() {
  static const std::map<std::string, size_t> m = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E4M3", 1}, {"F8_E5M2", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  return m;
}

std::string known_dtypes() {
  std::string s;
  for (const auto& [name, size] : element_sizes()) s += cat(s.empty() ? "" : ", ", name);
  return s;
}

// A file descriptor closed on every path.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

// Exactly `n` bytes at `offset`, or an input_error saying where the file ends.
void read_at(int fd, void* buf, uint64_t n, uint64_t offset, const std::string& path,
             const std::string& what) {
  auto* p = static_cast<char*>(buf);
  uint64_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, p + done, static_cast<size_t>(std::min<uint64_t>(n - done, 1u << 30)),
                              static_cast<off_t>(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) throw runtime_error(cat("cannot read ", path, " (", what, "): ", std::strerror(errno)));
    if (r == 0)
      throw input_error(cat("safetensors file ", path, ": ", what, " ends at byte ", offset + done, " of ",
                            offset + n, ": the file is truncated"));
    done += static_cast<uint64_t>(r);
  }
}

void write_all(int fd, const void* buf, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(buf);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw runtime_error(cat("cannot write ", path, ": ", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

uint64_t file_size(int fd, const std::string& path) {
  const off_t end = ::lseek(fd, 0, SEEK_END);
  if (end < 0) throw runtime_error(cat("cannot seek in ", path, ": ", std::strerror(errno)));
  return static_cast<uint64_t>(end);
}

int open_read(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw input_error(cat("safetensors file ", path, ": cannot open: ", std::strerror(errno)));
  return fd;
}

Header read_header_fd(int fd, const std::string& path) {
  const uint64_t size = file_size(fd, path);
  if (size < 8)
    throw input_error(
        cat("safetensors file ", path, ": ", size,
            " bytes, shorter than the 8-byte header length: not a safetensors file, or truncated"));
  unsigned char len_bytes[8];
  read_at(fd, len_bytes, 8, 0, path, "the header length");
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | len_bytes[i];
  if (n > kMaxHeader || n > size - 8)
    throw input_error(cat("safetensors file ", path, ": header length ", n, " (bytes 0-7) ",
                          n > kMaxHeader ? cat("exceeds the format's limit of ", kMaxHeader, " bytes")
                                         : cat("runs past the end of the file (", size, " bytes)"),
                          ": not a safetensors file, or truncated"));
  std::string text(static_cast<size_t>(n), '\0');
  read_at(fd, text.data(), n, 8, path, "the header");
  return parse_header(text, size - 8 - n, path);
}

}  // namespace

const char* format_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::f16:
      return "F16";
    case DType::bf16:
      return "BF16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
  }
  return "?";
}

std::optional<DType> parse_format_dtype(const std::string& name) {
  for (DType t : kAllDTypes)
    if (name == format_dtype(t)) return t;
  return std::nullopt;
}

Header parse_header(const std::string& text, uint64_t data_bytes, const std::string& path) {
  const std::string where = cat("safetensors file ", path);
  // Duplicate names would silently keep the last entry: the parser's callback sees every key of the top
  // level object.
  std::set<std::string> seen;
  std::string duplicate;
  auto check_keys = [&](int depth, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::key && depth == 1 && !seen.insert(parsed.get<std::string>()).second &&
        duplicate.empty())
      duplicate = parsed.get<std::string>();
    return true;
  };
  json j;
  try {
    j = json::parse(text, check_keys);
  } catch (const json::parse_error& e) {
    // e.byte counts from 1 within the header text; the header starts at byte 8 of the file.
    throw input_error(cat(where, ": the header (bytes 8-", 8 + text.size() - 1,
                          ") is not valid JSON at byte ", 8 + (e.byte > 0 ? e.byte - 1 : 0),
                          " of the file: ", e.what()));
  }
  if (!duplicate.empty())
    throw input_error(cat(where, ": tensor '", duplicate, "' appears twice in the header"));
  if (!j.is_object())
    throw input_error(cat(where, ": the header is JSON ", j.type_name(), ", not an object"));
  Header h;
  h.data_start = 8 + text.size();
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (!v.is_object())
        throw input_error(cat(where, ": __metadata__ is ", v.type_name(), ", not an object"));
      for (const auto& [k, s] : v.items()) {
        if (!s.is_string())
          throw input_error(cat(where, ": __metadata__ '", k, "' is ", s.type_name(), ", not a string"));
        h.metadata[k] = s.get<std::string>();
      }
      continue;
    }
    const std::string t = cat(where, ": tensor '", name, "'");
    if (!v.is_object()) throw input_error(cat(t, ": its entry is ", v.type_name(), ", not an object"));
    for (const auto& [k, unused] : v.items())
      if (k != "dtype" && k != "shape" && k != "data_offsets")
        throw input_error(cat(t, ": unknown key '", k, "' (entries have dtype, shape, data_offsets)"));
    if (!v.contains("dtype") || !v["dtype"].is_string()) throw input_error(cat(t, ": no dtype string"));
    Entry e;
    e.dtype = v["dtype"].get<std::string>();
    const auto size = element_sizes().find(e.dtype);
    if (size == element_sizes().end())
      throw input_error(cat(t, ": unknown dtype '", e.dtype, "' (the format's: ", known_dtypes(), ")"));
    if (!v.contains("shape") || !v["shape"].is_array()) throw input_error(cat(t, ": no shape array"));
    uint64_t count = 1;
    bool overflow = false;
    for (const auto& d : v["shape"]) {
      if (!d.is_number_unsigned())
        throw input_error(
            cat(t, ": shape ", v["shape"].dump(), " holds ", d.dump(), ", not a non-negative integer"));
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(INT64_MAX) || (dim != 0 && count > UINT64_MAX / dim))
        overflow = true;
      else
        count *= dim;
      e.shape.push_back(static_cast<int64_t>(std::min<uint64_t>(dim, INT64_MAX)));
    }
    if (!v.contains("data_offsets") || !v["data_offsets"].is_array() || v["data_offsets"].size() != 2 ||
        !v["data_offsets"][0].is_number_unsigned() || !v["data_offsets"][1].is_number_unsigned())
      throw input_error(cat(t, ": data_offsets must be [begin, end], two non-negative integers, got ",
                            v.contains("data_offsets") ? v["data_offsets"].dump() : std::string("none")));
    e.begin = v["data_offsets"][0].get<uint64_t>();
    e.end = v["data_offsets"][1].get<uint64_t>();
    if (e.end < e.begin)
      throw input_error(cat(t, ": data_offsets [", e.begin, ", ", e.end, "] end before they begin"));
    if (e.end > data_bytes)
      throw input_error(cat(t, ": data_offsets [", e.begin, ", ", e.end, "] run past the data (", data_bytes,
                            " bytes from byte ", h.data_start, "): the file is truncated or damaged"));
    if (overflow || count > UINT64_MAX / size->second || count * size->second != e.end - e.begin)
      throw input_error(cat(t, ": ", e.dtype, " ", v["shape"].dump(), " needs ",
                            overflow ? std::string("more than 2^64") : cat(count * size->second),
                            " bytes but data_offsets [", e.begin, ", ", e.end, "] hold ", e.end - e.begin));
    h.tensors.emplace(name, std::move(e));
  }
  // The tensors tile the data area: sorted by offset, each begins where the previous one ends, and the last
  // ends where the file does.
  std::vector<std::pair<const std::string*, const Entry*>> order;
  for (const auto& [name, e] : h.tensors) order.emplace_back(&name, &e);
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::tie(a.second->begin, a.second->end) < std::tie(b.second->begin, b.second->end);
  });
  uint64_t at = 0;
  const std::string* prev = nullptr;
  for (const auto& [name, e] : order) {
    if (e->begin < at)
      throw input_error(cat(where, ": tensor '", *name, "' (data_offsets [", e->begin, ", ", e->end,
                            "]) overlaps tensor '", *prev, "' (ending at ", at, ")"));
    if (e->begin > at)
      throw input_error(cat(where, ": data bytes [", at, ", ", e->begin, ") before tensor '", *name,
                            "' belong to no tensor: the header does not describe the data"));
    at = e->end;
    prev = name;
  }
  if (at != data_bytes)
    throw input_error(cat(where, ": the tensors end at data byte ", at, " but the file has ", data_bytes,
                          " data bytes (from byte ", h.data_start,
                          "): the header does not describe the data"));
  return h;
}

Header read_header(const std::string& path) {
  Fd f{open_read(path)};
  return read_header_fd(f.fd, path);
}

std::map<std::string, Tensor> read(const std::string& path, std::map<std::string, std::string>* metadata) {
  Fd f{open_read(path)};
  const Header h = read_header_fd(f.fd, path);
  std::map<std::string, Tensor> out;
  for (const auto& [name, e] : h.tensors) {
    const std::optional<DType> t = parse_format_dtype(e.dtype);
    if (!t)
      throw input_error(cat("safetensors file ", path, ": tensor '", name, "' is ", e.dtype,
                            ", which flowrun does not read (it reads F32, F64, F16, BF16, I32, I64, U8)"));
    Tensor x = Tensor::empty(e.shape, *t);
    read_at(f.fd, x.raw(), e.end - e.begin, h.data_start + e.begin, path, cat("tensor '", name, "'"));
    out.emplace(name, std::move(x));
  }
  if (metadata) *metadata = h.metadata;
  return out;
}

void write(const std::string& path, const std::map<std::string, Tensor>& tensors,
           const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t at = 0;
  for (const auto& [name, t] : tensors) {
    FR_CHECK(name != "__metadata__", "a tensor cannot be named __metadata__");
    FR_CHECK(t.device() == kCpu, "safetensors::write takes CPU tensors: ", name);
    json shape = json::array();
    for (int64_t d : t.shape()) shape.push_back(d);
    json entry = json::object();
    entry["dtype"] = format_dtype(t.dtype());
    entry["shape"] = shape;
    entry["data_offsets"] = json::array({at, at + static_cast<uint64_t>(t.nbytes())});
    header[name] = entry;
    at += t.nbytes();
  }
  std::string text = header.dump();
  text.append((8 - (8 + text.size()) % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>((text.size() >> (8 * i)) & 0xff);
  Fd f{::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)};
  if (f.fd < 0) throw runtime_error(cat("cannot create ", path, ": ", std::strerror(errno)));
  write_all(f.fd, len, 8, path);
  write_all(f.fd, text.data(), text.size(), path);
  for (const auto& [name, t] : tensors) write_all(f.fd, t.raw(), t.nbytes(), path);
  const int fd = f.fd;
  f.fd = -1;
  if (::close(fd) != 0) throw runtime_error(cat("cannot write ", path, ": ", std::strerror(errno)));
}

}  // namespace flowrun::safetensors
