#include "agent/symbolize/kallsyms.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_map.h"
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

// Builds a Kallsyms from lines fed one at a time (Parse feeds a string, Load a file in chunks,
// so the whole text, ~5 MiB on a 6.x kernel, is never held at once).
class Kallsyms::Builder {
 public:
  Builder() { result_.modules_.emplace_back(); }

  absl::Status AddLine(absl::string_view line) {
    ++line_no_;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) return absl::OkStatus();
    ++lines_seen_;

    absl::string_view rest = line;
    absl::string_view addr_field = NextField(rest);
    absl::string_view type_field = NextField(rest);
    absl::string_view name = NextField(rest);
    absl::string_view module_field = NextField(rest);
    if (name.empty()) return LineError(line_no_, "expected \"<address> <type> <name>\"", line);
    if (!NextField(rest).empty()) return LineError(line_no_, "trailing fields", line);
    uint64_t address = 0;
    if (addr_field.size() > 16 || !absl::SimpleHexAtoi(addr_field, &address)) {
      return LineError(line_no_, "bad hex address", line);
    }
    if (type_field.size() != 1 || !std::isalpha(static_cast<unsigned char>(type_field[0]))) {
      return LineError(line_no_, "bad symbol type", line);
    }
    absl::string_view module;
    if (!module_field.empty()) {
      if (module_field.size() < 3 || module_field.front() != '[' || module_field.back() != ']') {
        return LineError(line_no_, "bad module field (want \"[name]\")", line);
      }
      module = module_field.substr(1, module_field.size() - 2);
    }
    if (address != 0) any_nonzero_ = true;
    const char type = type_field[0];
    if (!IsTextType(type)) return absl::OkStatus();
    if (name.size() > std::numeric_limits<uint16_t>::max()) {
      return LineError(line_no_, "symbol name too long", line);
    }
    if (result_.names_.size() + name.size() > std::numeric_limits<uint32_t>::max()) {
      return absl::InvalidArgumentError("kallsyms: names exceed 4 GiB");
    }
    uint16_t module_id = 0;
    if (!module.empty()) {
      auto [it, inserted] = module_index_.try_emplace(std::string(module), 0);
      if (inserted) {
        if (result_.modules_.size() > std::numeric_limits<uint16_t>::max()) {
          return LineError(line_no_, "too many modules", line);
        }
        it->second = static_cast<uint16_t>(result_.modules_.size());
        result_.modules_.emplace_back(module);
      }
      module_id = it->second;
    }
    parsed_.push_back({Entry{address, static_cast<uint32_t>(result_.names_.size()),
                             static_cast<uint16_t>(name.size()), module_id},
                       IsGlobalType(type)});
    result_.names_.append(name.data(), name.size());
    return absl::OkStatus();
  }

  absl::StatusOr<Kallsyms> Finish() && {
    if (lines_seen_ > 0 && !any_nonzero_) {
      return absl::FailedPreconditionError(
          "kallsyms: all symbol addresses are zero (hidden by kernel.kptr_restrict); run as root "
          "or with CAP_SYSLOG");
    }
    if (parsed_.empty()) return absl::InvalidArgumentError("kallsyms: no text symbols");
    // Stable: at equal addresses, the order of the file decides among equally preferred names.
    std::stable_sort(parsed_.begin(), parsed_.end(), [](const Parsed& a, const Parsed& b) {
      if (a.entry.address != b.entry.address) return a.entry.address < b.entry.address;
      return a.global && !b.global;
    });
    result_.symbols_.reserve(parsed_.size());
    for (const Parsed& p : parsed_) {
      if (!result_.symbols_.empty() && result_.symbols_.back().address == p.entry.address) {
        continue;
      }
      result_.symbols_.push_back(p.entry);
    }
    std::vector<Parsed>().swap(parsed_);
    result_.symbols_.shrink_to_fit();
    result_.names_.shrink_to_fit();
    return std::move(result_);
  }

 private:
  struct Parsed {
    Entry entry;
    bool global;
  };
  Kallsyms result_;
  std::vector<Parsed> parsed_;
  absl::flat_hash_map<std::string, uint16_t> module_index_;
  bool any_nonzero_ = false;
  size_t lines_seen_ = 0;
  size_t line_no_ = 0;
};

absl::StatusOr<Kallsyms> Kallsyms::Parse(absl::string_view text) {
  Builder builder;
  while (!text.empty()) {
    size_t eol = text.find('\n');
    PS_RETURN_IF_ERROR(builder.AddLine(text.substr(0, eol)));
    text.remove_prefix(eol == absl::string_view::npos ? text.size() : eol + 1);
  }
  return std::move(builder).Finish();
}

size_t Kallsyms::memory_bytes() const {
  size_t n = symbols_.capacity() * sizeof(Entry) + names_.capacity();
  for (const std::string& m : modules_) n += sizeof(std::string) + m.capacity();
  return n;
}

absl::StatusOr<Kallsyms> Kallsyms::Load(const std::string& path) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  Builder builder;
  std::string pending;  // an incomplete last line
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
    absl::string_view chunk(buf, static_cast<size_t>(n));
    while (!chunk.empty()) {
      size_t eol = chunk.find('\n');
      if (eol == absl::string_view::npos) {
        pending.append(chunk.data(), chunk.size());
        break;
      }
      absl::Status st;
      if (pending.empty()) {
        st = builder.AddLine(chunk.substr(0, eol));
      } else {
        pending.append(chunk.data(), eol);
        st = builder.AddLine(pending);
        pending.clear();
      }
      if (!st.ok()) {
        close(fd);
        return st;
      }
      chunk.remove_prefix(eol + 1);
    }
  }
  close(fd);
  if (!pending.empty()) PS_RETURN_IF_ERROR(builder.AddLine(pending));
  return std::move(builder).Finish();
}

std::optional<KernelSymbol> Kallsyms::Lookup(uint64_t addr) const {
  auto it = std::upper_bound(symbols_.begin(), symbols_.end(), addr,
                             [](uint64_t a, const Entry& sym) { return a < sym.address; });
  if (it == symbols_.begin()) return std::nullopt;
  --it;
  if (addr - it->address >= kMaxSymbolSpan) return std::nullopt;
  KernelSymbol sym = ToSymbol(*it);
  // "_etext" marks the end of vmlinux's main text (include/asm-generic/sections.h); what follows
  // up to the next symbol is rodata/data, not code.
  if (sym.module.empty() && sym.name == "_etext") return std::nullopt;
  return sym;
}

}  // namespace parascope::symbolize
