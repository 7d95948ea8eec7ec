// Function symbols, loadable segments and build id of one ELF file, read with libelf.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::symbolize {

// One function symbol. Addresses are ELF virtual addresses (the file's own link-time addresses,
// not runtime addresses). 32 bytes: the name is a view into its ElfFile's name pool, and the
// demangled name is made on demand (a file's symbols are looked up far fewer times than they are
// loaded: names were 80 bytes and two heap strings a symbol, 4.5 MB of the agent's live heap
// over 22 files under process churn, measured with heaptrack).
struct ElfSymbol {
  uint64_t start = 0;  // st_value
  // Bytes covered: st_size, or for a zero-size symbol the distance to the next symbol, bounded by
  // the end of its section.
  uint64_t size = 0;
  // Raw st_name string, e.g. "_ZN2ps3fooEi" or "memcpy@@GLIBC_2.14". Valid for the lifetime of
  // the ElfFile that returned this symbol, in a copy of the symbol too.
  absl::string_view system_name;
  // Demangle(system_name without an "@VERSION"/"@@VERSION" suffix), computed on each call: once
  // per distinct frame, as StackSymbolizer caches its results (and each window for the frames
  // whose results it cannot cache: DWARF deferred, a debug file on its way).
  std::string name() const;
};

// One ELF file's function symbols, loadable segments and build id, copied out of the file by Open
// (the file is read with pread-style access, never kept mapped, and its fd is closed before Open
// returns). Immutable after Open; thread-compatible (const methods may be called concurrently).
// Invariant: symbols are sorted by start, with unique starts.
class ElfFile {
 public:
  // Opens and reads `path` (any path, e.g. /proc/<pid>/root/usr/lib/x.so).
  // Reads: PT_LOAD and PT_NOTE program headers; STT_FUNC/STT_GNU_IFUNC symbols of .symtab
  // (SHT_SYMTAB) and .dynsym (SHT_DYNSYM); the NT_GNU_BUILD_ID note from SHT_NOTE sections, else
  // from PT_NOTE segments (files without section headers).
  // Sources: ELF gABI ("ELF Header", "Program Header", "Symbol Table", "Note Section"); man 5 elf;
  // GNU build-id note: binutils include/elf/common.h (NT_GNU_BUILD_ID = 3, owner "GNU").
  // Errors: NotFound / PermissionDenied (or other errno statuses) from open(2);
  // InvalidArgument "not an ELF file" for non-ELF content and InvalidArgument "corrupt ELF" when
  // libelf cannot read the headers, symbol tables or notes.
  static absl::StatusOr<std::unique_ptr<ElfFile>> Open(const std::string& path);

  ElfFile(const ElfFile&) = delete;
  ElfFile& operator=(const ElfFile&) = delete;

  // Lowercase hex of the NT_GNU_BUILD_ID descriptor (40 chars for the usual SHA-1 id), "" if none.
  const std::string& build_id() const { return build_id_; }
  // Identifies this opening of the file within the agent's lifetime (never reused): a cache key
  // for files without a build id (ElfCache opens a rewritten file anew, so it gets a new id).
  uint64_t instance_id() const { return instance_id_; }

  // e_type == ET_DYN: a PIE executable or a shared object, so runtime addresses differ from ELF
  // virtual addresses by a load bias (ELF gABI, "ELF Header").
  bool is_pie_or_dso() const { return is_pie_or_dso_; }

  // True if the file has a .symtab (SHT_SYMTAB) section; false for stripped files, whose symbols
  // come from .dynsym only.
  bool has_symtab() const { return has_symtab_; }

  // ELF virtual address of byte `offset` of the file (e.g. mapping offset + (pc - mapping start)
  // from /proc/<pid>/maps), using the PT_LOAD program headers: vaddr = offset - p_offset + p_vaddr
  // for the segment whose file range [p_offset, p_offset + p_filesz) contains `offset`
  // (ELF gABI, "Program Header"). nullopt if no PT_LOAD segment contains it.
  std::optional<uint64_t> FileOffsetToVaddr(uint64_t offset) const;

  // The function symbol whose range [start, start + size) contains `vaddr` (an ELF virtual
  // address), or nullptr. Candidates are defined STT_FUNC / STT_GNU_IFUNC symbols; a zero-size one
  // covers up to the next symbol (bounded by its section's end). Symbols from .symtab and .dynsym
  // are merged and deduplicated by address, preferring global over weak over local bindings, then
  // the .symtab entry. The pointer is valid for the lifetime of this ElfFile. O(log n).
  const ElfSymbol* Lookup(uint64_t vaddr) const;

  // Number of distinct function symbols (after deduplication).
  size_t symbol_count() const { return symbols_.size(); }

  // Approximate heap footprint of this object in bytes, for cache bounding.
  size_t memory_bytes() const { return memory_bytes_; }

 private:
  struct Segment {
    uint64_t offset;  // p_offset
    uint64_t filesz;  // p_filesz
    uint64_t vaddr;   // p_vaddr
  };

  ElfFile() = default;

  std::string build_id_;
  uint64_t instance_id_ = 0;
  bool is_pie_or_dso_ = false;
  bool has_symtab_ = false;
  std::vector<Segment> segments_;
  std::vector<ElfSymbol> symbols_;
  // The symbols' system names, back to back, never changed after Open. Short, they are inline in
  // this object: it is never moved (no copy or move constructor), so the views stay valid.
  std::string names_;
  size_t memory_bytes_ = 0;

  friend class ElfFileReader;
};

}  // namespace parascope::symbolize
