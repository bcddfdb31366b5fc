// The config schema (internal to lib/config): every section and key with its type, constraint, default,
// documentation and the RunConfig field it is stored into. schema.cc holds the one table; loading,
// validation, defaults, the resolved YAML and the markdown reference are all driven by it.
#pragma once

#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "config/config.h"

namespace flowrun::config {

// The C++ value of one key, after validation.
using Value = std::variant<int64_t, uint64_t, double, bool, std::string, std::vector<double>,
                           std::vector<int64_t>, YAML::Node>;

enum class Type {
  integer,       // int64
  count,         // uint64 (seeds)
  number,        // double
  boolean,       // true | false
  string,        // any scalar, kept as written
  choice,        // one of Key::choices
  number_list,   // [double, ...]
  integer_list,  // [int64, ...]
  loss_scale,    // a positive number or the word "dynamic", kept as text
  layer_list,    // a non-empty sequence of layer maps, kept as YAML for the model loader
  param_map,     // a map of model parameters, kept as YAML for the model loader
};

// Bounds on a number (or on every element of a list).
struct Bounds {
  enum Kind { any, positive, non_negative, half_open, closed } kind = any;
  double lo = 0, hi = 0;  // half_open: [lo, hi); closed: [lo, hi]
  bool holds(double x) const;
};

// How a key's value moves between RunConfig and Value.
struct Binding {
  std::function<void(RunConfig&, const Value&)> store;
  std::function<Value(const RunConfig&)> load;
};

struct Key {
  std::string name;
  Type type;
  std::string default_yaml;  // the default as YAML text (validated like a user value)
  Bounds bounds;
  std::vector<std::string> choices;  // Type::choice
  std::string doc;
  Binding bind;

  // What a value is, "positive integer", "one of sgd, adam, adamw", ... (the reference's type column)
  std::string type_text() const;
  // The same as an error message puts it after "expected": "a positive integer", "true or false".
  std::string expected() const;
};

struct Section {
  std::string name;
  std::string doc;
  std::vector<Key> keys;
};

// The schema, sections in order: model, data, train, optimizer, schedule, precision, parallel.
const std::vector<Section>& schema();
const Section* find_section(const std::string& name);
const Key* find_key(const Section& section, const std::string& name);

// Where `node` is: its mark in base's file, or base itself for a `--set` value (marks there are useless).
Origin origin_at(const Origin& base, const YAML::Node& node);
// Validates `node` (from `origin`, for key `path`) against `key` and converts it; throws input_error
// "ORIGIN: PATH: expected ..., got ...".
Value convert(const Key& key, const YAML::Node& node, const Origin& origin, const std::string& path);
// A value as a YAML node for the resolved config (numbers in their shortest exact form).
YAML::Node to_yaml(const Value& value);

// "(did you mean 'lr'?)" for the closest of `candidates` to `word`, or "" when none is close.
std::string did_you_mean(const std::string& word, const std::vector<std::string>& candidates);
// How a node reads in a message: "fast" (quoted), a list, a map, nothing.
std::string describe(const YAML::Node& node);

}  // namespace flowrun::config
