#include "agent/proc/process_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/util/hash_map.h"
#include "agent/util/status.h"

namespace parascope::proc {

PinnedFile::PinnedFile(int fd, const struct ::stat& st)
    : fd_(fd),
      path_(absl::StrCat("/proc/self/fd/", fd)),
      dev_(static_cast<uint64_t>(st.st_dev)),
      inode_(static_cast<uint64_t>(st.st_ino)),
      stat_(st) {}

PinnedFile::~PinnedFile() {
  if (fd_ >= 0) close(fd_);
}

int ProcessInfo::FindIndex(uint64_t addr) const {
  // First mapping starting after addr; the candidate is the one before it.
  auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                             [](uint64_t a, const MapEntry& m) { return a < m.start; });
  if (it == maps.begin()) return -1;
  --it;
  return addr < it->end ? static_cast<int>(it - maps.begin()) : -1;
}

const MapEntry* ProcessInfo::FindMapping(uint64_t addr) const {
  int i = FindIndex(addr);
  return i < 0 ? nullptr : &maps[i];
}

namespace {

// Bound on the mappings one image keeps across re-reads (a process that maps and unmaps code at
// ever new addresses must not grow its entry without limit).
constexpr size_t kMaxMergedMaps = 8192;

// `primary`'s mappings and files, plus those of `secondary` that overlap none of primary's (while
// the total stays within kMaxMergedMaps), sorted by start. Both inputs are sorted by start and
// non-overlapping, so the result is too.
void MergeMaps(const ProcessInfo& secondary, ProcessInfo* primary) {
  std::vector<size_t> keep;
  for (size_t k = 0; k < secondary.maps.size(); ++k) {
    const MapEntry& m = secondary.maps[k];
    // The first primary mapping ending after m.start is the only one that can overlap m first.
    auto it = std::upper_bound(primary->maps.begin(), primary->maps.end(), m.start,
                               [](uint64_t a, const MapEntry& p) { return a < p.end; });
    if (it != primary->maps.end() && it->start < m.end) continue;
    if (primary->maps.size() + keep.size() >= kMaxMergedMaps) break;
    keep.push_back(k);
  }
  if (keep.empty()) return;
  std::vector<MapEntry> maps;
  std::vector<std::shared_ptr<const PinnedFile>> files;
  maps.reserve(primary->maps.size() + keep.size());
  files.reserve(maps.capacity());
  size_t a = 0, b = 0;
  while (a < primary->maps.size() || b < keep.size()) {
    if (b == keep.size() ||
        (a < primary->maps.size() && primary->maps[a].start < secondary.maps[keep[b]].start)) {
      maps.push_back(std::move(primary->maps[a]));
      files.push_back(std::move(primary->files[a]));
      ++a;
    } else {
      maps.push_back(secondary.maps[keep[b]]);
      files.push_back(keep[b] < secondary.files.size() ? secondary.files[keep[b]] : nullptr);
      ++b;
    }
  }
  primary->maps = std::move(maps);
  primary->files = std::move(files);
}

}  // namespace

ProcessTable::ProcessTable(std::string proc_root, size_t max_processes, size_t max_pinned_files)
    : proc_root_(std::move(proc_root)),
      max_processes_(std::max<size_t>(max_processes, 1)),
      max_pinned_files_(max_pinned_files) {}

std::string ProcessTable::ProcDir(uint32_t tgid) const {
  return absl::StrCat(proc_root_, "/", tgid);
}

namespace {
// Closes a directory fd when it goes out of scope.
struct DirFdCloser {
  explicit DirFdCloser(int f) : fd(f) {}
  DirFdCloser(const DirFdCloser&) = delete;
  DirFdCloser& operator=(const DirFdCloser&) = delete;
  ~DirFdCloser() { close(fd); }
  const int fd;
};
}  // namespace

absl::StatusOr<int> ProcessTable::OpenProcDir(const std::string& dir) const {
  int fd;
  do {
    fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "open " + dir);
  return fd;
}

absl::StatusOr<ProcStat> ProcessTable::ReadStat(const ProcessKey& key) const {
  // One file: by path, as a directory fd would add its open and close.
  return ReadStatAt(AT_FDCWD, ProcDir(key.tgid), key);
}

absl::StatusOr<ProcStat> ProcessTable::ReadStatAt(int dirfd, const std::string& dir,
                                                  const ProcessKey& key) const {
  PS_ASSIGN_OR_RETURN(std::string text, dirfd == AT_FDCWD ? ReadFileToString(dir + "/stat")
                                                          : ReadFileAt(dirfd, dir, "stat"));
  PS_ASSIGN_OR_RETURN(ProcStat stat, ParseStat(text));
  uint64_t want = BootNsToTicks(key.start_boot_ns);
  uint64_t have = stat.start_time_ticks;
  uint64_t diff = want > have ? want - have : have - want;
  if (diff > 1) {
    return absl::NotFoundError(
        absl::StrCat(dir, "/stat: start time ", have, " ticks, expected ", want, " (pid reused)"));
  }
  return stat;
}

absl::StatusOr<std::vector<MapEntry>> ProcessTable::ReadMaps(const ProcessKey& key,
                                                             ProcStat* stat) const {
  const std::string dir = ProcDir(key.tgid);
  PS_ASSIGN_OR_RETURN(int fd, OpenProcDir(dir));
  DirFdCloser closer(fd);
  return ReadMapsAt(fd, dir, key, stat);
}

absl::StatusOr<std::vector<MapEntry>> ProcessTable::ReadMapsAt(int dirfd, const std::string& dir,
                                                               const ProcessKey& key,
                                                               ProcStat* stat) const {
  PS_ASSIGN_OR_RETURN(std::string text, ReadFileAt(dirfd, dir, "maps"));
  PS_ASSIGN_OR_RETURN(std::vector<MapEntry> maps, ParseMaps(text));
  maps.erase(std::remove_if(maps.begin(), maps.end(),
                            [](const MapEntry& m) { return !m.executable(); }),
             maps.end());
  // Kept for as long as the process lives (and after): without this the vector keeps room for
  // every mapping, executable or not (measured, 1000 idle processes: 4.6 MB of snapshots, about
  // three quarters of it that unused room).
  maps.shrink_to_fit();
  // The kernel prints maps paths relative to the reader's root (seq_path in show_map_vma,
  // fs/proc/task_mmu.c): for a chrooted process they carry its root directory as a prefix.
  // Strip it, so the path is the one the process sees (and <root>/<path> opens it).
  if (absl::StatusOr<std::string> root = ReadLinkAt(dirfd, dir, "root");
      root.ok() && root->size() > 1 && (*root)[0] == '/') {
    const std::string prefix = *root + "/";
    for (MapEntry& m : maps) {
      if (absl::StartsWith(m.path, prefix)) m.path.erase(0, root->size());
    }
  }
  std::sort(maps.begin(), maps.end(),
            [](const MapEntry& a, const MapEntry& b) { return a.start < b.start; });
  PS_ASSIGN_OR_RETURN(ProcStat checked, ReadStatAt(dirfd, dir, key));
  if (stat != nullptr) *stat = std::move(checked);
  return maps;
}

absl::StatusOr<std::shared_ptr<ProcessInfo>> ProcessTable::Read(const ProcessKey& key) const {
  const std::string dir = ProcDir(key.tgid);
  PS_ASSIGN_OR_RETURN(int fd, OpenProcDir(dir));
  DirFdCloser closer(fd);
  auto info = std::make_shared<ProcessInfo>();
  info->key = key;
  absl::StatusOr<std::string> exe = ReadLinkAt(fd, dir, "exe");
  if (exe.ok()) info->exe_path = *std::move(exe);
  if (read_cgroup_.load(std::memory_order_relaxed)) {
    absl::StatusOr<std::string> cgroup = ReadFileAt(fd, dir, "cgroup");
    if (cgroup.ok()) info->cgroup = *std::move(cgroup);
  }
  ProcStat stat;
  PS_ASSIGN_OR_RETURN(info->maps, ReadMapsAt(fd, dir, key, &stat));
  info->files.resize(info->maps.size());
  info->comm = std::move(stat.comm);
  return info;
}

void ProcessTable::Pin(ProcessInfo* info) {
  for (size_t i = 0; i < info->maps.size(); ++i) {
    const MapEntry& m = info->maps[i];
    if (!m.file_backed() || info->files[i] != nullptr) continue;
    MapsFileId id{(uint64_t{m.dev_major} << 32) | m.dev_minor, m.inode, m.path};
    {
      std::lock_guard<std::mutex> l(mu_);
      if (auto it = pins_.find(id); it != pins_.end()) {
        if (auto f = it->second.lock()) {
          info->files[i] = std::move(f);
          continue;
        }
      }
      if (pins_.size() >= max_pinned_files_) {
        absl::erase_if(pins_, [](const auto& kv) { return kv.second.expired(); });
        if (pins_.size() >= max_pinned_files_) continue;
      }
    }
    // The file as the process sees it: map_files/ names the mapped file itself, then the path
    // under the process's root. Never both prefixes (a chroot's maps paths are already relative
    // to its root).
    std::string via_map_files =
        absl::StrFormat("%s/%d/map_files/%x-%x", proc_root_, info->key.tgid, m.start, m.end);
    // O_NONBLOCK: a path the process controls may name a FIFO; opening must never block.
    int fd = open(via_map_files.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0 && !m.deleted) {
      fd = open(absl::StrCat(ProcDir(info->key.tgid), "/root", m.path).c_str(),
                O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    }
    if (fd < 0) continue;
    struct ::stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      continue;
    }
    auto pinned = std::make_shared<const PinnedFile>(fd, st);
    std::lock_guard<std::mutex> l(mu_);
    pins_[id] = pinned;
    info->files[i] = std::move(pinned);
  }
}

absl::StatusOr<std::shared_ptr<const ProcessInfo>> ProcessTable::Snapshot(const ProcessKey& key) {
  absl::StatusOr<std::shared_ptr<ProcessInfo>> read = Read(key);
  if (!read.ok()) {
    std::lock_guard<std::mutex> l(mu_);
    CountErrorLocked(read.status());
    return read.status();
  }
  std::shared_ptr<ProcessInfo> info = *std::move(read);
  info->snapshot = true;
  Pin(info.get());
  bool jit = false;
  for (const MapEntry& m : info->maps) {
    jit |= !m.file_backed() && m.path != "[vdso]" && m.path != "[vsyscall]";
  }
  std::lock_guard<std::mutex> l(mu_);
  ++snapshots_;
  failed_.erase(key);
  // A re-snapshot of a known image keeps the earlier mappings it does not contradict: samples
  // taken before a library was unmapped still need it, and an exiting process reads no mappings
  // at all (do_exit releases the mm before the task is reaped, kernel/exit.c; /proc/<pid>/maps of
  // a task without an mm is empty, fs/proc/task_mmu.c), which must not erase what its samples
  // ran in.
  if (auto it = entries_.find(key); it != entries_.end() && it->second->info != nullptr) {
    MergeMaps(*it->second->info, info.get());
  }
  // Earlier images of this process (before an exec) are done once idle (SupersededLocked).
  // Remembered per process rather than marked on each earlier entry: the marking walked every
  // entry, O(processes) per exec'd process under churn.
  if (auto [it, inserted] = newest_snapshot_.try_emplace(key.tgid, key); !inserted) {
    const ProcessKey& newest = it->second;
    if (newest.start_boot_ns != key.start_boot_ns ||
        static_cast<int32_t>(key.exec_id - newest.exec_id) > 0) {
      it->second = key;
    }
  }
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    MakeRoomLocked();
    auto entry = std::make_unique<Entry>();
    entry->created_window = window_;
    entry->last_used_seq = ++use_seq_;
    entry->last_used_window = window_ - 1;  // not used yet (window_ 0: wraps, never equal)
    it = entries_.emplace(key, std::move(entry)).first;
  }
  it->second->info = info;
  it->second->maps_read_window = window_;
  it->second->jit_candidate |= jit;
  return std::shared_ptr<const ProcessInfo>(std::move(info));
}

bool ProcessTable::HasSnapshot(const ProcessKey& key) const {
  std::lock_guard<std::mutex> l(mu_);
  auto it = entries_.find(key);
  return it != entries_.end() && it->second->info->snapshot;
}

void ProcessTable::CountErrorLocked(const absl::Status& status) {
  if (absl::IsNotFound(status)) {
    ++vanished_;
  } else {
    ++read_errors_;
  }
}

absl::StatusOr<ProcessTable::Entry*> ProcessTable::GetEntryLocked(
    const ProcessKey& key, std::unique_lock<std::mutex>& l) {
  Entry* entry = nullptr;
  if (auto it = entries_.find(key); it != entries_.end()) {
    entry = it->second.get();
  } else {
    if (auto f = failed_.find(key); f != failed_.end()) return f->second;
    l.unlock();
    absl::StatusOr<std::shared_ptr<ProcessInfo>> loaded = Read(key);
    l.lock();
    if (!loaded.ok()) {
      CountErrorLocked(loaded.status());
      if (failed_.size() >= max_processes_) failed_.clear();
      failed_.emplace(key, loaded.status());
      return loaded.status();
    }
    if (auto it = entries_.find(key); it != entries_.end()) {
      entry = it->second.get();  // a snapshot arrived meanwhile: it is the better read
    } else {
      MakeRoomLocked();
      auto e = std::make_unique<Entry>();
      e->info = *std::move(loaded);
      e->maps_read_window = window_;
      e->created_window = window_;
      entry = e.get();
      entries_.emplace(key, std::move(e));
    }
  }
  entry->last_used_window = window_;
  entry->last_used_seq = ++use_seq_;
  return entry;
}

absl::StatusOr<std::shared_ptr<const ProcessInfo>> ProcessTable::Get(const ProcessKey& key) {
  std::unique_lock<std::mutex> l(mu_);
  PS_ASSIGN_OR_RETURN(Entry * entry, GetEntryLocked(key, l));
  return entry->info;
}

MappingRef ProcessTable::FindMapping(const ProcessKey& key, uint64_t addr) {
  std::unique_lock<std::mutex> l(mu_);
  absl::StatusOr<Entry*> entry = GetEntryLocked(key, l);
  if (!entry.ok()) return {};
  std::shared_ptr<const ProcessInfo> info = (*entry)->info;
  int i = info->FindIndex(addr);
  if (i < 0) {
    if ((*entry)->maps_read_window == window_) return {};
    (*entry)->maps_read_window = window_;
    l.unlock();
    absl::StatusOr<std::vector<MapEntry>> maps = ReadMaps(key);
    if (!maps.ok()) {
      l.lock();
      CountErrorLocked(maps.status());  // keep the old maps: earlier samples may still need them
      return {};
    }
    // A new snapshot: the old one stays valid for whoever holds it. The known mappings stay (the
    // re-read cannot tell whether the process exec'ed since: /proc shows no exec id), and only
    // mappings that overlap none of them are added (a library loaded since), pinned now.
    auto fresh = std::make_shared<ProcessInfo>(*info);
    ProcessInfo read;
    read.maps = *std::move(maps);
    read.files.resize(read.maps.size());
    MergeMaps(read, fresh.get());
    Pin(fresh.get());
    info = fresh;
    l.lock();
    if (auto it = entries_.find(key); it != entries_.end()) it->second->info = info;
    i = info->FindIndex(addr);
    if (i < 0) return {};
  }
  return MappingRef{info, &info->maps[i], info->files[i].get()};
}

void ProcessTable::EndWindow() {
  std::lock_guard<std::mutex> l(mu_);
  // Idle entries go, except snapshots of processes still running: BPF sends no new event for a
  // process it knows, so a snapshot dropped now could not be taken again before that process's
  // next samples, and it might exit before their flush.
  absl::erase_if(entries_, [this](const auto& kv) {
    if (kv.second->last_used_window == window_ || kv.second->created_window == window_) {
      return false;
    }
    return !kv.second->info->snapshot || SupersededLocked(kv.first) || !ReadStat(kv.first).ok();
  });
  // Only processes with entries need their newest image.
  absl::flat_hash_set<uint32_t> tgids;
  tgids.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) tgids.insert(key.tgid);
  absl::erase_if(newest_snapshot_, [&](const auto& kv) { return !tgids.contains(kv.first); });
  absl::erase_if(pins_, [](const auto& kv) { return kv.second.expired(); });
  // The room of a burst of short-lived processes goes with them.
  ShrinkIfSparse(entries_);
  ShrinkIfSparse(newest_snapshot_);
  ShrinkIfSparse(pins_);
  failed_.clear();
  ++window_;
}

bool ProcessTable::SupersededLocked(const ProcessKey& key) const {
  auto it = newest_snapshot_.find(key.tgid);
  return it != newest_snapshot_.end() && it->second.start_boot_ns == key.start_boot_ns &&
         static_cast<int32_t>(it->second.exec_id - key.exec_id) > 0;
}

void ProcessTable::MakeRoomLocked() {
  if (entries_.size() < max_processes_) return;
  // Entries idle this window go first (also snapshots of running processes, which EndWindow
  // keeps).
  absl::erase_if(entries_, [this](const auto& kv) {
    return kv.second->last_used_window != window_ && kv.second->created_window != window_;
  });
  if (entries_.size() < max_processes_) return;
  // All were used this window: evict the least recently used 1/16 (at least one), so that the
  // O(n) selection runs once per many insertions.
  std::vector<std::pair<uint64_t, ProcessKey>> by_use;
  by_use.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) by_use.emplace_back(entry->last_used_seq, key);
  size_t n = std::max<size_t>(1, entries_.size() - max_processes_ + 1 + max_processes_ / 16);
  n = std::min(n, by_use.size());
  std::nth_element(by_use.begin(), by_use.begin() + (n - 1), by_use.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < n; ++i) entries_.erase(by_use[i].second);
}

size_t ProcessTable::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return entries_.size();
}

size_t ProcessTable::pinned_files() const {
  std::lock_guard<std::mutex> l(mu_);
  size_t n = 0;
  for (const auto& [id, f] : pins_) n += !f.expired();
  return n;
}

uint64_t ProcessTable::vanished() const {
  std::lock_guard<std::mutex> l(mu_);
  return vanished_;
}

uint64_t ProcessTable::read_errors() const {
  std::lock_guard<std::mutex> l(mu_);
  return read_errors_;
}

uint64_t ProcessTable::snapshots() const {
  std::lock_guard<std::mutex> l(mu_);
  return snapshots_;
}

std::shared_ptr<const PinnedFile> ProcessTable::OpenPerfMap(const ProcessKey& key,
                                                            std::string* seen) const {
  const std::string dir = ProcDir(key.tgid);
  absl::StatusOr<std::string> status = ReadFileToString(dir + "/status");
  if (!status.ok()) return nullptr;
  uint32_t nspid = key.tgid;
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "NStgid:")) continue;
    std::vector<absl::string_view> ids =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    uint32_t v = 0;
    if (!ids.empty() && absl::SimpleAtoi(ids.back(), &v) && v != 0) nspid = v;
    break;
  }
  // The process's effective uid (Uid: real, effective, saved, fs): like perf, only a map owned
  // by the process's user (or root) is believed, so another user cannot plant symbols in /tmp.
  uint64_t euid = ~uint64_t{0};
  for (absl::string_view line : absl::StrSplit(*status, '\n')) {
    if (!absl::ConsumePrefix(&line, "Uid:")) continue;
    std::vector<absl::string_view> ids =
        absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    if (ids.size() >= 2) (void)absl::SimpleAtoi(ids[1], &euid);
    break;
  }
  *seen = absl::StrCat("/tmp/perf-", nspid, ".map");
  int fd = open(absl::StrCat(dir, "/root", *seen).c_str(),
                O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0) return nullptr;
  struct ::stat st {};
  // The pid may have been reused between reading status and the open.
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
      (st.st_uid != 0 && st.st_uid != euid) || !ReadStat(key).ok()) {
    close(fd);
    return nullptr;
  }
  return std::make_shared<const PinnedFile>(fd, st);
}

std::shared_ptr<const PinnedFile> ProcessTable::PerfMapFile(const ProcessKey& key,
                                                            std::string* seen_path) {
  {
    std::lock_guard<std::mutex> l(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end() && it->second->perf_map != nullptr) {
      *seen_path = it->second->perf_map_path;
      return it->second->perf_map;
    }
    // Read and found gone this window (NotFound: exited, or its pid reused): its /proc directory
    // is not there, or is another process's, whose map this would open. Under process churn
    // this open of /proc/<pid>/status, failing, was 7% of the main thread (perf).
    if (it == entries_.end()) {
      auto f = failed_.find(key);
      if (f != failed_.end() && absl::IsNotFound(f->second)) return nullptr;
    }
  }
  std::string seen;
  std::shared_ptr<const PinnedFile> f = OpenPerfMap(key, &seen);
  if (f == nullptr) return nullptr;
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = entries_.find(key); it != entries_.end()) {
    it->second->perf_map = f;
    it->second->perf_map_path = seen;
  }
  *seen_path = seen;
  return f;
}

void ProcessTable::PollPerfMaps(int64_t now_ns) {
  std::vector<ProcessKey> todo;
  {
    std::lock_guard<std::mutex> l(mu_);
    for (auto& [key, e] : entries_) {
      if (e->jit_candidate && e->perf_map == nullptr && e->perf_map_next_try_ns <= now_ns) {
        e->perf_map_next_try_ns = now_ns + 1000000000;
        todo.push_back(key);
      }
    }
  }
  for (const ProcessKey& key : todo) {
    std::string seen;
    std::shared_ptr<const PinnedFile> f = OpenPerfMap(key, &seen);
    if (f == nullptr) continue;
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = entries_.find(key); it != entries_.end()) {
      it->second->perf_map = std::move(f);
      it->second->perf_map_path = std::move(seen);
    }
  }
}

std::vector<std::string> ProcessTable::HostPaths(const MappingRef& m) const {
  std::vector<std::string> out;
  if (!m || !m->file_backed()) return out;
  if (m.file != nullptr) out.push_back(m.file->path());
  const uint32_t tgid = m.process->key.tgid;
  out.push_back(absl::StrFormat("%s/map_files/%x-%x", ProcDir(tgid), m->start, m->end));
  if (!m->deleted) out.push_back(absl::StrCat(ProcDir(tgid), "/root", m->path));
  return out;
}

}  // namespace parascope::proc
