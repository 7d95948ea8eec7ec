// Source lines and inlined frames from DWARF, and symbols from separate debug files, through
// elfutils' libdwfl (libdw). Debug info is taken from the binary itself (.debug_info), else from
// a separate debug file found by build id (<debug dir>/.build-id/xx/rest.debug) or by
// .gnu_debuglink (beside the binary, in its .debug/ directory, or <debug dir>/<binary's dir>/;
// gdb's search order, "Separate Debug Files" in the gdb manual); a candidate must carry the
// binary's build id when the binary has one. Symbols also come from MiniDebugInfo (an
// xz-compressed ELF with a .symtab in the .gnu_debugdata section, as Fedora ships; libdwfl reads
// it when built with lzma, as Debian's is). With --debuginfod-urls, a binary with a build id whose
// debug file none of these holds also tries the debuginfod cache (debuginfod.h), and asks for it
// to be fetched in the background when it is not there yet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"

struct Dwfl;
struct Dwfl_Module;

namespace parascope::symbolize {

class Debuginfod;

// One function of a symbolized address: the address's innermost inlined function first, the
// function it was inlined into last.
struct SourceFrame {
  std::string name;         // demangled
  std::string system_name;  // linkage name as in the object file ("" if none)
  std::string file;         // source file, "" if unknown
  int64_t line = 0;         // 0 if unknown
};

// Where separate debug files are searched.
struct DebugSearch {
  // Global debug directories (--debug-dirs), each holding .build-id/ and a tree mirroring the
  // file system (Debian's -dbgsym packages install to /usr/lib/debug).
  std::vector<std::string> debug_dirs = {"/usr/lib/debug"};
  // Borrowed, may be null: the debuginfod cache, the last candidate for a binary with a build id
  // (after the directories above), and the fetcher asked for a build id none of them has.
  Debuginfod* debuginfod = nullptr;
};

// One binary's debug information. Thread-compatible: Symbolize is not const (it caches).
class DwarfFile {
 public:
  // open_path: a path that opens the binary now (e.g. a pinned /proc/self/fd/N). seen_dir: the
  // directory the binary is in, as a path the agent can open (the process's view through
  // /proc/<pid>/root, or the host path), for the .gnu_debuglink search beside it; "" to skip.
  // process_dir: that directory as the process names it (e.g. /usr/bin), for
  // <debug dir>/<process_dir>/<debuglink>.
  // Errors: NotFound/PermissionDenied from open(2), InvalidArgument when libdwfl cannot read
  // the ELF file.
  static absl::StatusOr<std::unique_ptr<DwarfFile>> Open(const std::string& open_path,
                                                         const std::string& seen_dir,
                                                         const std::string& process_dir,
                                                         const DebugSearch& search);
  ~DwarfFile();
  DwarfFile(const DwarfFile&) = delete;
  // Releases libdwfl's handle (the mapped binary and debug file, libdw's caches) but keeps the
  // results; Symbolize attaches again, through the path last given to set_reopen_path, for an
  // address it has no result for.
  void Close();
  bool closed() const { return dwfl_ == nullptr; }
  // A path that opens the binary now (DwarfCache::Get sets it at each use).
  void set_reopen_path(const std::string& open_path) { reopen_path_ = open_path; }
  // CPU time (ns) the caller measured for this file's last opening: the attach and libdw's load
  // of its debug sections (decompressed whole when compressed: SHF_COMPRESSED, gABI 4.1), which
  // costs tens of ms for a large debug file such as libc6-dbg's. 0: not measured yet.
  int64_t open_cost_ns() const { return open_cost_ns_; }
  void set_open_cost_ns(int64_t ns) { open_cost_ns_ = ns; }
  // When (monotonic ns) the caller first deferred reopening this closed file; 0: not waiting.
  int64_t deferred_since_ns() const { return deferred_since_ns_; }
  void set_deferred_since_ns(int64_t ns) { deferred_since_ns_ = ns; }
  DwarfFile& operator=(const DwarfFile&) = delete;

  // The functions at ELF virtual address `vaddr` (as ElfFile::FileOffsetToVaddr gives it),
  // innermost first, with source lines when DWARF has them; empty when no symbol covers it, or
  // when a closed file cannot be reopened. Results are cached (bounded: the cache is dropped when
  // it exceeds 1 MiB).
  const std::vector<SourceFrame>& Symbolize(uint64_t vaddr);
  // The cached result for vaddr, or null when it was not symbolized yet (no DWARF work).
  const std::vector<SourceFrame>* Cached(uint64_t vaddr) const {
    auto it = memo_.find(vaddr);
    return it == memo_.end() ? nullptr : &it->second;
  }
  // True when the binary or a separate debug file has DWARF (looked up on the first call; the
  // separate debug file search runs then). Without it, Symbolize still names addresses from a
  // debug file's or MiniDebugInfo's symbol table.
  bool HasDwarf();
  // The separate debug file used ("" if none, or not looked up yet).
  const std::string& debug_file() const { return debug_file_; }
  // The build id (lowercase hex) this file asked debuginfod for because no debug file was on
  // disk, "" if it did not: once the fetch lands, a fresh DwarfFile finds the file (DwarfCache::Get
  // replaces this one, whose results were made without it).
  const std::string& awaiting_debuginfod() const { return awaiting_debuginfod_; }
  size_t memory_bytes() const { return memo_bytes_ + 4096; }

 private:
  DwarfFile() = default;
  absl::Status Attach(const std::string& open_path);
  void Resolve(uint64_t vaddr, std::vector<SourceFrame>* out);
  // The function symbol covering vaddr from libdwfl's symbol table (the binary's, its debug
  // file's or MiniDebugInfo's), through a sorted index built on first use: libdwfl's own
  // dwfl_module_addrinfo scans every symbol per lookup.
  struct Sym {
    uint64_t start, end;
    const char* name;  // owned by libdwfl's symbol table, valid while dwfl_ lives
  };
  const Sym* SymAt(uint64_t vaddr);
  const char* SymbolAt(uint64_t vaddr) {
    const Sym* s = SymAt(vaddr);
    return s == nullptr ? nullptr : s->name;
  }
  // Functions (by symbol start) known to contain no inlined code: their addresses need only the
  // line table, not a walk of their compile unit's DIEs (dwarf_getscopes, the expensive part).
  struct PlainFunction {
    std::string name, system_name;
  };
  absl::flat_hash_map<uint64_t, PlainFunction> plain_functions_;
  std::vector<Sym> syms_;
  bool syms_built_ = false;

  Dwfl* dwfl_ = nullptr;
  Dwfl_Module* module_ = nullptr;
  std::string seen_dir_;
  std::string process_dir_;
  std::string reopen_path_;
  int64_t open_cost_ns_ = 0;
  int64_t deferred_since_ns_ = 0;
  DebugSearch search_;
  std::string awaiting_debuginfod_;  // build id asked for, lowercase hex
  bool has_dwarf_ = false;
  bool dwarf_checked_ = false;
  std::string debug_file_;
  absl::flat_hash_map<uint64_t, std::vector<SourceFrame>> memo_;
  size_t memo_bytes_ = 0;

  friend int FindDebugInfo(Dwfl_Module*, void**, const char*, uint64_t, const char*, const char*,
                           uint32_t, char**);
};

// DwarfFiles by file identity (build id, or the caller's key), least recently used dropped
// beyond max_files (each holds its debug file mapped). Thread-safe lookups; the DwarfFile itself
// is for one thread at a time (the flush).
class DwarfCache {
 public:
  // max_files: open modules at most (each maps its debug file: file-backed RSS while used).
  explicit DwarfCache(DebugSearch search = {}, size_t max_files = 16);
  // The DwarfFile for `key` (build id, or device/inode), opening it on a miss; null when it
  // cannot be opened (cached as such). A file that asked debuginfod for its debug file is opened
  // afresh at its first use in a window once that file is in debuginfod's cache (a memory check
  // and a stat(2)): its earlier results were made without it.
  std::shared_ptr<DwarfFile> Get(const std::string& key, const std::string& open_path,
                                 const std::string& seen_dir, const std::string& process_dir);
  size_t size() const;
  // Build ids of the files Get opened afresh since the last call because their debug file
  // arrived from debuginfod (at most 1024 kept): results made without it are stale.
  std::vector<std::string> TakeReplaced();
  // Closes every file's libdwfl handle (the mapped binaries and debug files, libdw's caches: the
  // bulk of the memory) and forgets the files not used during the last two windows; results of
  // the others stay for the next window.
  void EndWindow();

 private:
  struct Entry {
    std::string key;
    std::shared_ptr<DwarfFile> file;
    uint64_t last_used_window = 0;
  };
  uint64_t window_ = 0;
  DebugSearch search_;
  size_t max_files_;
  mutable std::mutex mu_;
  std::list<Entry> lru_;
  absl::flat_hash_map<std::string, std::list<Entry>::iterator> index_;
  std::vector<std::string> replaced_;
};

}  // namespace parascope::symbolize
