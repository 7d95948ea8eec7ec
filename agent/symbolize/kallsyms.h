// Kernel text symbols from /proc/kallsyms.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::symbolize {

// One symbol as returned by Kallsyms::Lookup. `module` views into the Kallsyms object and is
// valid for its lifetime; `name` is a copy (names are kept compressed).
struct KernelSymbol {
  uint64_t address = 0;      // kernel virtual address
  std::string name;          // e.g. "do_sys_openat2"
  absl::string_view module;  // "" for vmlinux, "nvme" for "[nvme]", "bpf" for BPF programs
};

// The kernel's text symbols (vmlinux and modules), sorted by address with one symbol per address.
// Immutable after Parse/Load; thread-compatible; movable, not copyable. Compact: 8 bytes per
// symbol for its address, and its name DEFLATE-compressed (RFC 1951, libdeflate) in blocks of
// kNamesPerBlock names. A 6.x kernel has ~120k text symbols with ~3 MB of names: about 1.7 MiB
// in all instead of 5 MiB. A Lookup inflates one block (about 1.5 KB: a few us).
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

  size_t size() const { return addresses_.size(); }
  // Lowest / highest symbol address; 0 when empty.
  uint64_t min_address() const { return addresses_.empty() ? 0 : addresses_.front(); }
  uint64_t max_address() const { return addresses_.empty() ? 0 : addresses_.back(); }
  // Heap bytes held (addresses, compressed names, module runs).
  size_t memory_bytes() const;

 private:
  class Builder;
  static constexpr size_t kNamesPerBlock = 64;
  Kallsyms() = default;
  // The name of symbol `index`, inflated from its block; "" if the block is corrupt (cannot
  // happen: it was made by Builder).
  std::string NameOf(size_t index) const;
  absl::string_view ModuleOf(size_t index) const;

  std::vector<uint64_t> addresses_;  // sorted, unique
  // Runs of one module: (index of the run's first symbol, module), by index; the first run
  // starts at 0. Modules (and BPF programs) occupy address ranges, so runs are few.
  std::vector<std::pair<uint32_t, uint16_t>> module_runs_;
  // Block b holds the names of symbols [b * kNamesPerBlock, (b + 1) * kNamesPerBlock), each
  // followed by a NUL, raw-DEFLATE-compressed at packed_[block_offsets_[b], block_offsets_[b+1]).
  std::string packed_;
  std::vector<uint32_t> block_offsets_;
  uint32_t max_block_bytes_ = 0;   // the largest block, inflated
  size_t etext_index_ = SIZE_MAX;  // vmlinux's "_etext" marker, if present
  std::vector<std::string> modules_;  // [0] = "" (vmlinux)
};

}  // namespace parascope::symbolize
