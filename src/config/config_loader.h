// Strict YAML loading, command-line overrides, validation and the resolved-config dump.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"

namespace mt {

// Loads FILE, applies overrides ("section.key=value", value parsed as YAML), validates.
// Throws mt::Error with a one-line message naming the file, the key and the fix.
Config load_config(const std::string& path, const std::vector<std::string>& overrides = {});
// Same from YAML text (tests); `origin` names it in errors.
Config load_config_from_string(const std::string& yaml, const std::string& origin,
                               const std::vector<std::string>& overrides = {});
// A checkpoint's stored config (its manifest's config_yaml): as load_config_from_string, except that keys acting
// only with a setting the run did not have (accepted by older versions: they acted on nothing) are reset to their
// defaults instead of refused (config/config_dependent_keys.h), so every checkpoint still converts and generates.
Config load_stored_config(const std::string& yaml, const std::string& origin);

// Derived values for a world size; throws mt::Error naming the numbers to change when the layout
// or the batch arithmetic does not fit.
DerivedConfig derive_config(const Config& cfg, int world_size);
// The world size `megatrain config` checks when none is given: 1 when the config fits one rank, else the smallest
// multiple of parallel.tensor x pipeline x context (up to 1024 of them) that derive_config accepts, else 1 (whose
// error names the world sizes that fit). Plan-only layouts (configs/plan/) fit only many ranks.
int smallest_world_size(const Config& cfg);

// The fully resolved config (every key, defaults filled in) as YAML text, loadable again.
std::string config_to_yaml(const Config& cfg);

// Markdown table of every key: path, type, default, meaning (for README / `megatrain config --help`).
std::string config_reference_markdown();

}  // namespace mt
