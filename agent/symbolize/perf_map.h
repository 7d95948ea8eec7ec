// JIT symbols from perf map files: /tmp/perf-<pid>.map, written by Node (--perf-basic-prof), the
// JVM with a perf agent, LuaJIT, Python 3.12 (-X perf) and others. Format (the Linux perf tool's
// tools/perf/Documentation/jit-interface.txt): one symbol per line, "START SIZE NAME\n", START and
// SIZE in hex (with or without 0x), NAME the rest of the line (may contain spaces). The file is
// appended to while the process runs; a later line for the same code wins.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/proc/process_table.h"

namespace parascope::symbolize {

struct PerfMapSymbol {
  uint64_t start = 0;
  uint64_t size = 0;
  std::string name;
};

// Counts from parsing (monotonic per PerfMap).
struct PerfMapParseStats {
  uint64_t symbols = 0;  // lines parsed into symbols
  uint64_t invalid = 0;  // complete lines that are not "START SIZE NAME" (skipped)
};

// Parses the complete lines of `text` (those ending in '\n'), appending symbols to *out. Blank
// lines are skipped; an invalid line is counted and skipped; a name may be empty (then
// "[jit <start>]" is used by lookups) or contain spaces and tabs. Returns the number of bytes
// consumed: everything up to the last '\n', so a half-written last line is parsed on the next
// call when complete.
size_t ParsePerfMapLines(absl::string_view text, std::vector<PerfMapSymbol>* out,
                         PerfMapParseStats* stats);

// One process's perf map, read incrementally: Refresh reads only what was appended since the
// last read. Not thread-safe.
class PerfMap {
 public:
  // Takes ownership of `fd` (open, read-only). `path` is the file's name as the process sees it
  // ("/tmp/perf-<nspid>.map"), used as the Mapping's file name of JIT frames.
  explicit PerfMap(int fd, std::string path = "");
  ~PerfMap();
  PerfMap(const PerfMap&) = delete;
  PerfMap& operator=(const PerfMap&) = delete;

  // Reads what was appended since the last call (at most max_bytes in all: beyond it the rest of
  // the file is ignored and counted as truncated). Errors: the errno of pread.
  absl::Status Refresh(size_t max_bytes);
  // The symbol covering addr (start <= addr < start + size), the latest one for code that was
  // replaced; nullptr if none.
  const PerfMapSymbol* Lookup(uint64_t addr);
  // Bytes held (symbol names and entries).
  size_t memory_bytes() const { return memory_bytes_; }
  const PerfMapParseStats& stats() const { return stats_; }
  bool truncated() const { return truncated_; }
  const std::string& path() const { return path_; }

 private:
  void Index();

  int fd_;
  std::string path_;
  uint64_t offset_ = 0;       // bytes consumed (complete lines)
  std::vector<PerfMapSymbol> symbols_;  // in file order until Index()
  // Sorted by start; for equal starts the later line last. Rebuilt after growth.
  std::vector<uint32_t> by_start_;
  bool dirty_ = false;
  bool truncated_ = false;
  size_t memory_bytes_ = 0;
  PerfMapParseStats stats_;
};

// The parsed perf maps of the processes seen in recent windows; the files themselves are opened
// (and held open) by the ProcessTable (ProcessTable::PerfMapFile). Bounded: max_bytes in all
// (least recently used maps are dropped first). Not thread-safe.
class PerfMaps {
 public:
  // `processes` (borrowed) opens the files.
  explicit PerfMaps(proc::ProcessTable* processes, size_t max_bytes = size_t{32} << 20);

  // The symbol for addr in process `key`, reading (or re-reading, at most once per window) its
  // perf map; nullptr when it has none or no symbol covers addr. *map_path (if not null) gets
  // the perf map's path as the process sees it.
  const PerfMapSymbol* Lookup(const proc::ProcessKey& key, uint64_t addr,
                              std::string* map_path = nullptr);
  // Forgets maps not used during the window, and the processes found without one; allows one
  // re-read per map in the next.
  void EndWindow();

  size_t size() const { return maps_.size(); }
  size_t memory_bytes() const;
  uint64_t invalid_lines() const { return invalid_lines_; }

 private:
  struct Entry {
    std::unique_ptr<PerfMap> map;  // null: the process has no perf map (looked up this window)
    uint64_t window_refreshed = ~uint64_t{0};
    uint64_t last_used_window = 0;
    uint64_t last_used_seq = 0;
    uint64_t invalid_seen = 0;
  };
  std::unique_ptr<PerfMap> Open(const proc::ProcessKey& key) const;
  void Evict();

  proc::ProcessTable* processes_;
  size_t max_bytes_;
  uint64_t window_ = 0;
  uint64_t seq_ = 0;
  uint64_t invalid_lines_ = 0;
  absl::flat_hash_map<proc::ProcessKey, Entry> maps_;
};

}  // namespace parascope::symbolize
