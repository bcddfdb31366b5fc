// Reading YAML safely: files bounded in size, one document, YAML's core tags only, and aliases bounded in
// what they expand to (yaml-cpp shares an aliased node, but everything that walks the tree copies it).
#include <sys/stat.h>
#include <yaml-cpp/eventhandler.h>

#include <algorithm>
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

// Levels of nesting, each alias expanded: real configs nest some 15, and every tree walk (the reader, the
// model loader, yaml-cpp's copy and emitter) recurses once per level.
constexpr size_t kMaxYamlDepth = 100;

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

// Checks the parser's events: counts documents, vets tags, and sums the nodes (and the nesting) each anchor
// expands to, so that an alias costs what the tree walkers (recursive, and copying) will pay for it,
// without building or walking any tree.
class Vetter : public YAML::EventHandler {
 public:
  void OnDocumentStart(const YAML::Mark& mark) override {
    if (++documents_ > 1)
      throw YamlRefused(mark, "a second YAML document ('---'): a file holds one document");
  }
  void OnDocumentEnd() override {}
  void OnNull(const YAML::Mark& mark, YAML::anchor_t anchor) override { leaf(mark, anchor); }
  void OnAlias(const YAML::Mark& mark, YAML::anchor_t anchor) override {
    auto it = anchors_.find(anchor);
    if (it == anchors_.end()) throw YamlRefused(mark, "an alias inside the node it refers to (a cycle)");
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
  // What a node expands to: its nodes, and its levels of nesting (1 for a scalar).
  struct Size {
    size_t nodes = 0, levels = 0;
  };
  struct Open {
    YAML::anchor_t anchor;
    Size inside;  // so far: nodes inside it, and levels below it
  };

  static void check_tag(const YAML::Mark& mark, const std::string& tag) {
    if (!core_tag(tag))
      throw YamlRefused(mark, cat("unknown tag '", abbreviate(written_tag(tag)),
                                  "' (only YAML's core tags are read: !!str, !!int, !!float, !!bool, "
                                  "!!null, !!seq, !!map)"));
  }
  void leaf(const YAML::Mark& mark, YAML::anchor_t anchor) {
    if (anchor != YAML::NullAnchor) anchors_[anchor] = {1, 1};
    add(mark, {1, 1});
  }
  void open(const YAML::Mark& mark, const std::string& tag, YAML::anchor_t anchor) {
    check_tag(mark, tag);
    add(mark, {1, 1});
    stack_.push_back({anchor, {}});
  }
  void close() {
    const Open done = stack_.back();
    stack_.pop_back();
    const Size whole{done.inside.nodes + 1, done.inside.levels + 1};
    if (done.anchor != YAML::NullAnchor) anchors_[done.anchor] = whole;
    // The document total already holds its nodes (and `open` counted the node itself).
    if (!stack_.empty()) {
      stack_.back().inside.nodes += done.inside.nodes;
      stack_.back().inside.levels = std::max(stack_.back().inside.levels, whole.levels);
    }
  }
  // A node of size `n` in the innermost open node (each count at most its limit, so no overflow).
  void add(const YAML::Mark& mark, const Size& n) {
    total_ += n.nodes;
    if (total_ > kMaxYamlNodes)
      throw YamlRefused(mark, cat("the YAML expands to more than ", kMaxYamlNodes,
                                  " nodes (each alias counts as a copy of its anchor)"));
    if (stack_.size() + n.levels > kMaxYamlDepth)
      throw YamlRefused(mark, cat("the YAML nests deeper than ", kMaxYamlDepth,
                                  " levels (each alias counts as a copy of its anchor)"));
    if (stack_.empty()) return;
    stack_.back().inside.nodes += n.nodes;
    stack_.back().inside.levels = std::max(stack_.back().inside.levels, n.levels);
  }

  int documents_ = 0;
  size_t total_ = 0;
  std::vector<Open> stack_;
  std::map<YAML::anchor_t, Size> anchors_;  // completed anchors -> what they expand to
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

bool written_as_string(const YAML::Node& node) {
  // "!" is yaml-cpp's non-specific tag of a quoted scalar.
  return node.Tag() == "!" || node.Tag() == "tag:yaml.org,2002:str";
}

std::string abbreviate(const std::string& text, size_t max) {
  if (text.size() <= max) return text;
  return cat(text.substr(0, max - 3), "...");
}

}  // namespace flowrun
