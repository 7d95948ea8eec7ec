// Bounded LRU cache of opened ElfFiles, with negative entries for files that failed to open.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "agent/symbolize/elf_file.h"

namespace parascope::symbolize {

// Identity of a file on the host: st_dev and st_ino from stat(2) (man 2 stat). The same file seen
// through different paths (e.g. /proc/<pid>/root/... of two containers sharing a layer) shares
// one id.
struct FileId {
  uint64_t dev = 0;
  uint64_t inode = 0;

  friend bool operator==(const FileId& a, const FileId& b) {
    return a.dev == b.dev && a.inode == b.inode;
  }
  template <typename H>
  friend H AbslHashValue(H h, const FileId& id) {
    return H::combine(std::move(h), id.dev, id.inode);
  }
};

// A bounded LRU cache of ElfFiles keyed by file identity.
//
// Key: FileId from stat(2) of the host path; when stat fails the key is the path string itself
// (with a zero FileId), so the failure is cached too. A hit on a FileId entry whose size or mtime
// changed since it was cached (file rewritten in place, or inode reused) is treated as a miss.
// Failures (NotFound, PermissionDenied, not ELF, corrupt) are cached as negative entries so a bad
// file is not reopened every window; once a missing path appears, stat succeeds and the new FileId
// key misses, so negative path entries never hide a new file.
// Bounds: total bytes (ElfFile::memory_bytes(), or a small fixed estimate for negative entries)
// and entry count; least recently used entries are evicted first. The newest entry is always kept,
// even if it alone exceeds the byte bound.
// Ownership: entries are shared with callers; an evicted ElfFile lives until its last user drops
// it. Thread-safe: Get may be called concurrently (files are opened outside the lock; two threads
// missing on the same file may both open it, and the later insert wins).
class ElfCache {
 public:
  // Sized for the agent's 64 MiB RSS budget (issue: benchmarks): room for the symbol tables
  // of a few large binaries (a 100k-symbol executable takes ~10 MiB) besides many small ones.
  static constexpr size_t kDefaultMaxBytes = size_t{32} << 20;  // 32 MiB
  static constexpr size_t kDefaultMaxEntries = 1024;

  explicit ElfCache(size_t max_bytes = kDefaultMaxBytes, size_t max_entries = kDefaultMaxEntries);

  ElfCache(const ElfCache&) = delete;
  ElfCache& operator=(const ElfCache&) = delete;

  // Returns the ElfFile for `host_path` (a path valid in the agent's mount namespace, e.g.
  // /proc/<pid>/root/usr/lib/libc.so.6), opening it with ElfFile::Open on a miss.
  // Errors: those of ElfFile::Open (NotFound, PermissionDenied, InvalidArgument), also when
  // served from a cached negative entry.
  absl::StatusOr<std::shared_ptr<const ElfFile>> Get(const std::string& host_path);

  // Lookups served from the cache (positive or negative entries).
  uint64_t hits() const;
  // Lookups that opened the file.
  uint64_t misses() const;
  // Misses whose open failed (each such failure is then cached).
  uint64_t errors() const;
  // Entries dropped to respect the bounds.
  uint64_t evictions() const;
  // Current number of entries (positive and negative).
  size_t size() const;
  // Current accounted bytes of all entries.
  size_t bytes() const;

 private:
  struct Key {
    FileId id;
    std::string path;  // set only when stat failed

    friend bool operator==(const Key& a, const Key& b) { return a.id == b.id && a.path == b.path; }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.id, k.path);
    }
  };
  struct Entry {
    Key key;
    int64_t size = 0;                     // st_size when cached (FileId keys only)
    int64_t mtime_ns = 0;                 // st_mtim when cached (FileId keys only)
    std::shared_ptr<const ElfFile> file;  // null for negative entries
    absl::Status status;                  // error for negative entries
    size_t bytes = 0;
  };
  using List = std::list<Entry>;

  // Inserts `entry` as most recent (replacing any entry with the same key) and evicts to bounds.
  // Requires mu_ held.
  void InsertLocked(Entry entry);
  void EraseLocked(List::iterator it);

  const size_t max_bytes_;
  const size_t max_entries_;

  mutable std::mutex mu_;
  List lru_;  // front = most recently used
  absl::flat_hash_map<Key, List::iterator> index_;
  size_t bytes_ = 0;
  uint64_t hits_ = 0;
  uint64_t misses_ = 0;
  uint64_t errors_ = 0;
  uint64_t evictions_ = 0;
};

}  // namespace parascope::symbolize
