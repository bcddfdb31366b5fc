// Terminal detection for colours and the live progress line.
#include "core/terminal.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace flowrun {

bool interactive_terminal(int fd) {
  if (isatty(fd) == 0) return false;
  const char* no_color = std::getenv("NO_COLOR");  // no-color.org: set and not empty
  if (no_color != nullptr && *no_color != '\0') return false;
  const char* term = std::getenv("TERM");
  if (term == nullptr || std::strcmp(term, "dumb") == 0) return false;
  return std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr && std::getenv("PMIX_RANK") == nullptr;
}

}  // namespace flowrun
