#include "agent/symbolize/kallsyms.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/util/status.h"

namespace parascope::symbolize {
namespace {

// nm(1) type letters for text (code) symbols: t/T text section, w/W weak (kernel weak symbols are
// functions in practice).
bool IsTextType(char type) { return type == 't' || type == 'T' || type == 'w' || type == 'W'; }

bool IsGlobalType(char type) { return std::isupper(static_cast<unsigned char>(type)) != 0; }

absl::Status LineError(size_t line_no, absl::string_view what, absl::string_view line) {
  constexpr size_t kMaxQuoted = 120;
  return absl::InvalidArgumentError(absl::StrCat("kallsyms line ", line_no, ": ", what, ": \"",
                                                 line.substr(0, kMaxQuoted), "\""));
}

// Splits off the next run of non-blank characters (blank = space or tab) from `rest`.
absl::string_view NextField(absl::string_view& rest) {
  size_t begin = rest.find_first_not_of(" \t");
  if (begin == absl::string_view::npos) {
    rest = absl::string_view();
    return absl::string_view();
  }
  rest.remove_prefix(begin);
  size_t end = rest.find_first_of(" \t");
  absl::string_view field = rest.substr(0, end);
  rest.remove_prefix(end == absl::string_view::npos ? rest.size() : end);
  return field;
}

}  // namespace

absl::StatusOr<Kallsyms> Kallsyms::Parse(absl::string_view text) {
  struct Parsed {
    KernelSymbol symbol;
    bool global;
  };
  std::vector<Parsed> parsed;
  bool any_nonzero = false;
  size_t lines_seen = 0;
  size_t line_no = 0;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    absl::string_view line = text.substr(0, eol);
    text.remove_prefix(eol == absl::string_view::npos ? text.size() : eol + 1);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    ++lines_seen;

    absl::string_view rest = line;
    absl::string_view addr_field = NextField(rest);
    absl::string_view type_field = NextField(rest);
    absl::string_view name = NextField(rest);
    absl::string_view module_field = NextField(rest);
    if (name.empty()) return LineError(line_no, "expected \"<address> <type> <name>\"", line);
    if (!NextField(rest).empty()) return LineError(line_no, "trailing fields", line);
    uint64_t address = 0;
    if (addr_field.size() > 16 || !absl::SimpleHexAtoi(addr_field, &address)) {
      return LineError(line_no, "bad hex address", line);
    }
    if (type_field.size() != 1 || !std::isalpha(static_cast<unsigned char>(type_field[0]))) {
      return LineError(line_no, "bad symbol type", line);
    }
    absl::string_view module;
    if (!module_field.empty()) {
      if (module_field.size() < 3 || module_field.front() != '[' || module_field.back() != ']') {
        return LineError(line_no, "bad module field (want \"[name]\")", line);
      }
      module = module_field.substr(1, module_field.size() - 2);
    }
    if (address != 0) any_nonzero = true;
    const char type = type_field[0];
    if (!IsTextType(type)) continue;
    parsed.push_back(
        {KernelSymbol{address, std::string(name), std::string(module)}, IsGlobalType(type)});
  }

  if (lines_seen > 0 && !any_nonzero) {
    return absl::FailedPreconditionError(
        "kallsyms: all symbol addresses are zero (hidden by kernel.kptr_restrict); run as root or "
        "with CAP_SYSLOG");
  }
  if (parsed.empty()) return absl::InvalidArgumentError("kallsyms: no text symbols");

  // Stable: at equal addresses, the order of the file decides among equally preferred names.
  std::stable_sort(parsed.begin(), parsed.end(), [](const Parsed& a, const Parsed& b) {
    if (a.symbol.address != b.symbol.address) return a.symbol.address < b.symbol.address;
    return a.global && !b.global;
  });
  Kallsyms result;
  result.symbols_.reserve(parsed.size());
  for (Parsed& p : parsed) {
    if (!result.symbols_.empty() && result.symbols_.back().address == p.symbol.address) continue;
    result.symbols_.push_back(std::move(p.symbol));
  }
  result.symbols_.shrink_to_fit();
  return result;
}

absl::StatusOr<Kallsyms> Kallsyms::Load(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  std::string text;
  char buf[1 << 16];
  while (true) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, absl::StrCat("read ", path));
    }
    if (n == 0) break;
    text.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return Parse(text);
}

const KernelSymbol* Kallsyms::Lookup(uint64_t addr) const {
  auto it = std::upper_bound(symbols_.begin(), symbols_.end(), addr,
                             [](uint64_t a, const KernelSymbol& sym) { return a < sym.address; });
  if (it == symbols_.begin()) return nullptr;
  --it;
  if (addr - it->address >= kMaxSymbolSpan) return nullptr;
  // "_etext" marks the end of vmlinux's main text (include/asm-generic/sections.h); what follows
  // up to the next symbol is rodata/data, not code.
  if (it->module.empty() && it->name == "_etext") return nullptr;
  return &*it;
}

}  // namespace parascope::symbolize
