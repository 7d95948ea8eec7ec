// Kernel text symbols from /proc/kallsyms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::symbolize {

// One symbol as returned by Kallsyms::Lookup: views into the Kallsyms object, valid for its
// lifetime.
struct KernelSymbol {
  uint64_t address = 0;      // kernel virtual address
  absl::string_view name;    // e.g. "do_sys_openat2"
  absl::string_view module;  // "" for vmlinux, "nvme" for "[nvme]", "bpf" for BPF programs
};

// The kernel's text symbols (vmlinux and modules), sorted by address with one symbol per address.
// Immutable after Parse/Load; thread-compatible; movable, not copyable. Compact: 16 bytes per
// symbol plus its name (a 6.x kernel has ~120k text symbols: ~5 MiB in all).
class Kallsyms {
 public:
  // Symbols further than this above the greatest symbol <= addr are not trusted: no kernel
  // function is anywhere near this large, so the address is past the end of text (e.g. between
  // vmlinux and the module area, or beyond the last symbol).
  static constexpr uint64_t kMaxSymbolSpan = uint64_t{1} << 20;  // 1 MiB

  // Parses /proc/kallsyms text: one symbol per line, "<hex address> <type char> <name>" with an
  // optional "\t[<module>]" suffix, e.g. "ffffffff81000000 T _stext" or
  // "ffffffffc0a01000 t nvme_probe\t[nvme]" (format of s_show() in kernel/kallsyms.c, "%px %c %s"
  // plus "\t[%s]" for module symbols). Keeps text symbols only (types t, T, w, W; man 1 nm);
  // at one address the first global (upper-case type) symbol wins, else the first one. Empty lines
  // are skipped.
  // Errors: InvalidArgument naming the 1-based line for a malformed line, or when no text symbol
  // is present; FailedPrecondition when every address is zero, which is how kptr_restrict hides
  // addresses from unprivileged readers (Documentation/admin-guide/sysctl/kernel.rst,
  // "kptr_restrict"): run as root / with CAP_SYSLOG.
  static absl::StatusOr<Kallsyms> Parse(absl::string_view text);

  // Reads `path` (procfs reports size 0, so it is read to EOF) and parses it.
  // Errors: open/read errno statuses (NotFound, PermissionDenied, ...), then those of Parse.
  static absl::StatusOr<Kallsyms> Load(const std::string& path = "/proc/kallsyms");

  // The symbol with the greatest address <= `addr`, or nullopt when `addr` is below the first
  // symbol, at or past vmlinux's "_etext" marker without a later symbol in between, or at least
  // kMaxSymbolSpan beyond the symbol found (which covers addresses beyond the last symbol).
  // O(log n).
  std::optional<KernelSymbol> Lookup(uint64_t addr) const;

  Kallsyms(Kallsyms&&) = default;
  Kallsyms& operator=(Kallsyms&&) = default;
  Kallsyms(const Kallsyms&) = delete;
  Kallsyms& operator=(const Kallsyms&) = delete;

  size_t size() const { return symbols_.size(); }
  // Lowest / highest symbol address; 0 when empty.
  uint64_t min_address() const { return symbols_.empty() ? 0 : symbols_.front().address; }
  uint64_t max_address() const { return symbols_.empty() ? 0 : symbols_.back().address; }
  // Heap bytes held (symbol table and names).
  size_t memory_bytes() const;

 private:
  class Builder;
  Kallsyms() = default;
  struct Entry {
    uint64_t address;
    uint32_t name_offset;  // into names_
    uint16_t name_size;
    uint16_t module;       // index into modules_ (0: vmlinux)
  };
  static_assert(sizeof(Entry) == 16, "compact symbol entry");
  KernelSymbol ToSymbol(const Entry& e) const {
    return KernelSymbol{e.address, absl::string_view(names_).substr(e.name_offset, e.name_size),
                        modules_[e.module]};
  }

  std::vector<Entry> symbols_;        // sorted by address, unique addresses
  std::string names_;                 // all names, back to back
  std::vector<std::string> modules_;  // [0] = "" (vmlinux)
};

}  // namespace parascope::symbolize
