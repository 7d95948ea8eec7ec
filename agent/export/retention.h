// Retention of --output-dir (--output-max-bytes, --output-max-age): an index of the profile files
// below the directory, oldest window first, so the oldest windows are deleted first.
//
// What is counted: files named "<type>-<t0 unix ms>.pb.gz" (FileExporter's names) at any depth
// up to 3 below the root (DIR/<pid>/<ticks>.<exec id>/ and DIR/cgroup/<id>/), by their
// allocated size (st_blocks * 512, stat(2): what the file takes on disk, which `du` shows; a
// 600-byte profile takes 4096 bytes on ext4). Directories and files with other names are neither
// counted nor deleted. Files already there at start (an earlier run's) are indexed by Scan, and
// "*.pb.gz.tmp" leftovers of a crash are deleted then.
//
// A window's age is its start, t0, from the file name (not mtime): a window older than max_age
// (t0 < now - max_age) is deleted whole. The byte bound is kept before each write: MakeRoom
// deletes the oldest files until the new one fits, so the directory never holds more than
// max_bytes of counted files, even between a write and the next deletion. A directory left empty
// by a deletion is removed, and its parent when that is not the root and empty too.
//
// Memory: 16 bytes per indexed file plus one string per directory holding indexed files. The
// index holds at most max_files files (oldest deleted beyond it, counted as reason "files"), so
// the default of 1,048,576 bounds it to ~16 MiB plus the directories.
//
// Thread-compatible; stats() may be called from any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/util/log.h"

namespace parascope {

struct RetentionOptions {
  // Bound of the counted bytes; 0 = none.
  int64_t max_bytes = 0;
  // Windows whose t0 is older than this are deleted; zero = kept forever.
  absl::Duration max_age = absl::ZeroDuration();
  // Bound of the index (files); the oldest are deleted beyond it.
  size_t max_files = size_t{1} << 20;
};

struct RetentionStats {
  int64_t bytes = 0;   // counted bytes now
  int64_t files = 0;   // counted files now
  uint64_t deleted_bytes_bound = 0;  // files deleted to keep max_bytes
  uint64_t deleted_age = 0;          // files deleted for max_age
  uint64_t deleted_files_bound = 0;  // files deleted to keep max_files
  uint64_t deleted_bytes = 0;        // their allocated bytes, all reasons
  uint64_t errors = 0;               // unlink/stat failures other than ENOENT
};

class OutputRetention {
 public:
  OutputRetention(std::string root, RetentionOptions options);

  // True when either bound is set (otherwise nothing needs indexing).
  bool enabled() const { return options_.max_bytes > 0 || options_.max_age > absl::ZeroDuration(); }

  // Indexes the files already below the root (a missing root is no error) and deletes "*.tmp"
  // leftovers. Then applies the bounds. Errors: opendir of the root other than ENOENT.
  absl::Status Scan(absl::Time now);

  // Deletes the oldest files until `bytes` more fit under max_bytes and `files` more under
  // max_files. A file bigger than max_bytes alone still empties the index first.
  void MakeRoom(int64_t bytes, int64_t files = 1);

  // Records a file just written: dir (no trailing slash), its type (the name's "<type>" part),
  // t0 in unix ms, allocated bytes.
  void Added(const std::string& dir, absl::string_view type, int64_t t0_unix_ms, int64_t bytes);

  // Deletes every window whose t0 is older than now - max_age.
  void Expire(absl::Time now);

  RetentionStats stats() const;

  // Allocated size of a file that holds `bytes` bytes, guessed before it is written: rounded up
  // to 4096 (the block size of ext4, xfs and tmpfs pages).
  static int64_t EstimateAllocated(int64_t bytes) { return (bytes + 4095) / 4096 * 4096; }

 private:
  struct Entry {
    uint32_t dir;      // index into dirs_
    uint16_t type;     // index into types_
    int64_t bytes;
  };
  struct Dir {
    std::string path;
    uint32_t files = 0;
  };
  enum class Reason { kBytes, kAge, kFiles };

  void DeleteOldest(Reason reason);
  uint32_t InternDir(const std::string& path);
  uint16_t InternType(absl::string_view type);
  void ScanDir(const std::string& path, int depth);

  std::string root_;
  RetentionOptions options_;
  // Windows by t0 (unix ms), oldest first; within one window, files in the order written.
  std::map<int64_t, std::deque<Entry>> windows_;
  std::vector<Dir> dirs_;
  std::vector<uint32_t> free_dirs_;
  absl::flat_hash_map<std::string, uint32_t> dir_ids_;
  std::vector<std::string> types_;
  int64_t bytes_ = 0;
  int64_t files_ = 0;

  RateLimitedLog log_{absl::Seconds(60)};
  std::atomic<int64_t> stat_bytes_{0}, stat_files_{0};
  std::atomic<uint64_t> deleted_bytes_bound_{0}, deleted_age_{0}, deleted_files_bound_{0};
  std::atomic<uint64_t> deleted_bytes_{0}, errors_{0};
};

}  // namespace parascope
