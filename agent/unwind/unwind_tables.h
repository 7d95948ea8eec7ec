// The daemon half of user-stack unwinding: per-file CFI tables (cfi.h) loaded into the BPF
// walker's maps (bpf/abi.h "User-stack unwinding"), and per-process mapping lists pointing at
// them. Files are read as the process sees them (/proc/<tgid>/map_files/, else
// /proc/<tgid>/root/<path>); one table per file, keyed by build id (else device, inode, size and
// mtime), shared by every process that maps it.
//
// Memory is bounded: rows live in one preallocated array of `row_capacity` rows (the byte
// budget, --unwind-table-bytes), mapping lists in one of `mapping_capacity` slots. Tables no
// live process maps are kept for reuse and evicted least recently used first when space is
// needed; tables in use are never evicted, so a new file that does not fit gets no table (its
// pcs are unwound with frame pointers) and is counted.
#pragma once

#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "agent/proc/maps.h"
#include "agent/proc/process_table.h"
#include "agent/unwind/cfi.h"
#include "bpf/abi.h"

namespace parascope::unwind {

// The kernel boundary: the four BPF maps of bpf/unwind.bpf.h. A fake in tests.
class UnwindMaps {
 public:
  virtual ~UnwindMaps() = default;
  virtual uint32_t row_capacity() const = 0;
  virtual uint32_t mapping_capacity() const = 0;
  virtual uint32_t process_capacity() const { return PS_UNWIND_PROC_ENTRIES; }
  // Writes rows/mappings at [first, first + n), visible to BPF when the call returns.
  virtual void WriteRows(uint32_t first, absl::Span<const ps_unwind_row> rows) = 0;
  virtual void WriteMappings(uint32_t first, absl::Span<const ps_unwind_mapping> maps) = 0;
  virtual absl::Status SetProcess(uint32_t tgid, const ps_unwind_proc& proc) = 0;
  virtual void DeleteProcess(uint32_t tgid) = 0;
  // ps_unwind_files (bpf/abi.h ps_unwind_file): the table of a file by the identity its vmas
  // show, for the walker's bpf_find_vma lookup of pcs outside a process's list. Errors (a full
  // map: E2BIG) leave the file to the process lists; the default ignores them (fakes, kernels
  // without bpf_find_vma).
  virtual absl::Status SetFile(const ps_unwind_file_key& key, const ps_unwind_file& file) {
    (void)key;
    (void)file;
    return absl::OkStatus();
  }
  virtual void DeleteFile(const ps_unwind_file_key& key) { (void)key; }
  // True when the loaded walker reads ps_unwind_files (bpf_find_vma); else no entries are made.
  virtual bool has_files() const { return false; }
  // Deletes the process's ps_vma_cache entry (bpf/unwind.bpf.h): done once its mapping list is
  // loaded, which the walker then uses instead.
  virtual void DeleteVmaCache(uint32_t tgid) { (void)tgid; }
  // Returns once no BPF program still runs that could have read an entry before it was
  // unlinked (an RCU grace period: BPF programs run under rcu_read_lock). Fakes return at once.
  virtual void Synchronize() {}
};

// First-fit allocator of index ranges in [0, capacity), coalescing on free.
class RangeAllocator {
 public:
  explicit RangeAllocator(uint32_t capacity);
  std::optional<uint32_t> Allocate(uint32_t n);
  void Free(uint32_t first, uint32_t n);
  uint32_t free_count() const { return free_total_; }
  uint32_t largest_free() const;

 private:
  std::map<uint32_t, uint32_t> free_;  // first -> length
  uint32_t free_total_;
};

// Counters and gauges (monotonic counters, current gauges).
struct UnwindTableStats {
  uint64_t tables_built = 0;
  uint64_t tables_evicted = 0;
  uint64_t table_bytes = 0;        // rows in use, in bytes (gauge)
  uint64_t table_budget_bytes = 0; // row_capacity * 16 (gauge)
  uint64_t tables = 0;             // tables loaded (gauge)
  uint64_t processes = 0;          // processes with a mapping list (gauge)
  uint64_t build_ns = 0;           // time spent building tables
  uint64_t no_cfi = 0;             // executable files without .eh_frame/.debug_frame
  uint64_t unreadable = 0;         // files that could not be opened or parsed
  uint64_t budget_full = 0;        // tables not loaded: no room in the row budget
  uint64_t mappings_full = 0;      // processes not (fully) loaded: mapping slots exhausted
  uint64_t process_loads = 0;      // mapping lists written (first load and refreshes)
  uint64_t process_gone = 0;       // processes that exited before or while being loaded
  uint64_t files = 0;              // file identities entered in ps_unwind_files (gauge)
  uint64_t files_full = 0;         // identities not entered: ps_unwind_files full
  // UnwindService: new process images not read because the new-image budget was spent
  // (UnwindService::kExecBurstNs), and the CPU time new-image work took from it.
  uint64_t exec_snapshots_shed = 0;
  uint64_t exec_snapshot_cpu_ns = 0;
  // Of that CPU time, what the bucket did not charge because its debt stops at one burst (a
  // single load of a big new file can cost seconds): the work beyond the 2% rate.
  uint64_t exec_forgiven_cpu_ns = 0;
  // Of exec_snapshot_cpu_ns, what single charges measured beyond their cap and the bucket did
  // not charge (vCPU stalls; UnwindService::kChargeCapNs, ChargeCapNs for a table build).
  uint64_t exec_capped_cpu_ns = 0;
  // New images loaded by UnwindService's poll thread itself (every table known), not handed to
  // its table thread.
  uint64_t exec_inline_loads = 0;
};

// Not thread-safe by itself; UnwindService serializes access.
class UnwindTables {
 public:
  // proc_root: "/proc" (a fixture directory in tests). Borrows `maps`.
  UnwindTables(UnwindMaps* maps, std::string proc_root = "/proc");
  ~UnwindTables();

  // Loads (or reloads) the mapping list of process `tgid` whose start time is `start_ticks`
  // (/proc/<tgid>/stat field 22; 0: take it from /proc), building tables for files seen the
  // first time. exec_id: the image's (bpf/abi.h "Process identity"), PS_EXEC_ID_UNKNOWN when
  // not known. `snapshot`, when given, is the process as ProcessTable::Snapshot just read it: its
  // maps and pinned files are used instead of reading /proc again (a snapshot with a known
  // `start_ticks` reads nothing: it was checked when taken, and a process that exited since is
  // loaded all the same, its entry swept later). Without a snapshot, NotFound when the process
  // is gone or is another process now.
  absl::Status LoadProcess(uint32_t tgid, uint64_t start_ticks = 0,
                           uint32_t exec_id = PS_EXEC_ID_UNKNOWN,
                           const proc::ProcessInfo* snapshot = nullptr);
  // A process that exited before its load (its snapshot found it gone, NotFound): counted in
  // process_gone, and its entry dropped if it is that process's (start time `start_ticks`; an
  // entry of another start time may be the live process now reusing the pid). No /proc read.
  void ForgetGone(uint32_t tgid, uint64_t start_ticks);
  // Reloads of a new image allowed kQuickReloadNs apart before the caller's rate applies.
  static constexpr uint32_t kQuickReloads = 4;
  static constexpr int64_t kQuickReloadNs = 2000000;  // 2 ms
  // True when RefreshProcess would reload the process now.
  bool RefreshDue(uint32_t tgid, uint64_t start_ticks, int64_t now_ns,
                  int64_t min_interval_ns) const;
  // Like LoadProcess for a known process, at most once per `min_interval_ns` (a pc outside its
  // known mappings: a library loaded since).
  absl::Status RefreshProcess(uint32_t tgid, uint64_t start_ticks, int64_t now_ns,
                              int64_t min_interval_ns);
  // Forgets processes whose tgid is no longer listed in proc_root (one directory read); every
  // kVerifyEverySweeps-th call also reads the stat of each one still listed and forgets those
  // with another start time (the pid was reused). A reused pid's stale entry is harmless
  // meanwhile: the walker checks the start time, and the new process replaces it when sampled.
  void SweepExited();
  static constexpr uint32_t kVerifyEverySweeps = 6;
  // Loads every process under proc_root (at start), until the process map is full.
  void LoadAll();
  // Reloads processes some of whose files got no table for lack of room, at most once per
  // `min_interval_ns` each (room may have been freed since).
  void RetryIncomplete(int64_t now_ns, int64_t min_interval_ns);
  // Releases ranges freed at least `quarantine_ns` ago: no BPF program still reads them (a
  // program runs for microseconds, non-preemptibly).
  void ReleaseQuarantine(int64_t now_ns, int64_t quarantine_ns = 1000000000);

  bool Known(uint32_t tgid, uint64_t start_ticks) const;
  // True when LoadProcess of `snapshot` would build no table: every executable file mapping is
  // pinned with an identity whose table is loaded (found with no system call) or whose build
  // failed before. Such a load takes tens of microseconds (UnwindService loads it in its poll
  // thread).
  bool LoadsWithoutBuilding(const proc::ProcessInfo& snapshot) const;
  // Known, and its mapping list is image exec_id's (an entry loaded from /proc, whose exec id was
  // unknown, adopts it: the walker claimed that entry for the running image).
  bool KnownImage(uint32_t tgid, uint64_t start_ticks, uint32_t exec_id);
  UnwindTableStats stats() const;
  // Rows the table builds produced (ps_unwind_row, 16 bytes each), whether or not a table was
  // then loaded, and for a build that failed a bound of what it parsed (a quarter of the file's
  // bytes): the size of the build work, for UnwindService::ChargeCapNs.
  uint64_t build_rows() const { return build_rows_; }

  // For tests and the bench: the table built for a file (nullptr if none).
  struct Table {
    std::string key;                      // "b:<build id>" or "f:<dev>:<inode>:<size>:<mtime>"
    uint32_t first = 0, count = 0;        // rows in ps_unwind_rows
    uint32_t refs = 0;                    // process mappings using it
    uint64_t last_used = 0;               // LRU sequence
    std::vector<UnwindTable::Segment> loads;
    std::vector<std::string> identities;  // identity_to_key_ entries pointing here
    std::vector<ps_unwind_file_key> file_keys;  // ps_unwind_files entries entered for it
  };
  // Enters the file identities of mapping `m` (as /proc/<pid>/maps shows it, and as fstat
  // shows the opened file `st`, which differ on overlayfs since Linux 6.8 and on btrfs) for
  // `table` in ps_unwind_files, newest table first. Tables with other than one executable
  // PT_LOAD are not entered (one bias per file).
  void EnterFile(Table* table, const proc::MapEntry& m, const struct stat& st);
  // Removes `table`'s ps_unwind_files entries that still point at it.
  void ForgetFiles(Table* table);
  const Table* FindTable(const std::string& key) const;

 private:
  struct Process {
    uint64_t start_ticks = 0;
    uint32_t map_first = 0, map_count = 0;
    std::vector<Table*> tables;  // one ref each
    int64_t last_refresh_ns = 0;
    uint32_t exec_id = PS_EXEC_ID_UNKNOWN;
    uint32_t loads = 0;          // loads of this image (RefreshDue's quick first reloads)
    bool incomplete = false;     // a file got no table for lack of room
  };

  // The table of the file behind mapping `m` of `tgid`, building it on first sight; nullptr when
  // the file has none (or it could not be loaded: counted). Adds no reference.
  // `pinned`: the file already open (ProcessTable), or null to open it here.
  Table* TableFor(uint32_t tgid, const proc::MapEntry& m, const proc::PinnedFile* pinned);
  // The table of a pinned file by the identity it had when pinned, with no system call; nullptr
  // when none is loaded, and then *failed says whether its build failed before (no CFI,
  // unreadable). TableFor and LoadsWithoutBuilding both ask it, so they agree.
  Table* PinnedTable(const proc::PinnedFile& pinned, bool* failed) const;
  Table* VdsoTable();
  Table* Insert(const std::string& key, UnwindTable&& t);
  void Unref(Table* t);
  bool MakeRoom(uint32_t rows);
  void DropProcess(uint32_t tgid, Process& p);
  void Quarantine(bool rows, uint32_t first, uint32_t n);

  UnwindMaps* maps_;
  std::string proc_root_;
  uint32_t sweeps_ = 0;  // SweepExited calls
  RangeAllocator rows_, mappings_;
  absl::flat_hash_map<std::string, std::unique_ptr<Table>> tables_;  // by key
  // File identity (dev, inode, size, mtime) -> table key, so a file seen before is not reopened.
  absl::flat_hash_map<std::string, std::string> identity_to_key_;
  absl::flat_hash_map<std::string, uint64_t> failed_identity_;  // identity -> seq of failure
  // ps_unwind_files entries -> the table each points at (bounded by PS_UNWIND_FILE_ENTRIES).
  struct FileKeyHash {
    size_t operator()(const ps_unwind_file_key& k) const {
      return absl::Hash<std::pair<uint64_t, uint64_t>>()({k.dev, k.ino});
    }
  };
  struct FileKeyEq {
    bool operator()(const ps_unwind_file_key& a, const ps_unwind_file_key& b) const {
      return a.dev == b.dev && a.ino == b.ino;
    }
  };
  absl::flat_hash_map<ps_unwind_file_key, Table*, FileKeyHash, FileKeyEq> files_;
  absl::flat_hash_map<uint32_t, Process> processes_;
  struct Quarantined {
    bool rows;
    uint32_t first, n;
    int64_t since_ns;
  };
  std::deque<Quarantined> quarantine_;
  uint64_t quarantined_rows_ = 0;
  bool budget_failed_ = false;  // set by Insert when the budget had no room
  uint64_t build_rows_ = 0;     // build_rows()
  int64_t last_full_sweep_ns_ = 0;
  uint64_t seq_ = 0;
  UnwindTableStats stats_;
};

// Runs UnwindTables on its own thread: loads every process at Start, then serves the walker's
// requests (ps_unwind_events ring buffer: new processes, pcs outside known mappings) and forgets
// exited processes every few seconds.
class UnwindService {
 public:
  // `poll(timeout_ms, handler)` waits up to timeout_ms ms (-1: until an event or `wake`) and
  // calls handler for each ring buffer event; returns the number of events, or -errno (-EINTR is
  // retried silently; another error is logged and retried after 100 ms). Borrowed until Stop.
  using Poller = std::function<int(int timeout_ms,
                                   const std::function<void(const ps_unwind_event&)>& handler)>;
  // `processes` (may be null; borrowed): snapshotted at each process image's first event, so
  // that the symbolizer finds its mappings and files after it exits. `wake` (may be null) makes
  // a `poll` in progress return (thread-safe; called by Stop, which the destructor also calls,
  // so what it uses must outlive this object): with it the poll thread sleeps until an event, a
  // follow-up or Stop (timeout -1); without it, it polls with a 100 ms timeout to see Stop.
  UnwindService(std::unique_ptr<UnwindMaps> maps, Poller poll, std::string proc_root = "/proc",
                proc::ProcessTable* processes = nullptr, std::function<void()> wake = nullptr);
  ~UnwindService();

  // Loads the given processes (all when empty, none when `preload` is false) synchronously, then
  // starts the thread.
  void Start(const std::vector<uint32_t>& tgids, bool preload = true);
  void Stop();
  UnwindTableStats stats() const;
  // Table requests dropped because the queue between the two threads was full.
  uint64_t dropped() const { return dropped_; }

 private:
  // Polls the ring buffer and snapshots each new process image at once (cheap: a maps read and
  // some opens), so short-lived processes are read while they run, then queues the event (or,
  // when the image's tables are all known and TableLoop is idle, loads it itself). A
  // request for an image the walker met before its exec event came waits 1 ms for that exec
  // (kExecWaitNs): a fork child about to exec is then superseded, not read.
  void PollLoop();
  // Builds tables and loads mapping lists from the queue (can take tens of ms per big file).
  void TableLoop();
  // Snapshots processes the walker met with an entry read from /proc (PS_UNWIND_EVENT_CLAIM:
  // they ran before the agent loaded them), then queues them for TableLoop. Its own thread: at
  // start every running process sends one, and snapshots of big processes (hundreds of
  // mappings) took tens of ms on a fresh machine, during which PollLoop must go on reading the
  // exec events of short-lived processes while they live.
  void ClaimLoop();

  // New-image work (the snapshot of an exec'd image while it lives, or of a process the walker
  // met first, their follow-ups, and their table loads; each PollLoop round and TableLoop batch
  // that handles such images is charged whole, its wake-up, the ring buffer and the hand-offs
  // included, and so is a round that only sheds them) is paid from a bucket of CPU time: it
  // starts at kExecBurstNs and refills at kExecRefillNsPerS per second of wall time, so however
  // many processes start per second, that work costs at most 2% of a core plus the burst.
  // Past it, a new image's snapshot and load are shed (counted: exec_snapshots_shed). The
  // walker asks again (at most every 0.1 s per CPU) while a shed process runs and is sampled,
  // so one that lives is read once the bucket refills; one that exits first has its samples
  // kept with the frames nameable without its mappings (kernel frames; its user frames are
  // unsymbolized addresses).
  // The burst reads about 150 `/bin/true` images at once here (0.3 ms each, their rounds
  // included): a build's or a script's spurt. A sampled short-lived child costs more: the
  // short-lived tests' 100 children of 20 ms, sampled at 499 Hz and run back to back in
  // ~2.5 s, take 0.025-0.037 s (the exec's snapshot and load, the follow-up's, the fork child's
  // request and the walker's first requests of the new image, each a round of the poll thread),
  // quiet or with a busy loop on each CPU. That was 0.08-0.10 s, about the burst plus the
  // refill, while every load was handed to TableLoop (two more wake-ups a child); PollLoop now
  // loads an image whose tables are all known itself.
  // The burst was 250 ms; scenario 3 of bench/ (1000 processes exec'd and reaped in 2 s, from a
  // full bucket) then cost the agent 0.41 s of CPU, most of it this burst (bench/: 0.278 s at 100
  // ms, 0.198 s at 50 ms; issue 14 asks 0.2 s a window).
  static constexpr int64_t kExecBurstNs = 50000000;         // 50 ms
  // 2% of a core reads about 65 new images a second here. It was 2.5%: 2 minutes of continuous
  // churn (580 processes a second, bench/) cost the agent 5.7% of a core, the unwinder's threads
  // 2.7% of it; issue 14 asks 5% in all.
  static constexpr int64_t kExecRefillNsPerS = 20000000;  // 20 ms per s: 2% of a core
  // Refills the bucket for the wall time since the last call and says whether exec work may
  // go on (the work is charged after, at its measured thread CPU time: ChargeExec).
  bool ExecBudgetLeft(int64_t now_ns);
  // Taken by PollLoop (snapshots, and loads it does itself) and TableLoop (loads of exec'd
  // images); refilled by PollLoop.
  std::atomic<int64_t> exec_tokens_ns_{kExecBurstNs};
  // Charges `measured_ns` of exec work to the bucket, down to -kExecBurstNs at most (the rest
  // is counted in exec_forgiven_ns_), and at most `cap_ns` of it (the rest is counted in
  // exec_capped_ns_): kChargeCapNs for a snapshot, a follow-up, the rest of a poll round or of a
  // table batch, and a table load that built no table, which take well under a millisecond
  // each here; ChargeCapNs(rows) for a load that built tables.
  void ChargeExec(int64_t measured_ns, int64_t cap_ns = kChargeCapNs);
  // The guest's thread clock (CLOCK_THREAD_CPUTIME_ID) also counts time the host takes the vCPU
  // away: on this kind of VM with both CPUs busy, perf shows each vCPU's samples stopping for
  // ~100 ms several times a minute (the host's CPU bandwidth period). Measured once: a 0.2 ms
  // snapshot took 200 ms of wall time and 100 ms of thread CPU time, and the bucket's debt then
  // shed ~80 short-lived children for 2.5 s. No charge but a table build's is believed beyond
  // this, and a build's only up to its size (ChargeCapNs). A snapshot of a process with thousands
  // of mappings can take more, really: it is then charged this much, and the excess is counted
  // (exec_capped_ns_) with the stalls.
  static constexpr int64_t kChargeCapNs = 20000000;  // 20 ms
  // The most a load that built tables of `rows` rows in all is charged: kChargeCapNs plus 400 ns
  // a row, 4.7-6.5 times what a build costs here (bench/ unwind_table_bench: libc 1.82 ms for
  // 28,273 rows, 64 ns a row; libstdc++ 62 ns; python3.11 86 ns). A big file's build is charged
  // what it really takes (its seconds are the cost that runs long); a vCPU stall inside a small
  // build is not, and no longer sheds new images for up to 2.5 s after it. A build that failed
  // counts a quarter row per byte of its file (UnwindTables::build_rows).
  static constexpr int64_t kBuildChargeNsPerRow = 400;
  static int64_t ChargeCapNs(uint64_t rows) {
    return kChargeCapNs +
           static_cast<int64_t>(std::min<uint64_t>(rows, uint64_t{1} << 32)) * kBuildChargeNsPerRow;
  }
  int64_t exec_refill_ns_ = 0;  // CLOCK_MONOTONIC of the last refill (0: none yet)
  std::atomic<uint64_t> exec_shed_{0}, exec_cpu_ns_{0}, exec_forgiven_ns_{0}, exec_capped_ns_{0};
  absl::flat_hash_set<proc::ProcessKey> shed_images_;  // PollLoop's; kMaxImageEntries at most

  struct Work {
    ps_unwind_event event;
    std::shared_ptr<const proc::ProcessInfo> snapshot;  // null: none taken
    bool gone = false;      // the snapshot found the image gone (exited, pid reused): no load
    int64_t queued_ns = 0;  // CLOCK_MONOTONIC when queued for TableLoop (debug timing)
  };
  static constexpr size_t kMaxQueued = 8192;
  // The handling of one request, by TableLoop or (an image whose tables are all known, see
  // PollLoop) by PollLoop: the load (with `w`'s snapshot) of an exec'd image, a
  // follow-up, a new process or one whose maps are due a refresh, or what a gone or known image
  // needs instead. New-image loads are charged to the budget here (ChargeExec); every load's
  // thread CPU time is added to *charged and counted in *loads. Requires mu_.
  void HandleWork(const Work& w, int64_t now, int64_t* charged, int* loads);
  // Bounds of the per-image bookkeeping below, each cleared whole when full (absl frees a big
  // table's array on clear). Under continuous churn (2,000 execs a second here) they fill in
  // seconds: at 65536 entries each they held 9 MB between them (the poll thread's arena,
  // measured), at these bounds at most 1.8 MB. latest_exec_ keeps the most (its loss is a
  // wrong snapshot risk for events queued across a clear; 16384 images is 8 s of that churn);
  // the others only rate-limit snapshots and retries and count each shed image once (one
  // still shed after a clear is counted again).
  static constexpr size_t kMaxLatestExecs = 16384;
  static constexpr size_t kMaxImageEntries = 8192;
  // How long a batch holding a NEW_PROCESS request waits for the exec that most often follows
  // it (PollLoop), ns.
  static constexpr int64_t kExecWaitNs = 1000000;
  // True for a NEW_PROCESS request that may be a fork child's about to exec: no exec of its
  // image or a later one is known (latest_exec_) and it has no snapshot yet.
  bool AwaitsExec(const ps_unwind_event& e) const;

  std::unique_ptr<UnwindMaps> maps_;
  Poller poll_;
  std::function<void()> wake_;
  proc::ProcessTable* processes_;
  const std::string proc_root_;
  mutable std::mutex mu_;
  UnwindTables tables_;
  std::atomic<bool> stop_{false};
  std::thread thread_, table_thread_, claim_thread_;
  std::mutex claim_mu_;
  std::condition_variable claim_cv_;
  std::deque<ps_unwind_event> claims_;  // at most kMaxQueued, more are dropped (counted)
  std::mutex queue_mu_;
  std::condition_variable queue_cv_;
  std::deque<Work> queue_;
  // TableLoop took a batch from queue_ (set under queue_mu_) and has not handled it yet (cleared
  // under mu_): PollLoop then loads nothing itself, so that loads keep their order.
  std::atomic<bool> batch_taken_{false};
  // New images PollLoop loaded itself (their files' tables all known), not handed to TableLoop:
  // LoadProcess calls, failed ones included.
  std::atomic<uint64_t> inline_loads_{0};
  std::atomic<uint64_t> dropped_{0};
  // PollLoop's snapshot rate for images that keep reporting unknown pcs: last time, count.
  struct SnapshotRate {
    int64_t last_ns = 0;
    uint32_t count = 0;
  };
  absl::flat_hash_map<proc::ProcessKey, SnapshotRate> snapshot_rate_;
  // Images snapshotted at exec before ld.so had mapped their libraries: snapshotted and loaded
  // again shortly after (PollLoop), so that a short-lived process's first samples in libc do
  // not wait for the walker's unknown-pc request. At most kMaxFollowUps pending.
  struct FollowUp {
    proc::ProcessKey key;
    int64_t due_ns;
    uint32_t tries;        // follow-ups of this image so far, this one included
    std::string exe_path;  // the exec snapshot's /proc/<tgid>/exe
  };
  // Queues the next follow-up of `snapshot` if its libraries are still missing.
  void ScheduleFollowUp(const proc::ProcessInfo& snapshot, uint32_t tries, int64_t now_ns);
  // Work of a due follow-up (never sent by BPF: bpf/abi.h PS_UNWIND_EVENT_* are small).
  static constexpr uint32_t kFollowUpEvent = 0x100;
  // Each process's latest image from exec events, by tgid (kMaxLatestExecs at most).
  struct LatestExec {
    uint64_t start_boot_ns;
    uint32_t exec_id;
  };
  mutable std::mutex exec_mu_;  // latest_exec_: written by PollLoop, read by ClaimLoop too
  absl::flat_hash_map<uint32_t, LatestExec> latest_exec_;
  // True when an exec event newer than `key`'s image has arrived for the same process: /proc
  // shows that newer image now, so nothing read there may be filed under `key`. Exec ids count
  // up at each exec (task_struct::self_exec_id, begin_new_exec in fs/exec.c).
  bool Superseded(const proc::ProcessKey& key) const;
  static constexpr size_t kMaxFollowUps = 4096;
  std::vector<FollowUp> follow_ups_;
  uint64_t follow_ups_dropped_ = 0;
  // Processes whose load failed, not retried before the time (monotonic ns) given. Under mu_.
  absl::flat_hash_map<uint32_t, int64_t> retry_after_;
};

}  // namespace parascope::unwind
