// Parsing of /proc/<pid>/maps text. Pure functions over text: no file access here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::proc {

// One line of /proc/<pid>/maps, i.e. one VMA. Field layout follows show_vma_header_prefix() and
// show_map_vma() in fs/proc/task_mmu.c (see also man 5 proc):
//   "<start>-<end> <perms> <offset> <major>:<minor> <inode>" [padding ' ' <path>]
// with start/end/offset/major/minor in hex and inode in decimal.
struct MapEntry {
  uint64_t start = 0;   // virtual address, inclusive
  uint64_t end = 0;     // virtual address, exclusive
  uint64_t offset = 0;  // file offset in bytes of `start` (vm_pgoff << PAGE_SHIFT)
  uint32_t dev_major = 0, dev_minor = 0;
  uint64_t inode = 0;
  std::string perms;  // 4 chars, e.g. "r-xp": read, write, exec, 's'hared or 'p'rivate
  // As shown by the kernel, with the " (deleted)" suffix removed; "" for anonymous memory;
  // pseudo names such as "[vdso]", "[heap]", "[stack]", "[anon:<name>]" are kept. The kernel
  // escapes '\n' in file paths as "\012" (seq_path(..., "\n")); that escape is kept as shown.
  std::string path;
  bool deleted = false;  // the path had the " (deleted)" suffix (fs/d_path.c, unlinked file)

  // True when the mapping is executable: perms[2] == 'x' (VM_EXEC).
  bool executable() const;
  // True when the mapping is backed by a file: path starts with '/'. Includes memfd files
  // ("/memfd:<name>") and deleted files; excludes anonymous memory and "[...]" pseudo names.
  bool file_backed() const;

  friend bool operator==(const MapEntry&, const MapEntry&) = default;
};

// Parses the whole text of /proc/<pid>/maps into entries, in file order (the kernel prints VMAs
// in ascending address order). Paths may contain spaces: everything after the inode field and its
// padding is the path. Empty lines are skipped. Returns InvalidArgument naming the 1-based line
// number on a malformed line (missing fields, non-hex numbers, perms not 4 chars, start >= end).
absl::StatusOr<std::vector<MapEntry>> ParseMaps(absl::string_view text);

}  // namespace parascope::proc
