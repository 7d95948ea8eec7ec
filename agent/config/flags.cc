#include "agent/config/flags.h"

#include <algorithm>
#include <optional>
#include <set>

#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"

namespace parascope {
namespace {

std::string Dashed(absl::string_view name) { return absl::StrReplaceAll(name, {{"_", "-"}}); }
std::string Underscored(absl::string_view name) { return absl::StrReplaceAll(name, {{"-", "_"}}); }

}  // namespace

absl::Status ParseFlags(int argc, char** argv, std::vector<std::string>* positional, bool* help,
                        std::vector<std::string>* command) {
  *help = false;
  std::set<std::string> seen_lists;
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") {
      for (++i; i < argc; ++i) (command != nullptr ? command : positional)->push_back(argv[i]);
      break;
    }
    if (!absl::StartsWith(arg, "-") || arg == "-") {
      positional->push_back(std::string(arg));
      continue;
    }
    arg.remove_prefix(absl::StartsWith(arg, "--") ? 2 : 1);
    absl::string_view spelled = arg;
    std::optional<std::string> value;
    if (size_t eq = arg.find('='); eq != absl::string_view::npos) {
      spelled = arg.substr(0, eq);
      value = std::string(arg.substr(eq + 1));
    }
    std::string shown = absl::StrCat("--", spelled);
    if (spelled == "help" || spelled == "h") {
      *help = true;
      continue;
    }
    std::string name = Underscored(spelled);
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    bool negated = false;
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      negated = flag != nullptr && flag->IsOfType<bool>();
      if (!negated) flag = nullptr;
    }
    if (flag == nullptr) return absl::InvalidArgumentError(absl::StrCat(shown, ": unknown flag"));
    if (flag->IsOfType<bool>()) {
      if (negated) {
        if (value) return absl::InvalidArgumentError(absl::StrCat(shown, ": takes no value"));
        value = "false";
      } else if (!value) {
        value = "true";
      }
    } else if (!value) {
      if (i + 1 >= argc) return absl::InvalidArgumentError(absl::StrCat(shown, ": missing value"));
      value = argv[++i];
    }
    // Repeated list flags (--remote-header=A=1 --remote-header=B=2) accumulate.
    if (flag->IsOfType<std::vector<std::string>>()) {
      if (!seen_lists.insert(std::string(flag->Name())).second && !value->empty()) {
        std::string current = flag->CurrentValue();
        if (!current.empty()) value = absl::StrCat(current, ",", *value);
      }
    }
    std::string error;
    if (!flag->ParseFrom(*value, &error)) {
      return absl::InvalidArgumentError(absl::StrCat(shown, ": ", error));
    }
  }
  return absl::OkStatus();
}

std::string FlagsHelp(const std::string& program, const std::string& file_substring) {
  std::vector<const absl::CommandLineFlag*> flags;
  for (const auto& [name, flag] : absl::GetAllFlags()) {
    if (absl::StrContains(flag->Filename(), file_substring)) flags.push_back(flag);
  }
  std::sort(flags.begin(), flags.end(),
            [](auto* a, auto* b) { return a->Name() < b->Name(); });
  std::string out = absl::StrCat("usage: ", program, " [flags]\n\n");
  for (const auto* f : flags) {
    absl::StrAppend(&out, "  --", Dashed(f->Name()), " (default: ", f->DefaultValue(), ")\n      ",
                    f->Help(), "\n");
  }
  return out;
}

}  // namespace parascope
