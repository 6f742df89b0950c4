// The config schema: ONE table, one row per YAML key, the single source of truth for loading,
// validation, config_to_yaml and config_reference_markdown (config_loader.cpp, config_validate.cpp).
//
// A row's key path is spelled from the Config member itself (MT_CONFIG_KEY in config_schema.cpp),
// so a key and its field cannot drift apart; the value type is deduced from the member's type; the
// default is read from a default-constructed Config (the initializers in config.h), so defaults are
// written once. A test checks that every field of every section struct has exactly one row.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "config/config.h"
#include "core/edit_distance.h"

namespace mt {

using WeightedPaths = std::vector<std::pair<double, std::string>>;

enum class FieldType { Int, Int64, UInt64, Double, Bool, String, Enum, DoubleList, WeightedPaths };

// Where a row's value lives inside a Config.
using FieldPtr = std::variant<int*, int64_t*, uint64_t*, double*, bool*, std::string*, std::vector<double>*,
                              WeightedPaths*>;

// Allowed numeric range (for a list: of each element). Default: unbounded.
struct Range {
  double lo = -std::numeric_limits<double>::infinity();
  double hi = std::numeric_limits<double>::infinity();
  bool lo_open = false;  // true: lo itself not allowed
  bool hi_open = false;
  bool contains(double v) const;
  bool unbounded() const;
  std::string describe() const;  // ">= 1", "> 0", "in [0, 1)", "" when unbounded
};

struct ConfigField {
  std::string section;                // "model"
  std::string key;                    // "hidden_size"
  std::string path;                   // "model.hidden_size"
  FieldType type = FieldType::Int;
  bool required = false;              // must be given (its default is not a usable value)
  std::string default_text;           // the default as YAML text ("required" when required)
  Range range;
  std::vector<std::string> allowed;   // Enum: the allowed values
  std::size_t list_size = 0;          // DoubleList: exact length (0 = any)
  std::string doc;                    // one line
  std::vector<std::string> aliases;   // Megatron-LM argument names meaning this key (suggestions, docs)
  // The value; for an optional field (a std::optional member: unset = a preset fills it) an unset value is
  // engaged (default-constructed) first, so read through at() only when is_set().
  FieldPtr (*get)(Config&) = nullptr;
  bool optional = false;
  bool (*has_value)(const Config&) = nullptr;  // optional fields only
  void (*reset)(Config&) = nullptr;            // optional fields only
  bool is_set(const Config& c) const { return !optional || has_value(c); }

  FieldPtr at(Config& c) const { return get(c); }
  // Read-only access (the pointer is only read through).
  FieldPtr at(const Config& c) const { return get(const_cast<Config&>(c)); }
};

// All rows, sections in dump order (model, parallel, training, optimizer, data, checkpoint, logging).
const std::vector<ConfigField>& config_fields();
// Section names in dump order.
const std::vector<std::string>& config_sections();
// The row for "section.key", or nullptr.
const ConfigField* find_config_field(const std::string& path);

// "an integer", "a number", "true or false", ... (for "expected X, got Y" messages).
std::string field_type_expectation(const ConfigField& f);
// "int", "double", "one of: a, b", ... (for the reference table).
std::string field_type_name(const ConfigField& f);

// The field's value in cfg as YAML text (loadable again): 3, 0.0003, true, llama, "a b", [98.0, 1.0, 1.0];
// null for an unset optional field.
std::string format_field(const ConfigField& f, const Config& cfg);
// Field-by-field equality driven by the schema (source_file is not compared).
bool config_fields_equal(const Config& a, const Config& b);
bool field_equal(const ConfigField& f, const Config& a, const Config& b);

// Shortest decimal text that reads back to exactly v (tries %.15g, %.16g, %.17g); integral values
// get ".0" so they read as floats (65536.0, 1.0e-05 stays 1e-05).
std::string format_double(double v);
// A string as a YAML scalar: plain when that reads back unchanged, else double-quoted and escaped.
std::string yaml_quote(const std::string& s);

// Checks every field's value against its row (range, allowed enum values, list size); throws
// mt::Error "config <origin>: <key> = <value>: must be ...". Used after loading and by derive_config.
void check_field_value(const ConfigField& f, const Config& cfg, const std::string& origin, int line = -1);


// Checks that do not depend on the world size (cross-field rules and every field's range); throws
// mt::Error naming the file (cfg.source_file), the keys and the fix. Called by the loader and by
// derive_config.
void validate_config(const Config& cfg);

// "config <origin>: " prefix text for error messages (origin "" -> "<in-memory config>").
std::string config_error_prefix(const std::string& origin);

}  // namespace mt
