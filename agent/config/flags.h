// Command-line parsing over the Abseil flag registry, with SPEC section 5's spelling.
//
// SPEC fixes dashed names (`--sampling-frequency`) while ABSL_FLAG names are C identifiers, and
// Debian's Abseil 20220623 absl::ParseCommandLine exits 1 on a bad value where SPEC wants 2. So
// this walks argv itself, maps dashes in a flag name to underscores, and hands each value to the
// registered flag's own parser (absl::CommandLineFlag::ParseFrom): types, defaults and help text
// stay Abseil's.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"

namespace parascope {

// Parses `--name=value`, `--name value`, `--bool_flag`, `--nobool_flag` (dashes or underscores in
// names). A std::vector<std::string> flag given several times accumulates its values (Abseil
// parses a comma-separated list, so an item cannot itself contain a comma). Stops at `--`: the
// arguments after it go to *command when given (command mode, `parascope -- CMD ARGS...`), else
// to *positional; other arguments go to *positional. `--help` sets *help. Errors are
// InvalidArgument naming the flag as the user spelled it, e.g.
// "--sampling-frequency: Illegal value 'abc' specified for flag 'sampling_frequency'".
absl::Status ParseFlags(int argc, char** argv, std::vector<std::string>* positional, bool* help,
                        std::vector<std::string>* command = nullptr);

// Help text listing every flag registered in files matching `file_substring`, dashed names.
std::string FlagsHelp(const std::string& program, const std::string& file_substring);

}  // namespace parascope
