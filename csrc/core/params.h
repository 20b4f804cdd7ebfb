#pragma once
// Every LOWCOMM_* environment variable, declared once (params.cc: name, kind, default, range,
// one line of doc) and read only through the functions below, in the spirit of NCCL's
// NCCL_PARAM and aws-ofi-nccl's nccl_ofi_param.h. One parser per kind, one error policy: an
// unset or empty variable is "not set"; a set one that does not parse as its kind, or lies
// outside its range, is an error naming the variable and the value, wherever it is read.
// `lowcomm-bench --print-env` prints the table with the values in force; a test holds README's
// environment table to it.
//
// Kinds:
//   kText     any string (a WAN spec, an interface list, a codec spec: parsed by its layer)
//   kChoice   one of `choices` ('|'-separated), matched without regard to case; the canonical
//             spelling is returned
//   kInteger  a decimal integer in [min, max]
//   kBytes    a byte count in [min, max]: digits with an optional K, M, G or T suffix (powers
//             of 1024), e.g. 4M; "KiB"-style and "B" endings are accepted too
//   kNumber   a decimal number in [min, max]

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "lowcomm/status.h"

namespace lowcomm::params {

enum class Kind { kText, kChoice, kInteger, kBytes, kNumber };

struct Param {
  const char* name;
  Kind kind;
  const char* fallback;  // the default, in words, as printed ("" when none)
  double min;            // kInteger, kBytes, kNumber
  double max;
  const char* choices;  // kChoice
  const char* doc;      // one line
};

// The table, in README's order.
const std::vector<Param>& table();
// The entry for `name`; a name missing from the table is a programming error (aborts with
// its name: every read is of a declared variable).
const Param& find(std::string_view name);

// The value as set; nullopt when unset or empty. For kText variables (the others have typed
// readers).
std::optional<std::string> text(std::string_view name);
Result<std::optional<std::string>> choice(std::string_view name);
Result<std::optional<int64_t>> integer(std::string_view name);
Result<std::optional<uint64_t>> bytes(std::string_view name);
Result<std::optional<double>> number(std::string_view name);

// Every declared variable that is set, parsed by its kind: the first that fails, named.
Status check_all();
// The table with the values in force, a line per variable (for --print-env).
std::string describe();

// The byte-count grammar of kBytes (digits, optional K/M/G/T, optional "iB"/"B"), for options
// and command lines that take sizes the same way. Refuses negative numbers and overflow.
Result<uint64_t> parse_bytes(std::string_view text);

}  // namespace lowcomm::params
