// Checkpoints: atomic save (temporary file, fsync, rename, fsync of the directory), pruning, verified
// load, discovery of the newest good checkpoint, and the `flowrun inspect` report.
#include "ckpt/checkpoint.h"

#include <cmath>
#include <limits>

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <iomanip>
#include <iostream>
#include <optional>
#include <regex>
#include <sstream>

#include "io/h5.h"
#include "parallel/sbp.h"

namespace flowrun {
namespace {

namespace fs = std::filesystem;

constexpr char kFormat[] = "flowrun-checkpoint";
constexpr int64_t kFormatVersion = 1;
constexpr char kScalarPrefix[] = "scalar/";
constexpr char kCrcAttr[] = "crc32c";

// A problem this file diagnosed itself; its message already names the checkpoint.
class CheckpointError : public Error {
 public:
  explicit CheckpointError(const std::string& msg) : Error(ExitCode::bad_input, msg) {}
};

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08" PRIx32, v);
  return buf;
}

// step_00000012.h5 -> 12; nullopt for any other name (temporary files included).
std::optional<int64_t> checkpoint_step(const std::string& name) {
  static const std::regex re(R"(step_(\d+)\.(h5|shards))");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  return std::stoll(m[1].str());
}

// step_00000012.h5.tmp.4242 -> 4242 (the writer's pid).
std::optional<pid_t> temp_writer(const std::string& name) {
  static const std::regex re(R"(step_\d+\.h5\.tmp\.(\d+))");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return std::nullopt;
  return static_cast<pid_t>(std::stol(m[1].str()));
}


[[noreturn]] void throw_errno(const std::string& what, const std::string& path) {
  throw runtime_error(cat(what, " ", path, ": ", std::strerror(errno)));
}

// Data reaches the disk before the rename makes it visible, and the rename itself before we report success.
void fsync_path(const std::string& path, bool directory) {
  const int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) throw_errno("cannot open for fsync", path);
  const int rc = ::fsync(fd);
  const int saved = errno;
  ::close(fd);
  errno = saved;
  if (rc != 0) throw_errno("cannot fsync", path);
}

uint32_t tensor_crc(const Tensor& t) {
  return h5::crc32c(t.raw(), t.nbytes());
}

void write_tensors(h5::File& f, const std::string& group, const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    const std::string path = cat(group, "/", name);
    f.write(path, t);
    f.set_attr(path, kCrcAttr, static_cast<int64_t>(tensor_crc(t)));
  }
}

// The whole checkpoint, with `complete` last: a file without it was cut short.
void write_checkpoint(const std::string& path, const CheckpointData& d) {
  h5::File f(path, h5::File::Mode::create);
  f.set_attr("", "format", std::string(kFormat));
  f.set_attr("", "format_version", kFormatVersion);
  f.set_attr("", "flowrun_version", std::string(FLOWRUN_VERSION));
  f.set_attr("", "step", d.step);
  f.set_attr("", "seed", static_cast<int64_t>(d.seed));  // the uint64 bit pattern
  f.set_attr("", "config", d.config_yaml);
  f.set_attr("", "loader_epoch", d.loader_epoch);
  f.set_attr("", "loader_index", d.loader_index);
  for (const auto& [name, v] : d.scalars) f.set_attr("", cat(kScalarPrefix, name), v);
  if (!d.layout.empty()) f.set_attr("", "layout", d.layout);
  write_tensors(f, "params", d.params);
  write_tensors(f, "state", d.state);
  f.flush();  // tensors and their metadata are in the file before the flag that vouches for them
  f.set_attr("", "complete", int64_t{1});
  f.close();
}

// A temporary file's writer is gone when kill(pid, 0) says so; our own pid means an earlier failed save.
bool writer_is_gone(pid_t pid) {
  return pid == ::getpid() || (::kill(pid, 0) != 0 && errno == ESRCH);
}

void prune(const std::string& dir, int64_t keep) {
  const std::vector<std::string> all = list_checkpoints(dir);
  for (size_t i = 0; keep > 0 && i + static_cast<size_t>(keep) < all.size(); ++i) {
    std::error_code ec;
    if (fs::remove_all(all[i], ec) > 0)
      spdlog::info("removed old checkpoint {} (keeping the newest {})", all[i], keep);
    else if (ec)
      spdlog::warn("cannot remove old checkpoint {}: {}", all[i], ec.message());
  }
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto pid = temp_writer(entry.path().filename().string());
    if (!pid || !writer_is_gone(*pid)) continue;
    std::error_code rm;
    if (fs::remove(entry.path(), rm))
      spdlog::info("removed stale temporary checkpoint {}", entry.path().string());
  }
}

// HDF5's own reason from an h5 error ("truncated file: eof = ...") without the file name repeated.
std::string hdf5_reason(const Error& e) {
  const std::string msg = e.what();
  const size_t at = msg.find("(HDF5: ");
  if (at == std::string::npos || msg.back() != ')') return msg;
  return msg.substr(at + 1, msg.size() - at - 2);
}

// Opening fails as one clear input_error for missing, truncated or foreign files.
h5::File open_checkpoint(const std::string& path) {
  if (!fs::exists(path)) throw CheckpointError(cat("checkpoint ", path, " does not exist"));
  try {
    return h5::File(path, h5::File::Mode::read);
  } catch (const Error& e) {
    throw CheckpointError(
        cat("checkpoint ", path, " is not a readable HDF5 file (damaged or incomplete): ", hdf5_reason(e)));
  }
}

void check_header(const h5::File& f) {
  const std::string& path = f.path();
  if (!f.has_attr("", "format") || f.attr_string("", "format") != kFormat)
    throw CheckpointError(cat("checkpoint ", path, " is not a flowrun checkpoint (no format=\"", kFormat,
                              "\" attribute on the root)"));
  const int64_t version = f.attr_int("", "format_version");
  if (version != kFormatVersion)
    throw CheckpointError(cat("checkpoint ", path, " has format_version ", version, "; this flowrun (",
                              FLOWRUN_VERSION, ") reads format_version ", kFormatVersion));
  if (!f.has_attr("", "complete") || f.attr_int("", "complete") != 1)
    throw CheckpointError(cat("checkpoint ", path, " is incomplete: its writer stopped before finishing it"));
}

void read_header(const h5::File& f, CheckpointData& d) {
  d.step = f.attr_int("", "step");
  d.seed = static_cast<uint64_t>(f.attr_int("", "seed"));
  d.config_yaml = f.attr_string("", "config");
  d.loader_epoch = f.attr_int("", "loader_epoch");
  d.loader_index = f.attr_int("", "loader_index");
  const std::string prefix = kScalarPrefix;
  for (const auto& a : f.attrs(""))
    if (a.rfind(prefix, 0) == 0) d.scalars[a.substr(prefix.size())] = f.attr_double("", a);
  if (f.has_attr("", "layout")) d.layout = f.attr_string("", "layout");
}

// Dataset paths below `group` ("params"), or none when the group was never written (no tensors).
std::vector<std::string> group_datasets(const h5::File& f, const std::string& group) {
  return f.exists(group) ? f.datasets(group) : std::vector<std::string>{};
}

// nullopt when the stored checksum matches, else the reason.
std::optional<std::string> crc_problem(const h5::File& f, const std::string& dataset, const Tensor& t) {
  if (!f.has_attr(dataset, kCrcAttr)) return cat("dataset ", dataset, ": no ", kCrcAttr, " attribute");
  const auto stored = static_cast<uint32_t>(f.attr_int(dataset, kCrcAttr));
  const uint32_t computed = tensor_crc(t);
  if (stored == computed) return std::nullopt;
  return cat("dataset ", dataset, ": checksum mismatch (stored ", hex32(stored), ", computed ",
             hex32(computed), "): the file is damaged");
}

// Reads every tensor of `group`, verifying each when asked, and hands it to `sink` (name without group).
void read_group(const h5::File& f, const std::string& group, bool verify,
                const std::function<void(const std::string&, Tensor)>& sink) {
  for (const auto& ds : group_datasets(f, group)) {
    Tensor t = f.read(ds);
    if (verify)
      if (auto problem = crc_problem(f, ds, t))
        throw CheckpointError(cat("checkpoint ", f.path(), ": ", *problem));
    sink(ds.substr(group.size() + 1), std::move(t));
  }
}

// Runs `fn`, turning HDF5 failures below it into an input_error that names the checkpoint.
template <typename Fn>
auto guarded(const std::string& path, Fn fn) {
  try {
    return fn();
  } catch (const CheckpointError&) {
    throw;
  } catch (const Error& e) {
    throw CheckpointError(cat("checkpoint ", path, " is damaged: ", e.what()));
  }
}

std::string human_bytes(uintmax_t b) {
  std::ostringstream os;
  if (b < 1024)
    os << b << " B";
  else if (b < (1u << 20))
    os << std::fixed << std::setprecision(1) << b / 1024.0 << " KiB";
  else if (b < (1u << 30))
    os << std::fixed << std::setprecision(1) << b / 1048576.0 << " MiB";
  else
    os << std::fixed << std::setprecision(2) << b / 1073741824.0 << " GiB";
  return os.str();
}

// One table row of the report: a tensor and its verdict.
struct TensorRow {
  std::string name, shape, dtype;
  int64_t numel = 0;
  size_t bytes = 0;
  std::string crc;  // "ok" or the problem
};

// Reads and verifies every tensor of `group` for the report; returns the first problem, if any.
std::optional<std::string> describe_group(const h5::File& f, const std::string& group,
                                          std::vector<TensorRow>& rows) {
  std::optional<std::string> first;
  for (const auto& ds : group_datasets(f, group)) {
    TensorRow r{ds.substr(group.size() + 1), "?", "?", 0, 0, "unreadable"};
    std::optional<std::string> problem;
    try {
      const Tensor t = f.read(ds);
      r.shape = shape_str(t.shape());
      r.dtype = dtype_name(t.dtype());
      r.numel = t.numel();
      r.bytes = t.nbytes();
      problem = crc_problem(f, ds, t);
      r.crc = problem ? "MISMATCH" : "ok";
    } catch (const Error& e) {
      problem = cat("dataset ", ds, ": ", e.what());
    }
    if (problem && !first) first = problem;
    rows.push_back(r);
  }
  return first;
}

void print_table(std::ostream& os, const std::string& title, const std::vector<TensorRow>& rows) {
  os << title << " (" << rows.size() << " tensors):\n";
  if (rows.empty()) return;
  size_t wn = 4, ws = 5, wd = 5;
  for (const auto& r : rows) {
    wn = std::max(wn, r.name.size());
    ws = std::max(ws, r.shape.size());
    wd = std::max(wd, r.dtype.size());
  }
  auto line = [&](const std::string& n, const std::string& s, const std::string& d, const std::string& k,
                  const std::string& c) {
    os << "  " << std::left << std::setw(static_cast<int>(wn)) << n << "  " << std::setw(static_cast<int>(ws))
       << s << "  " << std::setw(static_cast<int>(wd)) << d << "  " << std::right << std::setw(12) << k
       << "  " << c << "\n";
  };
  line("name", "shape", "dtype", "numel", "crc32c");
  for (const auto& r : rows) line(r.name, r.shape, r.dtype, std::to_string(r.numel), r.crc);
}

// Element and byte totals of a table.
std::pair<int64_t, size_t> totals(const std::vector<TensorRow>& rows) {
  std::pair<int64_t, size_t> t{0, 0};
  for (const auto& r : rows) {
    t.first += r.numel;
    t.second += r.bytes;
  }
  return t;
}

void describe_header(std::ostream& os, const h5::File& f) {
  os << "format:           " << (f.has_attr("", "format") ? f.attr_string("", "format") : "(none)") << " v"
     << (f.has_attr("", "format_version") ? std::to_string(f.attr_int("", "format_version")) : "?") << "\n";
  os << "flowrun version:  "
     << (f.has_attr("", "flowrun_version") ? f.attr_string("", "flowrun_version") : "?") << "\n";
  check_header(f);
  CheckpointData d;
  read_header(f, d);
  os << "step:             " << d.step << "\n";
  os << "seed:             " << d.seed << "\n";
  os << "loader position:  epoch " << d.loader_epoch << ", index " << d.loader_index << "\n";
  os << "scalars:         ";
  if (d.scalars.empty()) os << " (none)";
  for (const auto& [k, v] : d.scalars) os << " " << k << "=" << std::setprecision(17) << v;
  os << "\n";
}

void describe_config(std::ostream& os, const std::string& yaml, bool piece) {
  // The layout of the run that saved it (its config's parallel section; tensors are stored whole).
  try {
    const YAML::Node par = YAML::Load(yaml)["parallel"];
    auto get = [&](const char* k, int64_t d) { return par && par[k] ? par[k].as<int64_t>() : d; };
    os << "saved under:      data " << get("data", 1) << " x tensor " << get("tensor", 1) << " x pipeline "
       << get("pipeline", 1) << ", zero " << get("zero", 0)
       << (piece ? " (this file: one rank's pieces; the checkpoint loads under any layout)\n"
                 : " (tensors stored whole: it loads under any layout, each rank cutting its pieces)\n");
  } catch (const YAML::Exception&) {
    os << "saved under:      (the stored config does not parse)\n";
  }
  os << "config:\n";
  std::istringstream in(yaml);
  for (std::string line; std::getline(in, line);) os << "  " << line << "\n";
}

std::vector<int64_t> parse_dims(const std::string& s) {
  std::vector<int64_t> v;
  std::istringstream in(s);
  for (std::string d; std::getline(in, d, ',');)
    if (!d.empty()) v.push_back(std::stoll(d));
  return v;
}

ShardInfo parse_shard_info(const std::string& text, const std::string& where) {
  ShardInfo info;
  std::istringstream in(text);
  for (std::string field; in >> field;) {
    const size_t eq = field.find('=');
    if (eq == std::string::npos) throw CheckpointError(cat(where, ": bad layout field '", field, "'"));
    const std::string k = field.substr(0, eq), v = field.substr(eq + 1);
    if (k == "tensor") info.tensor = v;
    else if (k == "parts") info.parts = std::stoll(v);
    else if (k == "part") info.part = std::stoll(v);
    else if (k == "whole") info.whole = parse_dims(v);
    else if (k == "zero") info.zero = std::stoll(v);
    else if (k == "zpart") info.zpart = std::stoll(v);
    else if (k == "zshape") info.zshape = parse_dims(v);
  }
  return info;
}

// Every rank file of a sharded checkpoint, each tensor put back together: ZeRO shards concatenated (in shard
// order, the padding dropped), then tensor-axis pieces put in place. Any missing piece is an input_error.
CheckpointData load_sharded(const std::string& dir, bool verify) {
  std::vector<std::string> files;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".h5") files.push_back(e.path().string());
  std::sort(files.begin(), files.end());
  if (files.empty()) throw CheckpointError(cat("checkpoint ", dir, ": no rank_<r>.h5 files"));
  CheckpointData whole;
  struct Piece {
    Tensor t;
    ShardInfo info;
    bool param;
  };
  std::map<std::string, std::vector<Piece>> pieces;
  for (size_t i = 0; i < files.size(); ++i) {
    CheckpointData d = load_checkpoint(files[i], verify);
    std::map<std::string, ShardInfo> info;
    std::istringstream lines(d.layout);
    for (std::string line; std::getline(lines, line);) {
      const size_t tab = line.find('\t');
      if (tab != std::string::npos) info[line.substr(0, tab)] = parse_shard_info(line.substr(tab + 1), files[i]);
    }
    for (auto* group : {&d.params, &d.state})
      for (auto& [name, t] : *group) {
        auto it = info.find(name);
        if (it == info.end()) throw CheckpointError(cat("checkpoint ", files[i], ": no layout for '", name, "'"));
        pieces[name].push_back({t, it->second, group == &d.params});
      }
    if (i == 0) {
      d.params.clear();
      d.state.clear();
      d.layout.clear();
      whole = std::move(d);
    }
  }
  for (auto& [name, ps] : pieces) {
    const ShardInfo& first = ps.front().info;
    std::map<int64_t, Tensor> by_part;  // tensor-axis piece by part
    std::map<int64_t, std::map<int64_t, Tensor>> zero;  // part -> zpart -> flat shard
    for (const Piece& p : ps) {
      if (p.info.zero > 0) zero[p.info.part][p.info.zpart] = p.t;
      else by_part.emplace(p.info.part, p.t);
    }
    for (auto& [part, shards] : zero) {
      if (static_cast<int64_t>(shards.size()) != first.zero)
        throw CheckpointError(cat("checkpoint ", dir, ": '", name, "' has ", shards.size(), " of ", first.zero,
                                  " ZeRO shards"));
      Tensor t = Tensor::empty(first.zshape, shards.begin()->second.dtype());
      size_t at = 0;
      for (auto& [z, shard] : shards) {
        const size_t n = std::min(shard.nbytes(), t.nbytes() - at);
        std::memcpy(static_cast<char*>(t.raw()) + at, shard.raw(), n);
        at += n;
      }
      by_part.emplace(part, t);
    }
    if (static_cast<int64_t>(by_part.size()) != first.parts)
      throw CheckpointError(cat("checkpoint ", dir, ": '", name, "' has ", by_part.size(), " of ", first.parts,
                                " tensor-parallel pieces"));
    Tensor t = by_part.begin()->second;
    if (first.parts > 1) {
      const Sbp sbp = parse_sbp(first.tensor, first.whole.size(), name);
      t = Tensor::empty(first.whole, by_part.begin()->second.dtype());
      for (auto& [part, piece] : by_part) put_part(t, piece, sbp, part, first.parts);
    }
    (ps.front().param ? whole.params : whole.state).emplace(name, t);
  }
  return whole;
}

}  // namespace

void replace_file_atomically(const std::string& final_path,
                             const std::function<void(const std::string&)>& write) {
  const std::string tmp = cat(final_path, ".tmp.", ::getpid());
  try {
    write(tmp);
    fsync_path(tmp, false);
    if (::rename(tmp.c_str(), final_path.c_str()) != 0)
      throw_errno(cat("cannot rename ", tmp, " to"), final_path);
  } catch (...) {
    std::error_code rm;
    fs::remove(tmp, rm);  // a failed write leaves nothing behind
    throw;
  }
  const fs::path dir = fs::path(final_path).parent_path();
  fsync_path(dir.empty() ? "." : dir.string(), true);
}

std::string save_checkpoint(const std::string& dir, const CheckpointData& data, int64_t keep) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw runtime_error(cat("cannot create checkpoint directory ", dir, ": ", ec.message()));
  const std::string final_path = (fs::path(dir) / checkpoint_file_name(data.step)).string();
  replace_file_atomically(final_path, [&](const std::string& tmp) { write_checkpoint(tmp, data); });
  spdlog::info("saved checkpoint {} (step {}, {} params, {} state tensors)", final_path, data.step,
               data.params.size(), data.state.size());
  prune(dir, keep);
  return final_path;
}

std::string ShardInfo::str() const {
  auto dims = [](const std::vector<int64_t>& v) {
    std::string s;
    for (size_t i = 0; i < v.size(); ++i) s += cat(i ? "," : "", v[i]);
    return s;
  };
  return cat("tensor=", tensor, " parts=", parts, " part=", part, " whole=", dims(whole), " zero=", zero,
             " zpart=", zpart, " zshape=", dims(zshape));
}

std::string sharded_checkpoint_name(int64_t step) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "step_%08lld.shards", static_cast<long long>(step));
  return buf;
}

void write_shard_file(const std::string& tmp_dir, int rank, const CheckpointData& data) {
  char name[32];
  std::snprintf(name, sizeof name, "rank_%05d.h5", rank);
  const std::string path = (fs::path(tmp_dir) / name).string();
  write_checkpoint(path, data);
  fsync_path(path, false);
}

std::string commit_sharded_checkpoint(const std::string& dir, const std::string& tmp_dir, int64_t step,
                                      int64_t keep) {
  fsync_path(tmp_dir, true);
  const std::string final_path = (fs::path(dir) / sharded_checkpoint_name(step)).string();
  std::error_code ec;
  fs::remove_all(final_path, ec);  // a re-save of the same step (a resumed run stopped again)
  if (::rename(tmp_dir.c_str(), final_path.c_str()) != 0) throw_errno(cat("cannot rename ", tmp_dir, " to"), final_path);
  fsync_path(dir, true);
  spdlog::info("saved sharded checkpoint {} (step {})", final_path, step);
  prune(dir, keep);
  return final_path;
}

CheckpointData load_checkpoint(const std::string& path, bool verify) {
  if (fs::is_directory(path)) return load_sharded(path, verify);
  const h5::File f = open_checkpoint(path);
  return guarded(path, [&] {
    check_header(f);
    CheckpointData d;
    read_header(f, d);
    read_group(f, "params", verify,
               [&](const std::string& n, Tensor t) { d.params.emplace(n, std::move(t)); });
    read_group(f, "state", verify, [&](const std::string& n, Tensor t) { d.state.emplace(n, std::move(t)); });
    return d;
  });
}

std::string find_latest_checkpoint(const std::string& dir) {
  const std::vector<std::string> all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    try {
      if (fs::is_directory(*it)) {
        load_sharded(*it, true);
        return *it;
      }
      // Verifies tensor by tensor without keeping them: the newest file is often as large as the model.
      const h5::File f = open_checkpoint(*it);
      guarded(*it, [&] {
        check_header(f);
        for (const char* g : {"params", "state"}) read_group(f, g, true, [](const std::string&, Tensor) {});
        return 0;
      });
      return *it;
    } catch (const Error& e) {
      spdlog::warn("skipping checkpoint {}: {}", *it, e.what());
    }
  }
  return "";
}

std::vector<std::string> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const bool sharded = name.ends_with(".shards");
    if (const auto step = checkpoint_step(name); step && (sharded ? entry.is_directory(ec) : entry.is_regular_file(ec)))
      found.emplace_back(*step, entry.path().string());
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

std::string describe_checkpoint(const std::string& path) {
  if (fs::is_directory(path)) {
    // A sharded checkpoint: every rank's file, then whether the pieces make whole tensors.
    std::vector<std::string> files;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".h5") files.push_back(e.path().string());
    std::sort(files.begin(), files.end());
    std::string out = cat("sharded checkpoint: ", path, " (", files.size(), " rank files)\n");
    for (const auto& f : files) out += "\n" + describe_checkpoint(f);
    const CheckpointData whole = load_sharded(path, false);
    out += cat("\nassembled: ", whole.params.size(), " parameters and ", whole.state.size(),
               " state tensors, every piece present\n");
    return out;
  }
  std::ostringstream os;
  os << "file:             " << path << "\n";
  std::error_code ec;
  if (const uintmax_t size = fs::file_size(path, ec); !ec)
    os << "size:             " << human_bytes(size) << " (" << size << " bytes)\n";
  try {
    const h5::File f = open_checkpoint(path);
    guarded(path, [&] {
      describe_header(os, f);
      std::vector<TensorRow> params, state;
      auto problem = describe_group(f, "params", params);
      const auto state_problem = describe_group(f, "state", state);
      if (!problem) problem = state_problem;
      print_table(os, "params", params);
      print_table(os, "state", state);
      const auto [pn, pb] = totals(params);
      const auto [sn, sb] = totals(state);
      os << "total:            " << pn << " parameters (" << human_bytes(pb) << "), " << sn
         << " state elements (" << human_bytes(sb) << ")\n";
      describe_config(os, f.attr_string("", "config"), f.has_attr("", "layout"));
      if (problem) throw CheckpointError(cat("checkpoint ", path, ": ", *problem));
      os << "integrity: OK (" << params.size() + state.size() << " datasets verified)\n";
      return 0;
    });
  } catch (const Error&) {
    std::cout << os.str() << "integrity: FAILED\n" << std::flush;
    throw;
  }
  return os.str();
}

bool is_model_state(const std::string& name) {
  return name.rfind("opt/", 0) != 0 && name.rfind("amp/", 0) != 0 && !name.ends_with("/grad_acc");
}

std::string checkpoint_file_name(int64_t step) {
  std::ostringstream os;
  os << "step_" << std::setw(8) << std::setfill('0') << step << ".h5";
  return os.str();
}

std::vector<std::string> compare_checkpoints(const CheckpointData& a, const CheckpointData& b, double rtol,
                                             double* worst) {
  std::vector<std::string> out;
  double max_rel = 0;
  auto compare = [&](const std::map<std::string, Tensor>& x, const std::map<std::string, Tensor>& y,
                     const char* group) {
    for (const auto& [name, t] : x) {
      auto it = y.find(name);
      if (it == y.end()) {
        out.push_back(cat(group, "/", name, ": only in the first checkpoint"));
        continue;
      }
      if (it->second.shape() != t.shape()) {
        out.push_back(cat(group, "/", name, ": shapes ", shape_str(t.shape()), " and ", shape_str(it->second.shape())));
        continue;
      }
      const std::vector<double> u = t.to_f64(), v = it->second.to_f64();
      double scale = 0, diff = 0;
      for (size_t i = 0; i < u.size(); ++i) {
        scale = std::max(scale, std::fabs(u[i]));
        diff = std::max(diff, std::fabs(u[i] - v[i]));
        if (std::isnan(u[i]) != std::isnan(v[i])) diff = std::numeric_limits<double>::infinity();
      }
      const double rel = scale > 0 ? diff / scale : diff;
      max_rel = std::max(max_rel, rel);
      if (rel > rtol) out.push_back(cat(group, "/", name, ": max |a - b| / max |a| = ", rel));
    }
    for (const auto& [name, t] : y)
      if (!x.count(name)) out.push_back(cat(group, "/", name, ": only in the second checkpoint"));
  };
  compare(a.params, b.params, "params");
  compare(a.state, b.state, "state");
  if (worst) *worst = max_rel;
  return out;
}

}  // namespace flowrun
