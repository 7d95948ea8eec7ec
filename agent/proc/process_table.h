// Process table: per-process name, executable and memory maps read from /proc, keyed by process
// identity (tgid, start time) so that a reused pid is never confused with the process BPF saw.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/proc/maps.h"
#include "agent/proc/stat.h"

namespace parascope::proc {

// Identity of a process: a reused pid is a new process. start_boot_ns is the group leader's
// task_struct::start_boottime (ns since boot, CLOCK_BOOTTIME) as read by BPF.
struct ProcessKey {
  uint32_t tgid = 0;
  uint64_t start_boot_ns = 0;

  friend bool operator==(const ProcessKey&, const ProcessKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ProcessKey& k) {
    return H::combine(std::move(h), k.tgid, k.start_boot_ns);
  }
};

// What the agent knows about one process, as read from /proc/<tgid>/.
struct ProcessInfo {
  ProcessKey key;
  std::string comm;            // /proc/<tgid>/comm (process name) without its trailing newline
  std::string exe_path;        // readlink /proc/<tgid>/exe as is (may end in " (deleted)"), ""
                               // when unreadable (kernel threads, permissions)
  std::vector<MapEntry> maps;  // sorted by start; non-overlapping (VMAs)

  // Returns the mapping with start <= addr < end, or nullptr. O(log n) in the number of maps.
  const MapEntry* FindMapping(uint64_t addr) const;
};

// Caches ProcessInfo per ProcessKey for the symbolizer. Owns all entries; pointers it returns
// (ProcessInfo*, MapEntry*) stay valid until the next call of a non-const method (Get,
// FindMapping, EndWindow), which may evict entries or re-read maps. Not thread-safe.
//
// Invariants: at most max_processes entries; every entry's /proc data was read while
// /proc/<tgid>/stat's start time matched its key (checked before and after reading maps).
// Failed lookups are remembered for the rest of the window so a vanished process costs one
// /proc read per window, not one per sample.
class ProcessTable {
 public:
  // proc_root is "/proc" in production, a fixture directory in tests. max_processes (>= 1; 0 is
  // treated as 1) bounds memory: when full, entries not used in the current window are evicted
  // first, then the least recently used ones.
  explicit ProcessTable(std::string proc_root = "/proc", size_t max_processes = 32768);

  // Returns the process, reading stat/comm/exe/maps from <proc_root>/<tgid>/ on first use (comm
  // falls back to stat's comm field when /proc/<tgid>/comm is unreadable). Errors: NotFound when
  // the process is gone or /proc/<tgid> now belongs to another process (BootNsToTicks(
  // key.start_boot_ns) differs from stat field 22 by more than 1 tick, allowing for rounding;
  // fs/proc/array.c), InvalidArgument for unparsable /proc text, PermissionDenied etc. from the
  // reads. A failure is cached until EndWindow().
  absl::StatusOr<const ProcessInfo*> Get(const ProcessKey& key);

  // Like ProcessInfo::FindMapping on Get(key), but on a miss re-reads maps at most once per
  // window (dlopen'd libraries appear later); the first read by Get counts as that window's read.
  // Returns nullptr when the process is unknown or no mapping contains addr.
  const MapEntry* FindMapping(const ProcessKey& key, uint64_t addr);

  // Marks the end of a collection window: forgets processes not used (Get/FindMapping) during the
  // window and the cached failures.
  void EndWindow();

  // Number of cached processes.
  size_t size() const { return entries_.size(); }

  // Reads that failed with NotFound: the process exited or its pid was reused.
  uint64_t vanished() const { return vanished_; }
  // Reads that failed otherwise (permissions, unparsable text, I/O).
  uint64_t read_errors() const { return read_errors_; }

  // Path through which the file behind `m` can be opened from the agent's mount namespace:
  // <proc_root>/<tgid>/root<path> (the process's root directory as a magic link, so paths in
  // containers resolve; man 5 proc). For deleted files (and memfds):
  // <proc_root>/<tgid>/map_files/<start>-<end> in lowercase hex without 0x, as
  // proc_map_files_readdir() names them (fs/proc/base.c); opening those needs CAP_SYS_ADMIN or
  // CAP_CHECKPOINT_RESTORE. Returns "" when `m` is not file backed (anonymous, "[vdso]", ...).
  std::string HostPath(const ProcessKey& key, const MapEntry& m) const;

 private:
  struct Entry {
    ProcessInfo info;
    uint64_t last_used_window = 0;  // window_ when last returned
    uint64_t last_used_seq = 0;     // use_seq_ when last returned, for LRU eviction
    uint64_t maps_read_window = 0;  // window_ when maps were last read
  };

  std::string ProcDir(uint32_t tgid) const;
  // Reads <tgid>/stat and checks its start time matches `key`: NotFound on mismatch.
  absl::StatusOr<ProcStat> ReadStat(const ProcessKey& key) const;
  // Reads and sorts maps, then re-checks identity so the maps are known to belong to `key`.
  absl::StatusOr<std::vector<MapEntry>> ReadMaps(const ProcessKey& key) const;
  absl::StatusOr<std::unique_ptr<Entry>> Load(const ProcessKey& key) const;
  absl::StatusOr<Entry*> GetEntry(const ProcessKey& key);
  void CountError(const absl::Status& status);
  // Evicts entries so that one more fits within max_processes_.
  void MakeRoom();

  std::string proc_root_;
  size_t max_processes_;
  uint64_t window_ = 0;
  uint64_t use_seq_ = 0;
  uint64_t vanished_ = 0;
  uint64_t read_errors_ = 0;
  // unique_ptr keeps ProcessInfo addresses stable across rehashing.
  absl::flat_hash_map<ProcessKey, std::unique_ptr<Entry>> entries_;
  absl::flat_hash_map<ProcessKey, absl::Status> failed_;  // failures in the current window
};

}  // namespace parascope::proc
