// Separate debug files fetched from debuginfod servers (elfutils' libdebuginfod, the protocol's
// GET <url>/buildid/<hex build id>/debuginfo; debuginfod(8)) into an on-disk cache bounded in
// bytes. Fetches run on one background thread only: the flush thread asks for a build id
// (Request, non-blocking) and later finds the file on disk (Lookup, no network), so a window is
// never held up by the network. Off unless --debuginfod-urls is given: the DEBUGINFOD_URLS
// environment variable is not read (an agent should not start network fetches because of the
// environment it happens to be started in).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

struct debuginfod_client;

namespace parascope::symbolize {

struct DebuginfodOptions {
  // Server base URLs (http://, https:// or file://), queried as libdebuginfod does (in parallel,
  // the first server that starts sending wins). Must not be empty.
  std::vector<std::string> urls;
  // libdebuginfod's cache: <cache_dir>/<build id>/debuginfo, plus its control files
  // (debuginfod-client-config(7)). Created (mode 0700) if missing.
  std::string cache_dir = "/var/cache/parascope/debuginfod";
  // Bound of the files under cache_dir, in bytes (apparent sizes). After each fetch the least
  // recently used build-id directories are deleted until the total is within it; a single file
  // larger than the bound is not downloaded (DEBUGINFOD_MAXSIZE).
  int64_t cache_max_bytes = int64_t{1} << 30;
  // Build ids waiting for the thread at most; more are dropped (counted) and asked again by a
  // later Request.
  size_t queue_capacity = 256;
  // Build ids whose outcome (fetched, failed) is remembered at most; beyond it the outcomes are
  // forgotten (a fetched file is then found again in the cache without network).
  size_t max_remembered = 16384;
  // A build id whose fetch failed (not found, error) is not asked again before this long
  // (libdebuginfod's own negative cache, cache_miss_s, defaults to the same 10 min).
  absl::Duration retry_after = absl::Minutes(10);
  // A server that sends less than 100 KiB in this long is given up (DEBUGINFOD_TIMEOUT, whole
  // seconds, at least 1).
  absl::Duration stall_timeout = absl::Seconds(30);
  // One fetch (all servers) is aborted after this long.
  absl::Duration fetch_timeout = absl::Minutes(5);
};

// Monotonic counters and the last cache size. A fetch that ends in the cache is `fetched` once.
struct DebuginfodStats {
  uint64_t fetched = 0;      // debug files now in the cache
  uint64_t not_found = 0;    // no server has the build id (ENOENT)
  uint64_t errors = 0;       // other failures: unreachable, timeout, too large, aborted at exit
  uint64_t dropped = 0;      // Requests not queued because the queue was full
  uint64_t evictions = 0;    // build-id directories deleted to keep within cache_max_bytes
  uint64_t cache_bytes = 0;  // bytes under cache_dir at the last scan (start, after each fetch)
  size_t queued = 0;         // build ids waiting
  bool busy = false;         // a fetch is in progress
};

// The fetcher: owns one background thread, its libdebuginfod client and a bounded queue of build
// ids. Thread-safe; Request and Lookup are cheap (a mutex, at most a stat(2) and a utimensat(2))
// and never wait for the network.
//
// libdebuginfod 0.188 (Debian 12) reads its configuration only from environment variables:
// debuginfod.h has no setter for the URLs, the cache path or the timeouts (DEBUGINFOD_URLS,
// DEBUGINFOD_CACHE_PATH, DEBUGINFOD_TIMEOUT and DEBUGINFOD_MAXSIZE are read by each
// debuginfod_find_* call). Create therefore setenv(3)s them, which is only safe before other
// threads run: create it first, and have one at a time per process.
// The library Create loads (dlopen(3)); the agent does not link it (debuginfod.cc).
inline constexpr char kLibDebuginfodSoname[] = "libdebuginfod.so.1";
// Marker file Create puts in the cache directory (and requires there when it is not empty).
inline constexpr char kCacheMarker[] = ".parascope-debuginfod-cache";

class Debuginfod {
 public:
  // Creates the cache directory, sets libdebuginfod's environment, starts the thread (which first
  // scans the cache and applies the size bound). Errors: InvalidArgument for empty urls or a
  // relative cache_dir, FailedPrecondition when libdebuginfod.so.1 cannot be loaded, the mkdir(2)
  // errno as a status when the cache cannot be created, and debuginfod_begin's errno when it fails.
  static absl::StatusOr<std::unique_ptr<Debuginfod>> Create(DebuginfodOptions options);
  // Stops the thread: a transfer in progress is aborted within about a second (libdebuginfod
  // polls its progress callback once a second, and a non-zero return aborts).
  ~Debuginfod();
  Debuginfod(const Debuginfod&) = delete;
  Debuginfod& operator=(const Debuginfod&) = delete;

  // Asks for the debug file of `build_id` (lowercase hex, as in .note.gnu.build-id). Returns true
  // when it was queued by this call; false when it is already queued, in progress or fetched,
  // failed less than retry_after ago, is not a valid build id, or the queue is full (counted in
  // `dropped`; it is not remembered, so a later Request tries again). Never blocks on the thread.
  bool Request(absl::string_view build_id);
  // The path of the cached debug file of `build_id` if it is on disk now (a regular, non-empty
  // file: libdebuginfod marks a failed query with an empty file), else "". No network. Marks the
  // file used (its atime) so the size bound evicts least recently used files first. The caller
  // verifies the file (its build id), as for any other candidate.
  std::string Lookup(absl::string_view build_id);
  // True when a fetch of `build_id` ended with the file in the cache (in memory: no I/O).
  bool Fetched(absl::string_view build_id) const;
  // True while a Request for `build_id` is queued or being fetched (in memory: no I/O). Results
  // made without its debug file meanwhile are not worth keeping (StackSymbolizer's cache).
  bool Pending(absl::string_view build_id) const;
  DebuginfodStats stats() const;
  const DebuginfodOptions& options() const { return options_; }

 private:
  explicit Debuginfod(DebuginfodOptions options) : options_(std::move(options)) {}
  void Run();
  static int Progress(debuginfod_client* client, long a, long b);

  enum class State { kQueued, kFetched, kFailed };
  struct Known {
    State state = State::kQueued;
    int64_t failed_mono_ns = 0;  // kFailed: when
    std::string path;            // kFetched: where libdebuginfod put it
  };

  const DebuginfodOptions options_;
  debuginfod_client* client_ = nullptr;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> deadline_mono_ns_{0};  // of the fetch in progress
  std::atomic<bool> aborted_{false};          // the progress callback stopped the fetch
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::string> queue_;
  absl::flat_hash_map<std::string, Known> known_;
  DebuginfodStats stats_;
};

// What BoundDebuginfodCache found and did.
struct CacheBound {
  uint64_t bytes = 0;    // bytes under the directory afterwards
  uint64_t evicted = 0;  // build-id directories deleted
};

// Keeps the debuginfod cache `cache_dir` within `max_bytes`: sums the apparent sizes of its files
// (the control files directly in it, and the files of each build-id directory, named in hex),
// then deletes whole build-id directories, least recently used first (the latest atime or mtime
// of their files, or the directory's mtime), until the total is at most max_bytes. Control files
// are never deleted; other directories are neither counted nor deleted. A missing or unreadable
// directory counts as empty.
CacheBound BoundDebuginfodCache(const std::string& cache_dir, int64_t max_bytes);

// True for a build id as Request takes it: 2 to 128 lowercase hex digits.
bool IsBuildIdHex(absl::string_view build_id);

}  // namespace parascope::symbolize
