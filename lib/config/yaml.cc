// Reading YAML safely: files bounded in size, one document, YAML's core tags only, and aliases bounded in
// what they expand to (yaml-cpp shares an aliased node, but everything that walks the tree copies it).
#include <sys/stat.h>
#include <yaml-cpp/eventhandler.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "config/config.h"
#include "core/error.h"

namespace flowrun {
namespace {

bool core_tag(const std::string& tag) {
  // "?" and "!" are yaml-cpp's non-specific tags of plain and quoted nodes.
  static const std::set<std::string> tags = {"?",
                                             "!",
                                             "tag:yaml.org,2002:str",
                                             "tag:yaml.org,2002:int",
                                             "tag:yaml.org,2002:float",
                                             "tag:yaml.org,2002:bool",
                                             "tag:yaml.org,2002:null",
                                             "tag:yaml.org,2002:seq",
                                             "tag:yaml.org,2002:map"};
  return tags.count(tag) > 0;
}

// The tag as written: "!!python/object" rather than yaml-cpp's expanded "tag:yaml.org,2002:python/object".
std::string written_tag(const std::string& tag) {
  const std::string prefix = "tag:yaml.org,2002:";
  return tag.rfind(prefix, 0) == 0 ? "!!" + tag.substr(prefix.size()) : tag;
}

// Checks the parser's events: counts documents, vets tags, and sums the nodes each anchor expands to, so
// that an alias costs what the tree walkers will pay for it, without building or walking any tree.
class Vetter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1)
      throw YamlRefused(mark, "a second YAML document ('---'): a file holds one document");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = sizes_.find(anchor);
    if (it == sizes_.end()) throw YamlRefused(mark, "an alias inside the node it refers to (a cycle)");
    add(mark, it->second);
  }
  void OnScalar(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                const std::string&) override {
    check_tag(mark, tag);
    leaf(mark, anchor);
  }
  void OnSequenceStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                       YAML::EmitterStyle::value) override {
    open(mark, tag, anchor);
  }
  void OnSequenceEnd() override { close(); }
  void OnMapStart(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor,
                  YAML::EmitterStyle::value) override {
    open(mark, tag, anchor);
  }
  void OnMapEnd() override { close(); }

 private:
  struct Open {
    YAML::anchor_t anchor;
    size_t nodes;  // inside it, so far (itself not included)
  };

  static void check_tag(const YAML::Mark& mark, const std::string& tag) {
    if (!core_tag(tag))
      throw YamlRefused(mark, cat("unknown tag '", abbreviate(written_tag(tag)),
                                  "' (only YAML's core tags are read: !!str, !!int, !!float, !!bool, "
                                  "!!null, !!seq, !!map)"));
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) sizes_[anchor] = 1;
    add(mark, 1);
  }
  void open(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor) {
    check_tag(mark, tag);
    add(mark, 1);
    stack_.push_back({anchor, 0});
  }
  void close() {
    const Open done = stack_.back();
    stack_.pop_back();
    if (done.anchor != YAML::NullAnchor) sizes_[done.anchor] = done.nodes + 1;
    // The document total already holds these nodes; the enclosing node gets them now.
    if (!stack_.empty()) stack_.back().nodes += done.nodes;
  }
  // `n` more nodes in the innermost open node and in the document (each at most kMaxYamlNodes, so no
  // overflow).
  void add(const YAML::Mark& mark, size_t n) {
    total_ += n;
    if (total_ > kMaxYamlNodes)
      throw YamlRefused(mark, cat("the YAML expands to more than ", kMaxYamlNodes,
                                  " nodes (each alias counts as a copy of its anchor)"));
    if (!stack_.empty()) stack_.back().nodes += n;
  }

  int documents_ = 0;
  size_t total_ = 0;
  std::vector<Open> stack_;
  std::map<YAML::anchor_t, size_t> sizes_;  // completed anchors -> the nodes they expand to
};

}  // namespace

YAML::Node load_yaml(const std::string& text) {
  std::istringstream in(text);
  YAML::Parser parser(in);
  Vetter vetter;
  while (parser.HandleNextDocument(vetter)) {
  }
  return YAML::Load(text);
}

std::string read_yaml_file(const std::string& path, const std::string& what) {
  const std::string cannot = cat(path, ": cannot read the ", what, " file: ");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) throw input_error(cannot + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) throw input_error(cannot + "it is a directory");
  if (!S_ISREG(st.st_mode))
    throw input_error(cannot + "not a regular file (a device, pipe or socket); give a YAML file");
  const auto too_big = [&] {
    return input_error(cat(cannot, "larger than ", kMaxYamlBytes >> 20, " MiB (", kMaxYamlBytes,
                           " bytes), the limit for a ", what, " file"));
  };
  if (static_cast<uint64_t>(st.st_size) > kMaxYamlBytes) throw too_big();
  std::ifstream f(path, std::ios::binary);
  if (!f) throw input_error(cannot + std::strerror(errno));
  // Read at most one byte past the limit: the file may have grown since stat.
  std::string text(kMaxYamlBytes + 1, '\0');
  f.read(text.data(), static_cast<std::streamsize>(text.size()));
  if (f.bad()) throw input_error(cannot + std::strerror(errno));
  text.resize(static_cast<size_t>(f.gcount()));
  if (text.size() > kMaxYamlBytes) throw too_big();
  return text;
}

std::string abbreviate(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  return cat(text.substr(0, max - 3), "...");
}

}  // namespace flowrun
