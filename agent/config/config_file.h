// --config=FILE: a YAML mapping whose keys are the agent's flag names (SPEC section 5), applied to
// the Abseil flag registry before the command line, so that flags given on the command line win.
//
//   sampling-frequency: 99          # dashes or underscores, as on the command line
//   profiles: [cpu, off_cpu]        # a sequence is a comma-separated list
//   remote-header: ["X-A=1", "X-B=2"]
//   pid-label: true
//
// yaml-cpp (0.7, Debian's libyaml-cpp-dev) parses the file; each value goes through the flag's
// own parser (absl::CommandLineFlag::ParseFrom), as a command-line value would.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace parascope {

// The value of --config (or --config VALUE) in argv, if given; the last one wins. Only looks:
// ParseFlags parses it again with the others.
std::optional<std::string> FindConfigFlag(int argc, char** argv);

// Sets every flag the YAML file at `path` names. Errors are InvalidArgument and name the file
// and the key: "/etc/parascope.yaml: sampling-frequency: Illegal value 'fast' ...", for a key
// that is no flag, a value that is not a scalar or a sequence of scalars, a value the flag's
// parser refuses, a key given twice, the key `config` itself, a file that is not YAML (with its
// line and column) or holds several documents. A missing, unreadable or non-regular file is
// InvalidArgument too: it was asked for. A sequence is accepted for list flags only (repeatable
// ones, --pid, --profiles: joined with commas; --debuginfod-urls: with spaces).
// Only flags defined in files whose path contains `flags_file` count (the agent's: "agent/main.cc";
// not Abseil's own, such as --flagfile). `*keys` (if not null) receives the flags set, underscored.
// `*origins` (if not null) maps each of them to "FILE:LINE", for errors found later (range
// checks) to name where the value came from.
absl::Status ApplyConfigFile(const std::string& path, const std::string& flags_file,
                             std::vector<std::string>* keys,
                             std::map<std::string, std::string>* origins = nullptr);

}  // namespace parascope
