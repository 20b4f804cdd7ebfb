#pragma once
// The LOWCOMM_* environment variables as the library reads them (README, "Environment"), for
// bindings and tools that take the same variables: one declaration and one parser per variable.

#include <optional>
#include <string>
#include <string_view>

#include "lowcomm/export.h"
#include "lowcomm/status.h"

namespace lowcomm {

// The value of `name`: nullopt when unset or empty; a byte count as its number of bytes in
// decimal ("4M" -> "4194304"); a choice as declared ("EQUAL" -> "equal"); anything else as set.
// A value that does not parse, or a name that is not a LOWCOMM_* variable, is kInvalidArgument
// naming it.
LOWCOMM_API Result<std::optional<std::string>> env_value(std::string_view name);
// Every variable with the value in force, a line each (what lowcomm-bench --print-env prints).
LOWCOMM_API std::string env_describe();

}  // namespace lowcomm
