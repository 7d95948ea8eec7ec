#include "agent/symbolize/debuginfod.h"

#include <dirent.h>
#include <dlfcn.h>
#include <elfutils/debuginfod.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/collect/window_clock.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "agent/util/thread_name.h"

namespace parascope::symbolize {
namespace {

// mkdir -p with mode 0700 for the directories it creates.
absl::Status MakeDirs(const std::string& path) {
  for (size_t i = 1; i <= path.size(); ++i) {
    if (i < path.size() && path[i] != '/') continue;
    std::string prefix = path.substr(0, i);
    if (mkdir(prefix.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoStatus(errno, absl::StrCat("cannot create ", prefix));
    }
  }
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("stat ", path));
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

// The size bound deletes build-id directories in the cache: a directory is used only if it is
// empty or already carries our marker file (so --debuginfod-cache-dir=/usr/lib/debug/.build-id
// or a directory of other data is refused, never trimmed). Errors: FailedPrecondition naming
// the directory; errno statuses of opendir/open.
absl::Status ClaimCacheDir(const std::string& dir) {
  const std::string marker = dir + "/" + kCacheMarker;
  struct stat st {};
  if (lstat(marker.c_str(), &st) == 0) {
    if (!S_ISREG(st.st_mode)) {
      return absl::FailedPreconditionError(absl::StrCat(marker, " is not a regular file"));
    }
    return absl::OkStatus();
  }
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return ErrnoStatus(errno, absl::StrCat("opendir ", dir));
  bool empty = true;
  while (dirent* e = readdir(d)) {
    if (std::strcmp(e->d_name, ".") != 0 && std::strcmp(e->d_name, "..") != 0) {
      empty = false;
      break;
    }
  }
  closedir(d);
  if (!empty) {
    return absl::FailedPreconditionError(absl::StrCat(
        "debuginfod cache directory ", dir, " is not empty and was not made by parascope (no ",
        kCacheMarker, "): choose an empty or new directory, as its size bound deletes files"));
  }
  int fd = open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("cannot create ", marker));
  close(fd);
  return absl::OkStatus();
}

int64_t TimespecNs(const timespec& t) {
  return static_cast<int64_t>(t.tv_sec) * 1000000000 + t.tv_nsec;
}

}  // namespace

bool IsBuildIdHex(absl::string_view id) {
  if (id.size() < 2 || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

CacheBound BoundDebuginfodCache(const std::string& cache_dir, int64_t max_bytes) {
  CacheBound out;
  DIR* d = opendir(cache_dir.c_str());
  if (d == nullptr) return out;
  struct BuildIdDir {
    std::string name;
    uint64_t bytes = 0;
    int64_t last_use_ns = 0;
  };
  std::vector<BuildIdDir> dirs;
  const int fd = dirfd(d);
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    if (S_ISREG(st.st_mode)) {
      out.bytes += static_cast<uint64_t>(st.st_size);
      continue;
    }
    // Only directories named like a build id of at least 64 bits (GNU ld's shortest, --build-id
    // =uuid: 16 bytes; md5/sha1 give 16/20): nothing else in the directory is ours to delete.
    if (!S_ISDIR(st.st_mode) || !IsBuildIdHex(name) || name.size() < 16) continue;
    BuildIdDir b;
    b.name = name;
    // Not the directory's atime: reading the directory (this scan) may update it (relatime).
    b.last_use_ns = TimespecNs(st.st_mtim);
    int sub = openat(fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (sub < 0) continue;
    DIR* sd = fdopendir(sub);
    if (sd == nullptr) {
      close(sub);
      continue;
    }
    while (dirent* f = readdir(sd)) {
      struct stat fst {};
      if (fstatat(sub, f->d_name, &fst, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(fst.st_mode)) {
        continue;
      }
      b.bytes += static_cast<uint64_t>(fst.st_size);
      b.last_use_ns = std::max({b.last_use_ns, TimespecNs(fst.st_atim), TimespecNs(fst.st_mtim)});
    }
    closedir(sd);
    out.bytes += b.bytes;
    dirs.push_back(std::move(b));
  }
  const uint64_t bound = max_bytes < 0 ? 0 : static_cast<uint64_t>(max_bytes);
  if (out.bytes > bound) {
    std::sort(dirs.begin(), dirs.end(), [](const BuildIdDir& a, const BuildIdDir& b) {
      return a.last_use_ns != b.last_use_ns ? a.last_use_ns < b.last_use_ns : a.name < b.name;
    });
    for (const BuildIdDir& b : dirs) {
      if (out.bytes <= bound) break;
      if (b.bytes == 0) continue;  // e.g. libdebuginfod's empty mark of a failed query
      int sub = openat(fd, b.name.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
      if (sub < 0) continue;
      if (DIR* sd = fdopendir(sub)) {
        std::vector<std::string> files;
        while (dirent* f = readdir(sd)) {
          if (std::strcmp(f->d_name, ".") != 0 && std::strcmp(f->d_name, "..") != 0) {
            files.push_back(f->d_name);
          }
        }
        for (const std::string& f : files) {
          struct stat fst {};
          if (fstatat(sub, f.c_str(), &fst, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(fst.st_mode)) {
            (void)unlinkat(sub, f.c_str(), 0);
          }
        }
        closedir(sd);  // closes sub
      } else {
        close(sub);
      }
      // Deleted files are gone even if the directory stays (a file appeared meanwhile).
      (void)unlinkat(fd, b.name.c_str(), AT_REMOVEDIR);
      out.bytes -= b.bytes;
      ++out.evicted;
    }
  }
  closedir(d);
  return out;
}

namespace {

// libdebuginfod, loaded (dlopen(3)) when the first Debuginfod is created instead of linked: its
// closure (libcurl-gnutls, GnuTLS, Kerberos, LDAP, ...: 26 libraries no other part of the agent
// loads) held 3.7 MiB of the agent's RSS on the test VM with debuginfod off, its default. libdwfl
// loads it the same way (elfutils libdwfl/debuginfod-client.c). The handle is kept for the
// process's life. Declarations: elfutils/debuginfod.h.
struct LibDebuginfod {
  decltype(&debuginfod_begin) begin = nullptr;
  decltype(&debuginfod_end) end = nullptr;
  decltype(&debuginfod_set_user_data) set_user_data = nullptr;
  decltype(&debuginfod_get_user_data) get_user_data = nullptr;
  decltype(&debuginfod_set_progressfn) set_progressfn = nullptr;
  decltype(&debuginfod_find_debuginfo) find_debuginfo = nullptr;
  std::string error;  // why it is not usable; "" when every function was found
};

const LibDebuginfod& Lib() {
  static const LibDebuginfod lib = [] {
    LibDebuginfod l;
    void* handle = dlopen(kLibDebuginfodSoname, RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      const char* e = dlerror();
      l.error = e != nullptr ? e : "dlopen failed";
      return l;
    }
    auto find = [&](const char* name, auto* fn) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(handle, name));
      if (*fn == nullptr && l.error.empty()) {
        l.error = absl::StrCat(kLibDebuginfodSoname, " has no ", name);
      }
    };
    find("debuginfod_begin", &l.begin);
    find("debuginfod_end", &l.end);
    find("debuginfod_set_user_data", &l.set_user_data);
    find("debuginfod_get_user_data", &l.get_user_data);
    find("debuginfod_set_progressfn", &l.set_progressfn);
    find("debuginfod_find_debuginfo", &l.find_debuginfo);
    return l;
  }();
  return lib;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Debuginfod>> Debuginfod::Create(DebuginfodOptions options) {
  if (options.urls.empty()) return absl::InvalidArgumentError("debuginfod: no server URLs");
  if (!Lib().error.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot load ", kLibDebuginfodSoname, " (", Lib().error,
                     "): install Debian's libdebuginfod1, or run without --debuginfod-urls"));
  }
  if (options.cache_dir.empty() || options.cache_dir[0] != '/') {
    return absl::InvalidArgumentError(
        absl::StrCat("debuginfod: cache directory '", options.cache_dir, "' is not absolute"));
  }
  PS_RETURN_IF_ERROR(MakeDirs(options.cache_dir));
  PS_RETURN_IF_ERROR(ClaimCacheDir(options.cache_dir));
  // libdebuginfod 0.188 has no API for these (debuginfod.h): each debuginfod_find_* call reads
  // them with getenv(3). Set before any thread of ours runs (class comment).
  const int64_t stall_s = std::max<int64_t>(1, absl::ToInt64Seconds(options.stall_timeout));
  setenv(DEBUGINFOD_URLS_ENV_VAR, absl::StrJoin(options.urls, " ").c_str(), 1);
  setenv(DEBUGINFOD_CACHE_PATH_ENV_VAR, options.cache_dir.c_str(), 1);
  setenv(DEBUGINFOD_TIMEOUT_ENV_VAR, absl::StrCat(stall_s).c_str(), 1);
  setenv(DEBUGINFOD_MAXSIZE_ENV_VAR,
         absl::StrCat(std::max<int64_t>(1, options.cache_max_bytes)).c_str(), 1);
  // Our progress callback replaces the default one DEBUGINFOD_PROGRESS would print to stderr.
  std::unique_ptr<Debuginfod> self(new Debuginfod(std::move(options)));
  self->client_ = Lib().begin();
  if (self->client_ == nullptr) {
    return ErrnoStatus(errno != 0 ? errno : ENOMEM, "debuginfod_begin");
  }
  Lib().set_user_data(self->client_, self.get());
  Lib().set_progressfn(self->client_, &Debuginfod::Progress);
  self->thread_ = std::thread([s = self.get()] {
    NameThisThread("ps-debuginfod");
    s->Run();
  });
  return self;
}

Debuginfod::~Debuginfod() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (client_ != nullptr) Lib().end(client_);
}

int Debuginfod::Progress(debuginfod_client* client, long /*a*/, long /*b*/) {
  auto* self = static_cast<Debuginfod*>(Lib().get_user_data(client));
  if (self == nullptr) return 0;
  if (self->stop_.load() || MonotonicNowNs() > self->deadline_mono_ns_.load()) {
    self->aborted_ = true;
    return 1;  // non-zero: stop the transfer (debuginfod_set_progressfn(3))
  }
  return 0;
}

bool Debuginfod::Request(absl::string_view build_id) {
  if (!IsBuildIdHex(build_id)) return false;
  std::lock_guard<std::mutex> l(mu_);
  if (stop_) return false;
  std::string id(build_id);
  if (auto it = known_.find(id); it != known_.end()) {
    const Known& k = it->second;
    if (k.state != State::kFailed) return false;
    if (MonotonicNowNs() - k.failed_mono_ns < absl::ToInt64Nanoseconds(options_.retry_after)) {
      return false;
    }
  }
  if (queue_.size() >= options_.queue_capacity) {
    ++stats_.dropped;
    return false;
  }
  if (known_.size() >= options_.max_remembered) {
    // Forget the outcomes; keep what is queued or in progress (its state is kQueued).
    absl::erase_if(known_, [](const auto& kv) { return kv.second.state != State::kQueued; });
  }
  known_[id] = Known{};
  queue_.push_back(std::move(id));
  cv_.notify_one();
  return true;
}

std::string Debuginfod::Lookup(absl::string_view build_id) {
  if (!IsBuildIdHex(build_id)) return "";
  std::string path;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = known_.find(build_id);
        it != known_.end() && it->second.state == State::kFetched) {
      path = it->second.path;
    }
  }
  // Else the layout of libdebuginfod 0.188's cache (a file from an earlier run, or a path that
  // was not reported); the file is verified by its build id by the caller either way.
  if (path.empty()) path = absl::StrCat(options_.cache_dir, "/", build_id, "/debuginfo");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0) {
    // A fetched file the size bound (or someone) deleted since: forget it was fetched, so that
    // a later Request fetches it again.
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = known_.find(build_id);
        it != known_.end() && it->second.state == State::kFetched) {
      known_.erase(it);
    }
    return "";
  }
  const timespec times[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};  // atime now, mtime kept
  (void)utimensat(AT_FDCWD, path.c_str(), times, 0);
  return path;
}

bool Debuginfod::Fetched(absl::string_view build_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = known_.find(build_id);
  return it != known_.end() && it->second.state == State::kFetched;
}

bool Debuginfod::Pending(absl::string_view build_id) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = known_.find(build_id);
  return it != known_.end() && it->second.state == State::kQueued;
}

DebuginfodStats Debuginfod::stats() const {
  std::lock_guard<std::mutex> l(mu_);
  DebuginfodStats s = stats_;
  s.queued = queue_.size();
  return s;
}

void Debuginfod::Run() {
  RateLimitedLog errors_log;
  {
    CacheBound b = BoundDebuginfodCache(options_.cache_dir, options_.cache_max_bytes);
    std::lock_guard<std::mutex> l(mu_);
    stats_.cache_bytes = b.bytes;
    stats_.evictions += b.evicted;
  }
  for (;;) {
    std::string id;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [this] { return stop_ || !queue_.empty(); });
      if (stop_) return;
      id = std::move(queue_.front());
      queue_.pop_front();
      stats_.busy = true;
    }
    aborted_ = false;
    deadline_mono_ns_ = MonotonicNowNs() + absl::ToInt64Nanoseconds(options_.fetch_timeout);
    char* found = nullptr;
    // build_id_len 0: the id is a lowercase hex string (debuginfod_find_debuginfo(3)).
    const int rc = Lib().find_debuginfo(client_, reinterpret_cast<const unsigned char*>(id.c_str()),
                                        0, &found);
    std::string path = found != nullptr ? found : "";
    free(found);
    if (rc >= 0) close(rc);
    CacheBound bound;
    if (rc >= 0) bound = BoundDebuginfodCache(options_.cache_dir, options_.cache_max_bytes);
    const bool aborted = aborted_;
    {
      std::lock_guard<std::mutex> l(mu_);
      stats_.busy = false;
      Known& k = known_[id];
      if (rc >= 0) {
        k.state = State::kFetched;
        k.path = path;
        ++stats_.fetched;
        stats_.cache_bytes = bound.bytes;
        stats_.evictions += bound.evicted;
      } else {
        k.state = State::kFailed;
        k.failed_mono_ns = MonotonicNowNs();
        // A transfer we stopped may end as any error, ENOENT included.
        if (rc == -ENOENT && !aborted) {
          ++stats_.not_found;
        } else {
          ++stats_.errors;
        }
      }
    }
    if (rc >= 0) {
      Log(LogLevel::kDebug, "debuginfod: fetched %s to %s (cache %d bytes, %d evicted)", id, path,
          bound.bytes, bound.evicted);
    } else if (rc != -ENOENT && !stop_) {
      errors_log.Log(LogLevel::kWarning, "debuginfod: %s: %s%s", id, std::strerror(-rc),
                     aborted ? " (timed out)" : "");
    }
  }
}

}  // namespace parascope::symbolize
