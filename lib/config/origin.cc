// Origins of config values, for "file:line:col: key: message" errors.
#include "config/config.h"

#include "core/error.h"

namespace flowrun {

std::string Origin::str() const {
  if (!set.empty()) {
    // Key and value cut each on their own, so that a long value does not hide the key.
    const size_t eq = set.find('=');
    return eq == std::string::npos
               ? cat("--set ", abbreviate(set))
               : cat("--set ", abbreviate(set.substr(0, eq)), "=", abbreviate(set.substr(eq + 1)));
  }
  if (line > 0) return cat(file, ":", line, ":", column);
  return file;
}

std::string RunConfig::where(const std::string& key_path) const {
  auto it = origins.find(key_path);
  // A key that was defaulted has no origin of its own: name the file and the key.
  const std::string at = it != origins.end() ? it->second.str() : file;
  return cat(at, ": ", key_path, ": ");
}

}  // namespace flowrun
