// Process table: per-process name, executable and executable mappings read from /proc, keyed by
// process identity (tgid, start time, exec id) so that a reused pid or a new program after execve
// is never confused with the process image BPF saw.
//
// Lifecycle: the unwinder's threads call Snapshot() when BPF first meets a process image (its
// first sample or switch-out, or its exec: bpf/abi.h PS_UNWIND_EVENT_*), so the mappings are read
// and the mapped files held open while the process still runs; the window flush reads the
// snapshot later, also after the process has exited. Entries are released after the last window
// that used them.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/proc/maps.h"
#include "agent/proc/stat.h"

namespace parascope::proc {

// Identity of a process image (bpf/abi.h, "Process identity"): a reused pid is a new process,
// and a process that execs runs a new image. start_boot_ns is the group leader's
// task_struct::start_boottime (ns since boot, CLOCK_BOOTTIME) as read by BPF; exec_id the low 32
// bits of task_struct::self_exec_id (only equality is meaningful; /proc does not show it).
struct ProcessKey {
  uint32_t tgid = 0;
  uint64_t start_boot_ns = 0;
  uint32_t exec_id = 0;

  friend bool operator==(const ProcessKey&, const ProcessKey&) = default;
  template <typename H>
  friend H AbslHashValue(H h, const ProcessKey& k) {
    return H::combine(std::move(h), k.tgid, k.start_boot_ns, k.exec_id);
  }
};

// A mapped file held open by the agent, so it can be read after the process exits, after the
// file is deleted or replaced, and from outside the process's mount namespace. Closes the fd when
// the last holder drops it.
class PinnedFile {
 public:
  // Takes ownership of `fd` (an open, read-only descriptor of a regular file).
  PinnedFile(int fd, const struct ::stat& st);
  ~PinnedFile();
  PinnedFile(const PinnedFile&) = delete;
  PinnedFile& operator=(const PinnedFile&) = delete;

  int fd() const { return fd_; }
  // "/proc/self/fd/<fd>": opens the same file from this process (man 5 proc).
  const std::string& path() const { return path_; }
  uint64_t dev() const { return dev_; }
  uint64_t inode() const { return inode_; }
  // fstat(2) of the file when it was pinned: its identity (device, inode, size, mtime) for
  // caches keyed by it, without a system call per use.
  const struct ::stat& stat() const { return stat_; }

 private:
  int fd_;
  std::string path_;
  uint64_t dev_, inode_;
  struct ::stat stat_;
};

// What the agent knows about one process image.
struct ProcessInfo {
  ProcessKey key;
  std::string comm;            // /proc/<tgid>/comm (process name) without its trailing newline
  std::string exe_path;        // readlink /proc/<tgid>/exe as is (may end in " (deleted)"), ""
                               // when unreadable (kernel threads, permissions)
  // Executable mappings only (VM_EXEC: the only ones a pc can be in), sorted by start and
  // non-overlapping. Paths are as the process sees them (relative to its root and mount
  // namespace).
  std::vector<MapEntry> maps;
  // Parallel to maps: the file held open for each file-backed mapping, or null (not file backed,
  // unreadable, or the table's bound on open files was reached).
  std::vector<std::shared_ptr<const PinnedFile>> files;
  bool snapshot = false;       // read while BPF saw the image run (Snapshot), not at flush
  // /proc/<tgid>/cgroup as read with the rest (man 7 cgroups), when the table was asked to
  // (set_read_cgroup; Kubernetes metadata), else "". Read at exec for a snapshot, so a process
  // that exits before the window ends keeps it.
  std::string cgroup;

  // Returns the index into maps of the mapping with start <= addr < end, or -1. O(log n).
  int FindIndex(uint64_t addr) const;
  // Returns the mapping with start <= addr < end, or nullptr.
  const MapEntry* FindMapping(uint64_t addr) const;
};

// A mapping found for an address: keeps its process snapshot alive.
struct MappingRef {
  std::shared_ptr<const ProcessInfo> process;
  const MapEntry* entry = nullptr;
  const PinnedFile* file = nullptr;  // the pinned file, or null
  explicit operator bool() const { return entry != nullptr; }
  const MapEntry* operator->() const { return entry; }
};

// Caches ProcessInfo per ProcessKey for the symbolizer and the unwinder. Thread-safe: Snapshot
// runs on the unwinder's threads (its event poller and its claim thread, concurrently; the
// pinned-file cap may then be passed by a file or two), the rest on the window flush. ProcessInfos are immutable and
// shared: a returned pointer stays valid while it is held, whatever the table does meanwhile.
//
// Invariants: at most max_processes entries and max_pinned_files distinct open files; every
// entry's /proc data was read while /proc/<tgid>/stat's start time matched its key (checked before
// and after reading maps). Failed lookups are remembered for the rest of the window so a vanished
// process costs one /proc read per window, not one per sample.
class ProcessTable {
 public:
  // proc_root is "/proc" in production, a fixture directory in tests. max_processes (>= 1; 0 is
  // treated as 1) bounds memory: when full, entries not used in the current window are evicted
  // first, then the least recently used ones. max_pinned_files bounds the open file descriptors
  // (mappings beyond it are not pinned and are read by path at flush, as before).
  explicit ProcessTable(std::string proc_root = "/proc", size_t max_processes = 8192,
                        size_t max_pinned_files = 4096);

  // Reads the process now (stat, comm, exe, maps) and opens each file-backed executable mapping's
  // file (map_files/ first, else <root>/<path>; files already pinned for any process are shared,
  // not reopened), replacing any entry for `key`; the replaced entry's mappings that overlap none
  // of the new read's are kept (a library unmapped since, or all of them when the process is
  // exiting and its maps read empty). Errors as Get; a failure is not cached.
  absl::StatusOr<std::shared_ptr<const ProcessInfo>> Snapshot(const ProcessKey& key);
  // Makes every later read also read /proc/<tgid>/cgroup into ProcessInfo::cgroup (one more
  // small read per process; off by default).
  void set_read_cgroup(bool on) { read_cgroup_.store(on, std::memory_order_relaxed); }
  // True when an entry for `key` was made by Snapshot.
  bool HasSnapshot(const ProcessKey& key) const;

  // Returns the process: its snapshot, or else reads stat/comm/exe/maps from <proc_root>/<tgid>/
  // on first use (comm falls back to stat's comm field when /proc/<tgid>/comm is unreadable; the
  // exec id cannot be checked then). Errors: NotFound when the process is gone or /proc/<tgid> now
  // belongs to another process (BootNsToTicks(key.start_boot_ns) differs from stat field 22 by
  // more than 1 tick, allowing for rounding; fs/proc/array.c), InvalidArgument for unparsable
  // /proc text, PermissionDenied etc. from the reads. A failure is cached until EndWindow().
  absl::StatusOr<std::shared_ptr<const ProcessInfo>> Get(const ProcessKey& key);

  // Like ProcessInfo::FindMapping on Get(key), but on a miss re-reads maps at most once per
  // window (dlopen'd libraries appear later); the first read by Get counts as that window's read.
  // Empty when the process is unknown or no executable mapping contains addr.
  MappingRef FindMapping(const ProcessKey& key, uint64_t addr);

  // Marks the end of a collection window: forgets processes neither used (Get/FindMapping) nor
  // snapshotted during the window, except snapshots of the current image of processes still
  // running (same start time in <proc_root>/<tgid>/stat), and the cached failures.
  void EndWindow();

  // Number of cached processes.
  size_t size() const;
  // Distinct files held open.
  size_t pinned_files() const;

  // Reads that failed with NotFound: the process exited or its pid was reused.
  uint64_t vanished() const;
  // Reads that failed otherwise (permissions, unparsable text, I/O).
  uint64_t read_errors() const;
  // Snapshots taken.
  uint64_t snapshots() const;

  // The process's perf map (JIT symbols, /tmp/perf-<nspid>.map in its mount namespace, nspid its
  // pid in its own pid namespace: the last NStgid: field of /proc/<pid>/status) held open, opening
  // it now if the process still runs; null if it has none. *seen_path gets the path as the
  // process sees it. Opened files stay with the entry, so they outlive the process.
  std::shared_ptr<const PinnedFile> PerfMapFile(const ProcessKey& key, std::string* seen_path);
  // Opens the perf maps of snapshotted processes that have anonymous executable memory (JIT
  // candidates) but had no perf map yet, each at most once per second: a JIT writes its map
  // after start, and a short-lived process may be gone by the flush. Called by the unwinder's
  // thread between events.
  void PollPerfMaps(int64_t now_ns);

  // Paths through which the file behind `m` can be opened from the agent's mount namespace, best
  // first: the pinned file (/proc/self/fd/N); <proc_root>/<tgid>/map_files/<start>-<end> (the
  // mapped file itself, also in other mount namespaces, chroots and after deletion; lowercase hex
  // without 0x as proc_map_files_readdir() names it, fs/proc/base.c; opening it needs
  // CAP_SYS_ADMIN or CAP_CHECKPOINT_RESTORE); <proc_root>/<tgid>/root<path> unless deleted (the
  // process's root directory as a magic link, so container paths resolve; man 5 proc). Never both
  // prefixes. Empty when `m` is not file backed (anonymous, "[vdso]", ...).
  std::vector<std::string> HostPaths(const MappingRef& m) const;

 private:
  struct Entry {
    std::shared_ptr<const ProcessInfo> info;
    uint64_t last_used_window = 0;  // window_ when last returned
    uint64_t last_used_seq = 0;     // use_seq_ when last returned, for LRU eviction
    uint64_t maps_read_window = 0;  // window_ when maps were last read
    uint64_t created_window = 0;    // window_ when made
    bool jit_candidate = false;     // has anonymous executable memory
    int64_t perf_map_next_try_ns = 0;
    std::shared_ptr<const PinnedFile> perf_map;
    std::string perf_map_path;      // as the process sees it
  };
  // Opens <root>/tmp/perf-<nspid>.map of a live `key` (checking its start time after the open).
  std::shared_ptr<const PinnedFile> OpenPerfMap(const ProcessKey& key, std::string* seen) const;

  std::string ProcDir(uint32_t tgid) const;
  // Opens `dir`, a ProcDir (O_PATH): the reads below go through it, so each names its file without
  // walking the proc root and the pid again. Errors: NotFound when the process is gone.
  absl::StatusOr<int> OpenProcDir(const std::string& dir) const;
  // Reads <tgid>/stat and checks its start time matches `key`: NotFound on mismatch.
  absl::StatusOr<ProcStat> ReadStat(const ProcessKey& key) const;
  // The same through `dirfd`, the open `dir` (AT_FDCWD: by path).
  absl::StatusOr<ProcStat> ReadStatAt(int dirfd, const std::string& dir,
                                      const ProcessKey& key) const;
  // Reads the executable maps, sorted, then reads stat to check identity, so they are known to
  // be `key`'s (the stat read to `stat` when not null).
  absl::StatusOr<std::vector<MapEntry>> ReadMaps(const ProcessKey& key,
                                                 ProcStat* stat = nullptr) const;
  absl::StatusOr<std::vector<MapEntry>> ReadMapsAt(int dirfd, const std::string& dir,
                                                   const ProcessKey& key, ProcStat* stat) const;
  // Opens the process's directory, reads exe, cgroup (when wanted), maps and root through it,
  // then stat (no lock held): 12-15 system calls with the directory's open and close, each a
  // cost per exec'd process; one (the open) for a process already gone, the common case under
  // churn. The identity check after the reads covers them all (a pid, once reused, never names
  // `key` again). comm is stat's: /proc/<pid>/comm prints the same name the same way, unescaped
  // (proc_task_name(..., escape=false) for both, fs/proc/array.c and fs/proc/base.c; only status
  // escapes it).
  absl::StatusOr<std::shared_ptr<ProcessInfo>> Read(const ProcessKey& key) const;
  // Fills info->files. Takes mu_ for the pin index only.
  void Pin(ProcessInfo* info);
  absl::StatusOr<Entry*> GetEntryLocked(const ProcessKey& key, std::unique_lock<std::mutex>& l);
  void CountErrorLocked(const absl::Status& status);
  // Evicts entries so that one more fits within max_processes_.
  void MakeRoomLocked();
  // Whether a snapshot of a later image of key's process (an exec since) was taken.
  bool SupersededLocked(const ProcessKey& key) const;

  const std::string proc_root_;
  std::atomic<bool> read_cgroup_{false};
  const size_t max_processes_;
  const size_t max_pinned_files_;
  mutable std::mutex mu_;
  uint64_t window_ = 0;
  uint64_t use_seq_ = 0;
  uint64_t vanished_ = 0;
  uint64_t read_errors_ = 0;
  uint64_t snapshots_ = 0;
  absl::flat_hash_map<ProcessKey, std::unique_ptr<Entry>> entries_;
  absl::flat_hash_map<ProcessKey, absl::Status> failed_;  // failures in the current window
  // The newest image snapshotted of each process with entries (by tgid; pruned at EndWindow).
  absl::flat_hash_map<uint32_t, ProcessKey> newest_snapshot_;
  // Open files by identity as /proc/<pid>/maps shows it (device, inode, path), so a file another
  // process already pinned is not reopened. Dead weak entries are swept at EndWindow.
  struct MapsFileId {
    uint64_t dev = 0, inode = 0;
    std::string path;
    friend bool operator==(const MapsFileId&, const MapsFileId&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const MapsFileId& k) {
      return H::combine(std::move(h), k.dev, k.inode, k.path);
    }
  };
  absl::flat_hash_map<MapsFileId, std::weak_ptr<const PinnedFile>> pins_;
};

}  // namespace parascope::proc
