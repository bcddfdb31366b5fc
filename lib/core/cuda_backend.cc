// Opening libflowrun_cuda.so (see core/cuda_backend.h).
#include "core/cuda_backend.h"

#include <dlfcn.h>

#include <cstdlib>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace flowrun::cuda {

namespace {

struct Opened {
  const Backend* backend = nullptr;
  std::string why;
};

#ifdef FLOWRUN_CUDA_BACKEND_DIR
constexpr const char* kLibrary = "libflowrun_cuda.so";

// The folder of the library holding this code (libflowrun_core.so), where an installed or packed flowrun
// keeps the backend beside it.
std::string own_folder() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&load_backend), &info) == 0 || !info.dli_fname) return "";
  return std::filesystem::path(info.dli_fname).parent_path().string();
}
#endif

Opened open_backend() {
#ifndef FLOWRUN_CUDA_BACKEND_DIR
  return {
      nullptr,
      "this build of flowrun has no CUDA backend (configure with -DFLOWRUN_CUDA=ON where the CUDA toolkit "
      "is installed)"};
#else
  std::vector<std::string> candidates;
  if (const char* path = std::getenv("FLOWRUN_CUDA_BACKEND"); path && *path)
    candidates = {path};
  else
    candidates = {own_folder() + "/" + kLibrary, std::string(FLOWRUN_CUDA_BACKEND_DIR) + "/" + kLibrary};
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path)) continue;
    // RTLD_NOW: a CUDA library that is missing or too old fails here, with the loader's message, rather than
    // at the first call into it.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) return {nullptr, cat("opening ", path, ": ", dlerror())};
    auto entry = reinterpret_cast<const Backend* (*)()>(dlsym(handle, "flowrun_cuda_backend"));
    if (!entry) return {nullptr, cat(path, " is not flowrun's CUDA backend (no flowrun_cuda_backend)")};
    return {entry(), ""};
  }
  return {nullptr, cat(kLibrary, " was not found (looked for ", join(candidates, ", "),
                       "; the environment variable FLOWRUN_CUDA_BACKEND names it)")};
#endif
}

}  // namespace

const Backend* load_backend(std::string* why) {
  static const Opened opened = open_backend();  // once, whichever thread asks first
  if (!opened.backend && why) *why = opened.why;
  return opened.backend;
}

const Backend& backend() {
  std::string why;
  const Backend* b = load_backend(&why);
  if (!b) throw input_error(cat("the CUDA backend is not available: ", why));
  return *b;
}

}  // namespace flowrun::cuda
