#include "agent/config/config_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
                             std::vector<std::string>* keys,
                             std::map<std::string, std::string>* origins) {
  // Read first: yaml-cpp's LoadFile reports an unreadable file without saying why.
  if (path.empty()) return absl::InvalidArgumentError("--config: empty file name");
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": cannot read the config file: ", std::strerror(errno)));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  std::string text;
  char buf[65536];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      close(fd);
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": cannot read the config file: ", std::strerror(err)));
    }
    text.append(buf, n);
    if (text.size() > (size_t{1} << 20)) {
      close(fd);
      return absl::InvalidArgumentError(absl::StrCat(path, ": larger than 1 MiB"));
    }
  }
  close(fd);
  YAML::Node root;
  try {
    std::vector<YAML::Node> docs = YAML::LoadAll(text);
    if (docs.size() > 1) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": holds ", docs.size(), " YAML documents; expected one"));
    }
    if (!docs.empty()) root = docs[0];
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
  // String flags whose value is a comma-separated list (agent/main.cc).
  static const std::set<std::string> kCommaLists = {"pid", "profiles"};
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
                                  kCommaLists.contains(name) || name == "debuginfod_urls")) {
      // A list: what the command line spells comma-separated (space-separated for the URLs).
      std::vector<std::string> items;
      for (const YAML::Node& item : v) {
        if (!item.IsScalar()) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a list item must be a plain value"));
        }
        if (absl::StrContains(item.Scalar(), ",") || absl::StrContains(item.Scalar(), " ")) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": a list item cannot contain a comma or a space"));
        }
        items.push_back(item.Scalar());
      }
      value = absl::StrJoin(items, name == "debuginfod_urls" ? " " : ",");
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
    if (origins != nullptr) (*origins)[name] = absl::StrCat(path, ":", line);
  }
  return absl::OkStatus();
}

}  // namespace parascope
