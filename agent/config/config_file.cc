#include "agent/config/config_file.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"

namespace parascope {

std::optional<std::string> FindConfigFlag(int argc, char** argv) {
  std::optional<std::string> path;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (arg == "--config" || arg == "-config") {
      if (i + 1 < argc) path = argv[++i];
    } else if (absl::StartsWith(arg, "--config=") || absl::StartsWith(arg, "-config=")) {
      path = std::string(arg.substr(arg.find('=') + 1));
    }
  }
  return path;
}

absl::Status ApplyConfigFile(const std::string& path, const std::string& flags_file,
                             std::vector<std::string>* keys) {
  // Read first: yaml-cpp's LoadFile reports an unreadable file without saying why.
  std::ifstream in(path);
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the config file: ", std::strerror(errno)));
  }
  std::stringstream text;
  text << in.rdbuf();
  YAML::Node root;
  try {
    root = YAML::Load(text.str());
  } catch (const YAML::Exception& e) {
    // mark.line and mark.column count from 0.
    return absl::InvalidArgumentError(absl::StrCat(path, ":", e.mark.line + 1, ":",
                                                   e.mark.column + 1, ": not YAML: ", e.msg));
  }
  if (root.IsNull()) return absl::OkStatus();  // an empty file sets nothing
  if (!root.IsMap()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected a mapping of flag names to values at the top level"));
  }
  std::set<std::string> seen;
  for (const auto& kv : root) {
    const int line = kv.first.Mark().line + 1;
    if (!kv.first.IsScalar()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", line, ": a key must be a name"));
    }
    const std::string spelled = kv.first.Scalar();
    const std::string where = absl::StrCat(path, ":", line, ": ", spelled);
    const std::string name = absl::StrReplaceAll(spelled, {{"-", "_"}});
    if (name == "config") {
      return absl::InvalidArgumentError(absl::StrCat(where, ": not allowed in a config file"));
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr || !absl::StrContains(flag->Filename(), flags_file)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": unknown key (not a flag name)"));
    }
    if (!seen.insert(name).second) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": given twice"));
    }
    const YAML::Node& v = kv.second;
    std::string value;
    if (v.IsScalar()) {
      value = v.Scalar();
    } else if (v.IsSequence() && (flag->IsOfType<std::vector<std::string>>() ||
                                  flag->IsOfType<std::string>())) {
      // A list: what the command line spells comma-separated (--profiles, --pid, --debug-dirs).
      std::vector<std::string> items;
      for (const YAML::Node& item : v) {
        if (!item.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a list item must be a plain value"));
        }
        if (absl::StrContains(item.Scalar(), ",")) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a list item cannot contain a comma"));
        }
        items.push_back(item.Scalar());
      }
      value = absl::StrJoin(items, ",");
    } else if (v.IsNull()) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": no value"));
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat(where, ": expected a ", v.IsSequence() ? "single value" : "value",
                       v.IsMap() ? ", not a mapping" : ""));
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(where, ": ", error));
    }
    if (keys != nullptr) keys->push_back(name);
  }
  return absl::OkStatus();
}

}  // namespace parascope
