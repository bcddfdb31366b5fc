// flowrun: the command-line front end. Parses arguments and calls the library; exit codes 0 ok,
// 1 runtime failure, 2 bad input.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>

#include "core/error.h"
#include "ops/listing.h"

int main(int argc, char** argv) {
  CLI::App app{"flowrun: train deep-learning models from a YAML config on CPUs and GPUs"};
  app.require_subcommand(1);

  auto* version = app.add_subcommand("version", "Print the flowrun version");
  auto* ops = app.add_subcommand("ops", "List every registered op with the devices and dtypes its kernels cover");
  std::string filter;
  ops->add_option("filter", filter, "Only ops whose name contains this text");

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  try {
    if (*version) std::cout << "flowrun " << FLOWRUN_VERSION << "\n";
    if (*ops) std::cout << flowrun::list_ops(filter);
  } catch (const flowrun::Error& e) {
    std::cerr << "flowrun: " << e.what() << "\n";
    return static_cast<int>(e.code());
  } catch (const std::exception& e) {
    std::cerr << "flowrun: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
