// Writes profiles as gzip pprof files (SPEC section 5, with the process identity in the path):
//   DIR/<pid>/<start ticks>.<exec id>/<type>-<t0 unix ms>.pb.gz
// <start ticks> is the process's start time as /proc/<pid>/stat field 22 shows it (clock ticks
// since boot; `ps -o lstart` prints it as a date), so two processes that had one pid never share
// a directory; <exec id> (bpf/abi.h, "Process identity") changes when the process execs another
// program, so each program a pid ran has its own directory. The profiles of a cgroup
// parallelism group (--latency-group=cgroup: its latency profile) go to
//   DIR/cgroup/<cgroup id>/<type>-<t0 unix ms>.pb.gz
// (the id is the inode number of the cgroup's directory in the cgroup2 mount; the profile's
// comment names its path); a tree's (command mode) go to its root process's directory.
//
// Process churn: every process image with profiles costs a directory of its own (two mkdir(2)
// calls the first time) and a file per profile type: 110-620 us of kernel time per process
// image on this project's test VM (a create loop of that layout; journal-less ext4, see
// bench/README.md), which a host that starts a thousand processes a second cannot afford. So
// at most `max_new_processes` images a window get a new directory; past that, the profiles of
// images whose process is gone by the time they are written are merged per type into
//   DIR/overflow/<part>/<type>-<t0 unix ms>.pb.gz
// (agent/profile/profile_merge.h: each sample labelled with its pid and process name; part 0,
// then 1, ... each time a part reaches kMaxMergedBytes), written when the window ends (Flush).
// An agent whose only output is these files builds such images straight into one overflow
// group instead (MergesProcess, ExportMergedPart; profile_set.h ProfileGroup::Kind::kOverflow):
// the same samples and labels without a profile per image to build and merge.
// An image merged in one window is merged in the next too (it ran across the boundary), so it
// is found in one place. Processes still running always get their own directory, and so do
// images written to in this window or the last (the directory cache below); one whose
// directory is older than that but idle since is merged for the window it exits in.
#pragma once

#include <atomic>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "agent/export/exporter.h"
#include "agent/export/retention.h"
#include "agent/profile/profile_merge.h"

namespace parascope {

// Each file is written to a temporary name and renamed into place, so readers never see a
// partial profile. Files are created and renamed relative to a descriptor of DIR (openat(2),
// renameat(2)), so each system call walks only <pid>/<image>/<file>, not DIR's path again. With a retention bound, room is made before each write (the oldest windows
// are deleted first), so the directory stays under --output-max-bytes. Thread-compatible.
class FileExporter : public Exporter {
 public:
  // `retention` bounds the directory (retention.h); the default bounds nothing.
  // `max_new_processes` (--output-max-new-processes): new process directories a window may make
  // before the profiles of exited processes are merged (header comment); the default never
  // merges.
  explicit FileExporter(std::string dir, RetentionOptions retention = {},
                        size_t max_new_processes = std::numeric_limits<size_t>::max())
      : dir_(std::move(dir)), retention_(dir_, retention), max_new_processes_(max_new_processes) {}
  ~FileExporter() override;
  FileExporter(const FileExporter&) = delete;
  FileExporter& operator=(const FileExporter&) = delete;

  // Indexes the files an earlier run left (when a retention bound is set) and applies the
  // bounds. Call once before the first Export. Errors: the root cannot be listed.
  absl::Status Start(absl::Time now) {
    return retention_.enabled() ? retention_.Scan(now) : absl::OkStatus();
  }
  // After each window: deletes the windows older than --output-max-age, and notices that DIR
  // was replaced (`mv DIR DIR.old && mkdir DIR`, or removed): the descriptor of the old one is
  // dropped, so the next window is written to the path DIR names (stat(2) st_dev/st_ino of the
  // open descriptor and of the path differ).
  // Call Flush first: merged profiles still pending are dropped.
  void EndWindow(absl::Time now);
  // Writes the window's merged profiles (DIR/overflow/). Errors: the first failed write's since
  // the last Flush (a part written by Export included), as Export's; the other parts are still
  // written. The profiles of a part that failed are counted in TakeMergedLost.
  absl::Status Flush();
  // Profiles merged (Export returned OK) whose part could not be written, since the last call.
  uint64_t TakeMergedLost() { return std::exchange(merged_lost_, 0); }
  // Process images whose profiles were merged into DIR/overflow/ instead of a directory of their
  // own, and profiles so merged (one per image and type). Thread-safe.
  uint64_t merged_processes() const { return merged_processes_.load(std::memory_order_relaxed); }
  uint64_t merged_profiles() const { return merged_profiles_.load(std::memory_order_relaxed); }
  // Thread-safe.
  RetentionStats retention_stats() const { return retention_.stats(); }
  bool retention_enabled() const { return retention_.enabled(); }

  // Errors: the errno of mkdir/open/write/rename as a status naming the path. A profile merged
  // into DIR/overflow/ returns OK (InvalidArgument if it cannot be merged); its file is written
  // when its part is full or by Flush, whose status reports a failure.
  absl::Status Export(const ProcessProfile& profile) override;

  // True when the profiles of process image `key` go to DIR/overflow/ this window (header
  // comment), as Export would decide for them; decided once per image and window, and counted
  // in merged_processes then. For a caller that builds such images straight into one
  // overflow group (ProfileGroup::Kind::kOverflow) instead of a profile each: call it before
  // building the image, then export the group's profiles with ExportMergedPart.
  bool MergesProcess(const proc::ProcessKey& key);
  // Writes `profile`, an overflow group's profile of one type holding `group_processes` images,
  // as the next DIR/overflow/<part>/ of its type, with the comment merged parts carry.
  // Counted in merged_profiles (one per image). Adds the comment to `profile.profile`, which
  // copies of `profile` share. Errors: as Export's (nothing is pending).
  absl::Status ExportMergedPart(ProcessProfile profile);

  // Estimated bytes (ProfileMerger::approx_bytes) at which a merged profile is written as one
  // part and the next part begun: bounds the memory of a window's merge to about this much a
  // profile type, plus the one profile that crossed it.
  static constexpr size_t kMaxMergedBytes = size_t{4} << 20;

  // The path a profile is written to.
  std::string PathFor(const ProcessProfile& profile) const;
  // The directory of one process image's (or cgroup group's) profiles.
  std::string DirFor(const ProcessProfile& profile) const;

 private:
  // That directory relative to DIR, and a file's name in it.
  static std::string RelativeDirFor(const ProcessProfile& profile);
  static std::string NameFor(const ProcessProfile& profile);
  // The identity of a profile's directory, for the cache of directories known to exist: 24
  // bytes where the relative path would take a string each.
  struct DirKey {
    enum Kind : uint8_t { kProcess = 0, kCgroup = 1, kOverflow = 2 };
    uint64_t id = 0;     // tgid << 32 | exec id, the cgroup id, or the overflow part
    uint64_t ticks = 0;  // start ticks (0 for the others)
    Kind kind = kProcess;
    bool operator==(const DirKey& o) const {
      return id == o.id && ticks == o.ticks && kind == o.kind;
    }
    template <typename H>
    friend H AbslHashValue(H h, const DirKey& k) {
      return H::combine(std::move(h), k.id, k.ticks, static_cast<uint8_t>(k.kind));
    }
  };
  static DirKey DirKeyFor(const ProcessProfile& profile);
  // The directory of one process image (its tgid, exec count and start time).
  static DirKey ProcessDirKey(const proc::ProcessKey& process);
  // Opens DIR if not open (creating it and its parents when missing), then creates DIR/rel
  // parent first, relative to DIR's descriptor, unless `key` is known to exist. A DIR removed
  // since it was opened is made and opened again (`reopened`: that was done). Errors: the
  // errno of open/mkdir as a status naming the path.
  absl::Status MakeDir(const DirKey& key, const std::string& rel, bool reopened = false);
  bool KnownDir(const DirKey& key);
  void ForgetDir(const DirKey& key);
  // True when the profile goes to DIR/overflow/ (header comment); decided once per image and
  // window, so all its types go to one place.
  bool ShouldMerge(const ProcessProfile& profile, const DirKey& key);
  // The decision for the image of `key` (a process's), whose process is `tgid`.
  bool MergesImage(const DirKey& key, uint32_t tgid);
  // Writes `profile` as DIR/rel_dir/<type>-<t0>.pb.gz (made with `key`), through a .tmp file.
  absl::Status WriteProfile(const DirKey& key, const std::string& rel_dir, const std::string& type,
                            const perftools::profiles::Profile& profile);
  // Writes type's merged profile as the next part.
  absl::Status WriteMerged(const std::string& type);
  // The comment that says why a merged part's processes have no directory of their own.
  std::string OverflowNote() const;

  std::string dir_;
  int dir_fd_ = -1;  // DIR (O_PATH), opened at the first Export
  size_t block_bytes_ = 0;  // DIR's filesystem block, bytes: profiles within one are stored
  OutputRetention retention_;
  // Directories known to exist: those written to in this window and in the last one (a
  // process seen once, as under process churn, is forgotten after two windows), each at most
  // kMaxKnownDirs (past it a directory is made again: mkdir(2) fails with EEXIST, ~2 us).
  // Bounded so: 16384 keys take a table of 32767 slots of 25 bytes, ~0.8 MiB a set, ~1.6 MiB
  // for both. The set of path strings it replaces held up to 65536 (heaptrack, 75 s of
  // churn: 2.2 MB of table, and growing).
  static constexpr size_t kMaxKnownDirs = 16384;
  absl::flat_hash_set<DirKey> dirs_this_window_, dirs_last_window_;
  // The overflow of process churn (header comment).
  size_t max_new_processes_;
  size_t new_dirs_this_window_ = 0;  // process directories made (not found) this window
  // The images decided this window: true = merged (one entry per image exported past the
  // budget: at most a window's processes), and those merged in the last window.
  absl::flat_hash_map<DirKey, bool> merge_decided_;
  absl::flat_hash_set<DirKey> merged_last_window_;
  struct Merge {
    ProfileMerger merger;
    uint32_t next_part = 0;
  };
  absl::flat_hash_map<std::string, Merge> merges_;  // by profile type
  std::atomic<uint64_t> merged_processes_{0}, merged_profiles_{0};
  uint64_t merged_lost_ = 0;    // TakeMergedLost
  absl::Status pending_error_;  // a part written by Export failed; reported by Flush
};

}  // namespace parascope
