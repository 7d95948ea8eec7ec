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
#include "agent/util/libdeflate.h"
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
    if (names_.size() + name.size() > std::numeric_limits<uint32_t>::max()) {
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
    parsed_.push_back({address, static_cast<uint32_t>(names_.size()),
                       static_cast<uint16_t>(name.size()), module_id, IsGlobalType(type)});
    names_.append(name.data(), name.size());
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
      if (a.address != b.address) return a.address < b.address;
      return a.global && !b.global;
    });
    Kallsyms& r = result_;
    r.addresses_.reserve(parsed_.size());
    // Level 6 (libdeflate's default): 3 MB of a 6.x kernel's names in about 60 ms, 4.4x smaller.
    DeflateCompressor compressor(libdeflate_alloc_compressor(6));
    if (compressor == nullptr) return absl::ResourceExhaustedError("kallsyms: out of memory");
    std::string block, out;
    auto flush = [&]() -> absl::Status {
      out.resize(libdeflate_deflate_compress_bound(compressor.get(), block.size()));
      const size_t n = libdeflate_deflate_compress(compressor.get(), block.data(), block.size(),
                                                   out.data(), out.size());
      if (n == 0) return absl::InternalError("kallsyms: names larger than DEFLATE's bound");
      if (r.packed_.size() + n > std::numeric_limits<uint32_t>::max()) {
        return absl::InvalidArgumentError("kallsyms: names exceed 4 GiB");
      }
      r.block_offsets_.push_back(static_cast<uint32_t>(r.packed_.size()));
      r.packed_.append(out.data(), n);
      r.max_block_bytes_ = std::max<uint32_t>(r.max_block_bytes_, block.size());
      block.clear();
      return absl::OkStatus();
    };
    for (const Parsed& p : parsed_) {
      if (!r.addresses_.empty() && r.addresses_.back() == p.address) continue;  // one per address
      const size_t i = r.addresses_.size();
      r.addresses_.push_back(p.address);
      if (r.module_runs_.empty() || r.module_runs_.back().second != p.module) {
        r.module_runs_.emplace_back(static_cast<uint32_t>(i), p.module);
      }
      const absl::string_view name(names_.data() + p.name_offset, p.name_size);
      if (p.module == 0 && name == "_etext" && r.etext_index_ == SIZE_MAX) r.etext_index_ = i;
      block.append(name.data(), name.size());
      block.push_back('\0');
      if ((i + 1) % kNamesPerBlock == 0) PS_RETURN_IF_ERROR(flush());
    }
    if (!block.empty()) PS_RETURN_IF_ERROR(flush());
    r.block_offsets_.push_back(static_cast<uint32_t>(r.packed_.size()));
    std::vector<Parsed>().swap(parsed_);
    std::string().swap(names_);
    r.addresses_.shrink_to_fit();
    r.module_runs_.shrink_to_fit();
    r.packed_.shrink_to_fit();
    r.block_offsets_.shrink_to_fit();
    return std::move(result_);
  }

 private:
  struct Parsed {
    uint64_t address;
    uint32_t name_offset;  // into names_
    uint16_t name_size;
    uint16_t module;  // index into modules_ (0: vmlinux)
    bool global;
  };
  Kallsyms result_;
  std::vector<Parsed> parsed_;
  std::string names_;  // the parsed names, back to back
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
  size_t n = addresses_.capacity() * sizeof(uint64_t) + packed_.capacity() +
             block_offsets_.capacity() * sizeof(uint32_t) +
             module_runs_.capacity() * sizeof(module_runs_[0]);
  for (const std::string& m : modules_) n += sizeof(std::string) + m.capacity();
  return n;
}

std::string Kallsyms::NameOf(size_t index) const {
  thread_local DeflateDecompressor decompressor(libdeflate_alloc_decompressor());
  if (decompressor == nullptr) return "";
  const size_t b = index / kNamesPerBlock;
  std::string block(max_block_bytes_, '\0');
  size_t got = 0;
  if (libdeflate_deflate_decompress(decompressor.get(), packed_.data() + block_offsets_[b],
                                    block_offsets_[b + 1] - block_offsets_[b], block.data(),
                                    block.size(), &got) != LIBDEFLATE_SUCCESS) {
    return "";
  }
  absl::string_view names(block.data(), got);
  for (size_t k = index % kNamesPerBlock; k > 0; --k) {
    const size_t nul = names.find('\0');
    if (nul == absl::string_view::npos) return "";
    names.remove_prefix(nul + 1);
  }
  return std::string(names.substr(0, names.find('\0')));
}

absl::string_view Kallsyms::ModuleOf(size_t index) const {
  auto it = std::upper_bound(
      module_runs_.begin(), module_runs_.end(), index,
      [](size_t i, const std::pair<uint32_t, uint16_t>& run) { return i < run.first; });
  return it == module_runs_.begin() ? absl::string_view() : modules_[std::prev(it)->second];
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
  auto it = std::upper_bound(addresses_.begin(), addresses_.end(), addr);
  if (it == addresses_.begin()) return std::nullopt;
  --it;
  if (addr - *it >= kMaxSymbolSpan) return std::nullopt;
  const size_t index = static_cast<size_t>(it - addresses_.begin());
  // "_etext" marks the end of vmlinux's main text (include/asm-generic/sections.h); what follows
  // up to the next symbol is rodata/data, not code.
  if (index == etext_index_) return std::nullopt;
  return KernelSymbol{*it, NameOf(index), ModuleOf(index)};
}

}  // namespace parascope::symbolize
