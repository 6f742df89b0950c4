// Levenshtein distance (insert, delete, substitute: 1 each), for "did you mean" suggestions: unknown config
// keys, checkpoint tensor names, misspelled subcommands.
#pragma once

#include <cstddef>
#include <string_view>

namespace mt {

std::size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace mt
