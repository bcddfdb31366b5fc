// The message of the input error a config text throws, shared by the config test files.
#pragma once

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "config/config.h"
#include "core/error.h"

namespace flowrun::testing {

// The message of the input_error that loading `text` (as "cfg.yaml", with `sets` as --set) throws; a test
// failure when it is accepted or fails otherwise.
inline std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    load_config_text(text, "cfg.yaml", sets);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ExitCode::bad_input) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "accepted:\n" << text;
  return "";
}

}  // namespace flowrun::testing
