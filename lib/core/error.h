// Errors: one exception type carrying the process exit code (2 = bad input, 1 = runtime failure); 3 is a
// clean stop on request (signal or wall-time budget) after a checkpoint, for batch scripts to requeue.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace flowrun {

enum class ExitCode : int { ok = 0, runtime = 1, bad_input = 2, stopped = 3 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& msg) : std::runtime_error(msg), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// Bad input from a user: config, data, checkpoint, command line.
inline Error input_error(const std::string& msg) { return Error(ExitCode::bad_input, msg); }
// A failure of flowrun itself or of the machine.
inline Error runtime_error(const std::string& msg) { return Error(ExitCode::runtime, msg); }

template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

// `parts` with `sep` between them (names listed in messages).
inline std::string join(const std::vector<std::string>& parts, const std::string& sep = ", ") {
  std::string out;
  for (const auto& p : parts) out += (out.empty() ? "" : sep) + p;
  return out;
}

}  // namespace flowrun

// Internal invariant: a violation is a bug in flowrun (or a misuse of its C++ API), not bad user input.
#define FR_CHECK(cond, ...)                                                                         \
  do {                                                                                              \
    if (!(cond))                                                                                    \
      throw ::flowrun::runtime_error(::flowrun::cat(__FILE__, ":", __LINE__, ": check failed: " #cond \
                                                    ": ", __VA_ARGS__));                           \
  } while (0)
