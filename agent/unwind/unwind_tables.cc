#include "agent/unwind/unwind_tables.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/auxv.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <limits.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/collect/window_clock.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "agent/util/thread_name.h"

namespace parascope::unwind {

// ---- RangeAllocator ----

RangeAllocator::RangeAllocator(uint32_t capacity) : free_total_(capacity) {
  if (capacity > 0) free_[0] = capacity;
}

std::optional<uint32_t> RangeAllocator::Allocate(uint32_t n) {
  if (n == 0) return 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < n) continue;
    uint32_t first = it->first, len = it->second;
    free_.erase(it);
    if (len > n) free_[first + n] = len - n;
    free_total_ -= n;
    return first;
  }
  return std::nullopt;
}

void RangeAllocator::Free(uint32_t first, uint32_t n) {
  if (n == 0) return;
  free_total_ += n;
  auto next = free_.lower_bound(first);
  if (next != free_.end() && first + n == next->first) {
    n += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == first) {
      prev->second += n;
      return;
    }
  }
  free_[first] = n;
}

uint32_t RangeAllocator::largest_free() const {
  uint32_t m = 0;
  for (const auto& [f, n] : free_) m = std::max(m, n);
  return m;
}

// ---- UnwindTables ----

namespace {

// Reads /proc/<tgid>/stat; NotFound if gone.
absl::StatusOr<uint64_t> StartTicks(const std::string& proc_root, uint32_t tgid) {
  PS_ASSIGN_OR_RETURN(std::string text,
                      proc::ReadFileToString(absl::StrCat(proc_root, "/", tgid, "/stat")));
  PS_ASSIGN_OR_RETURN(proc::ProcStat st, proc::ParseStat(text));
  return st.start_time_ticks;
}

int64_t NowNs() { return MonotonicNowNs(); }

}  // namespace

UnwindTables::UnwindTables(UnwindMaps* maps, std::string proc_root)
    : maps_(maps),
      proc_root_(std::move(proc_root)),
      rows_(maps->row_capacity()),
      mappings_(maps->mapping_capacity()) {
  stats_.table_budget_bytes = uint64_t{maps->row_capacity()} * sizeof(ps_unwind_row);
}

UnwindTables::~UnwindTables() = default;

const UnwindTables::Table* UnwindTables::FindTable(const std::string& key) const {
  auto it = tables_.find(key);
  return it == tables_.end() ? nullptr : it->second.get();
}

bool UnwindTables::Known(uint32_t tgid, uint64_t start_ticks) const {
  auto it = processes_.find(tgid);
  return it != processes_.end() && it->second.start_ticks == start_ticks;
}

bool UnwindTables::KnownImage(uint32_t tgid, uint64_t start_ticks, uint32_t exec_id) {
  auto it = processes_.find(tgid);
  if (it == processes_.end() || it->second.start_ticks != start_ticks) return false;
  Process& p = it->second;
  if (p.exec_id == PS_EXEC_ID_UNKNOWN) {
    p.exec_id = exec_id;  // loaded from /proc; the walker claimed the entry for this image
    return true;
  }
  return p.exec_id == exec_id;
}

UnwindTableStats UnwindTables::stats() const {
  UnwindTableStats s = stats_;
  s.tables = tables_.size();
  s.processes = processes_.size();
  return s;
}

void UnwindTables::Quarantine(bool rows, uint32_t first, uint32_t n) {
  if (n == 0) return;
  quarantine_.push_back({rows, first, n, NowNs()});
  if (rows) quarantined_rows_ += n;
}

void UnwindTables::ReleaseQuarantine(int64_t now_ns, int64_t quarantine_ns) {
  while (!quarantine_.empty() && now_ns - quarantine_.front().since_ns >= quarantine_ns) {
    const Quarantined& q = quarantine_.front();
    (q.rows ? rows_ : mappings_).Free(q.first, q.n);
    if (q.rows) quarantined_rows_ -= q.n;
    quarantine_.pop_front();
  }
}

bool UnwindTables::MakeRoom(uint32_t rows) {
  while (rows_.largest_free() < rows) {
    // Evict unused tables, least recently used first, until the free rows plus those waiting
    // for readers to finish could hold the table; then wait for a grace period and free them.
    // Fragmentation can make that not enough: then the loop goes on.
    while (rows_.free_count() + quarantined_rows_ < rows ||
           (quarantined_rows_ == 0 && rows_.largest_free() < rows)) {
      Table* victim = nullptr;
      for (auto& [key, t] : tables_) {
        if (t->refs == 0 && (victim == nullptr || t->last_used < victim->last_used)) {
          victim = t.get();
        }
      }
      if (victim == nullptr) break;
      for (const std::string& id : victim->identities) identity_to_key_.erase(id);
      ForgetFiles(victim);  // before its rows are freed: the quarantine covers readers
      Quarantine(true, victim->first, victim->count);
      stats_.table_bytes -= uint64_t{victim->count} * sizeof(ps_unwind_row);
      ++stats_.tables_evicted;
      tables_.erase(victim->key);
    }
    if (quarantined_rows_ == 0) return false;  // nothing left to free
    maps_->Synchronize();
    ReleaseQuarantine(INT64_MAX, 0);
  }
  return true;
}

UnwindTables::Table* UnwindTables::Insert(const std::string& key, UnwindTable&& t) {
  const uint32_t n = static_cast<uint32_t>(t.rows.size());
  std::optional<uint32_t> first = rows_.Allocate(n);
  if (!first && MakeRoom(n)) first = rows_.Allocate(n);
  if (!first) {
    ++stats_.budget_full;
    budget_failed_ = true;
    static RateLimitedLog log;
    log.Log(LogLevel::kWarning,
            "unwind: no room for a table of %d rows (budget %d bytes, in use %d): raise "
            "--unwind-table-bytes; its code is unwound with frame pointers",
            n, stats_.table_budget_bytes, stats_.table_bytes);
    return nullptr;
  }
  maps_->WriteRows(*first, t.rows);
  auto table = std::make_unique<Table>();
  table->key = key;
  table->first = *first;
  table->count = n;
  table->loads = std::move(t.loads);
  table->last_used = ++seq_;
  stats_.table_bytes += uint64_t{n} * sizeof(ps_unwind_row);
  ++stats_.tables_built;
  Table* out = table.get();
  tables_[key] = std::move(table);
  return out;
}

UnwindTables::Table* UnwindTables::VdsoTable() {
  static const std::string kKey = "vdso";
  if (auto it = tables_.find(kKey); it != tables_.end()) return it->second.get();
  if (failed_identity_.contains(kKey)) return nullptr;
  // The vDSO is the same image in every process of this kernel (man 7 vdso); the agent's own
  // copy is read in place. Its size: the [vdso] line of /proc/self/maps.
  uint64_t base = getauxval(AT_SYSINFO_EHDR);
  uint64_t size = 0;
  if (auto text = proc::ReadFileToString("/proc/self/maps"); text.ok()) {
    if (auto maps = proc::ParseMaps(*text); maps.ok()) {
      for (const auto& m : *maps) {
        if (m.path == "[vdso]") size = m.end - m.start;
      }
    }
  }
  if (base == 0 || size == 0) {
    failed_identity_[kKey] = seq_;
    return nullptr;
  }
  auto t = BuildTableFromMemory(reinterpret_cast<const void*>(base), size);
  if (!t.ok()) {
    failed_identity_[kKey] = seq_;
    ++stats_.unreadable;
    return nullptr;
  }
  return Insert(kKey, *std::move(t));
}

namespace {
// A file's identity for its table: device, inode, size and modification time.
std::string IdentityOf(const struct stat& st) {
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}
}  // namespace

UnwindTables::Table* UnwindTables::PinnedTable(const proc::PinnedFile& pinned, bool* failed) const {
  const std::string identity = IdentityOf(pinned.stat());
  *failed = false;
  if (auto it = identity_to_key_.find(identity); it != identity_to_key_.end()) {
    if (auto t = tables_.find(it->second); t != tables_.end()) return t->second.get();
  }
  *failed = failed_identity_.contains(identity);
  return nullptr;
}

bool UnwindTables::LoadsWithoutBuilding(const proc::ProcessInfo& snapshot) const {
  for (size_t i = 0; i < snapshot.maps.size(); ++i) {
    const proc::MapEntry& m = snapshot.maps[i];
    if (!m.executable() || !m.file_backed()) continue;  // [vdso] is not file-backed
    const proc::PinnedFile* pinned = i < snapshot.files.size() ? snapshot.files[i].get() : nullptr;
    if (pinned == nullptr) return false;
    bool failed = false;
    if (PinnedTable(*pinned, &failed) == nullptr && !failed) return false;
  }
  return true;
}

UnwindTables::Table* UnwindTables::TableFor(uint32_t tgid, const proc::MapEntry& m,
                                            const proc::PinnedFile* pinned) {
  if (m.path == "[vdso]") return VdsoTable();
  if (!m.file_backed()) return nullptr;
  // A pinned file seen before finds its table by the identity it had when pinned, with no
  // system call. Under process churn every image maps the same few files, and the dup, fstat
  // and close per mapping were a third to two thirds of a new image's table load on this kind
  // of VM (measured, 100 children of 20 ms: 117 -> 75 us per exec load, 255 -> 82 us per
  // follow-up load). The price: a library rewritten in place (same inode) while a pin of it
  // lives (ProcessTable shares pins by device, inode and path) keeps the old identity, so new
  // processes mapping it get the table of its old contents until the pin is released.
  // A file whose build failed (no CFI, unreadable) under the pinned identity: as above, no
  // system call. LoadsWithoutBuilding asks the same lookup, so its promise holds.
  if (pinned != nullptr) {
    bool failed = false;
    if (Table* t = PinnedTable(*pinned, &failed)) return t;
    if (failed) return nullptr;
  }
  // The file as the process sees it: map_files/ names the mapped file itself (also deleted or
  // replaced files, and in other mount namespaces; needs CAP_SYS_ADMIN), else the path under
  // the process's root (man 5 proc).
  int fd = pinned != nullptr ? dup(pinned->fd()) : -1;
  if (fd < 0) {
    std::string via_map_files =
        absl::StrFormat("%s/%d/map_files/%x-%x", proc_root_, tgid, m.start, m.end);
    fd = open(via_map_files.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  }
  if (fd < 0 && !m.deleted) {
    fd = open(absl::StrCat(proc_root_, "/", tgid, "/root", m.path).c_str(),
              O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  }
  if (fd < 0) {
    ++stats_.unreadable;
    return nullptr;
  }
  struct stat st {};
  if (fstat(fd, &st) != 0) {
    close(fd);
    ++stats_.unreadable;
    return nullptr;
  }
  const std::string identity = IdentityOf(st);
  if (auto it = identity_to_key_.find(identity); it != identity_to_key_.end()) {
    close(fd);
    auto t = tables_.find(it->second);
    if (t != tables_.end()) return t->second.get();
    identity_to_key_.erase(it);
    return nullptr;
  }
  if (failed_identity_.contains(identity)) {
    close(fd);
    return nullptr;
  }
  const auto t0 = std::chrono::steady_clock::now();
  absl::StatusOr<UnwindTable> t = BuildTableFromFile(absl::StrCat("/proc/self/fd/", fd));
  close(fd);
  stats_.build_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now() - t0)
                         .count();
  if (!t.ok()) {
    // What it may have parsed before failing (a table over PS_UNWIND_MAX_TABLE_ROWS fails after
    // the longest build there is; corrupt CFI fails where it is found), bounded by the file that
    // holds the CFI: a row per 4 bytes of it. Measured here, .eh_frame makes a row per 5.4-6.4
    // bytes and is 6-9% of its file (libc, libstdc++, python3.11), so the bound is generous.
    build_rows_ += static_cast<uint64_t>(st.st_size) / 4;
    if (failed_identity_.size() > 65536) failed_identity_.clear();
    failed_identity_[identity] = seq_;
    if (absl::IsNotFound(t.status())) {
      ++stats_.no_cfi;
    } else {
      ++stats_.unreadable;
      static RateLimitedLog log;
      log.Log(LogLevel::kWarning, "unwind: cannot read the CFI of %s (pid %d): %s", m.path, tgid,
              t.status().ToString());
    }
    return nullptr;
  }
  build_rows_ += t->rows.size();
  std::string key = t->build_id.empty() ? absl::StrCat("f:", identity) : absl::StrCat("b:", t->build_id);
  Table* table = nullptr;
  if (auto it = tables_.find(key); it != tables_.end()) {
    table = it->second.get();  // the same build in another file (container layers, copies)
  } else {
    table = Insert(key, *std::move(t));
    if (table == nullptr) return nullptr;
  }
  if (identity_to_key_.size() >= 65536) {
    // A cache: files seen again are reopened and find their table by build id.
    identity_to_key_.clear();
    for (auto& [k, t] : tables_) t->identities.clear();
  }
  identity_to_key_[identity] = key;
  table->identities.push_back(identity);
  EnterFile(table, m, st);
  return table;
}

void UnwindTables::EnterFile(Table* table, const proc::MapEntry& m, const struct stat& st) {
  if (!maps_->has_files()) return;
  const UnwindTable::Segment* exec = nullptr;
  for (const UnwindTable::Segment& s : table->loads) {
    if (!s.exec) continue;
    if (exec != nullptr) return;  // several executable segments: no single bias
    exec = &s;
  }
  if (exec == nullptr) return;
  ps_unwind_file value{};
  value.seg_offset = exec->offset;
  value.seg_vaddr = exec->vaddr;
  value.seg_filesz = exec->filesz;
  value.first = table->first;
  value.count = table->count;
  value.size = static_cast<uint64_t>(st.st_size);
  // The kernel's dev_t: MKDEV(major, minor) = major << 20 | minor (include/linux/kdev_t.h), as
  // the walker reads i_sb->s_dev; /proc/<pid>/maps prints major:minor of the same.
  auto kdev = [](uint64_t major_, uint64_t minor_) { return (major_ << 20) | minor_; };
  ps_unwind_file_key keys[2] = {{kdev(m.dev_major, m.dev_minor), m.inode},
                                {kdev(major(st.st_dev), minor(st.st_dev)), st.st_ino}};
  for (int i = 0; i < 2; ++i) {
    const ps_unwind_file_key& k = keys[i];
    if (i == 1 && k.dev == keys[0].dev && k.ino == keys[0].ino) break;
    auto it = files_.find(k);
    if (it != files_.end() && it->second == table) continue;  // entered already
    if (it == files_.end() && files_.size() >= PS_UNWIND_FILE_ENTRIES) {
      ++stats_.files_full;
      continue;
    }
    if (!maps_->SetFile(k, value).ok()) {
      ++stats_.files_full;
      continue;
    }
    if (it != files_.end()) {
      it->second = table;  // the file changed in place: the newest table
    } else {
      files_.emplace(k, table);
    }
    table->file_keys.push_back(k);
  }
  stats_.files = files_.size();
}

void UnwindTables::ForgetFiles(Table* table) {
  for (const ps_unwind_file_key& k : table->file_keys) {
    auto it = files_.find(k);
    if (it == files_.end() || it->second != table) continue;  // another table's now
    maps_->DeleteFile(k);
    files_.erase(it);
  }
  table->file_keys.clear();
  stats_.files = files_.size();
}

void UnwindTables::Unref(Table* t) {
  if (t != nullptr && t->refs > 0) --t->refs;
}

void UnwindTables::ForgetGone(uint32_t tgid, uint64_t start_ticks) {
  ++stats_.process_gone;
  if (auto it = processes_.find(tgid);
      it != processes_.end() && it->second.start_ticks == start_ticks) {
    DropProcess(tgid, it->second);
    processes_.erase(it);
  }
}

void UnwindTables::DropProcess(uint32_t tgid, Process& p) {
  maps_->DeleteProcess(tgid);
  Quarantine(false, p.map_first, p.map_count);
  for (Table* t : p.tables) Unref(t);
  p.tables.clear();
}

absl::Status UnwindTables::LoadProcess(uint32_t tgid, uint64_t start_ticks, uint32_t exec_id,
                                       const proc::ProcessInfo* snapshot) {
  // A snapshot was checked to be this process's when it was taken (ProcessTable::ReadMaps reads
  // the start time after the maps); without one the start time is read here, before and after.
  absl::StatusOr<uint64_t> ticks =
      snapshot != nullptr && start_ticks != 0 ? start_ticks : StartTicks(proc_root_, tgid);
  auto gone = [&](absl::Status s) {
    ++stats_.process_gone;
    // Forget the entry only if it is not the live process's (a stale event for an old one).
    absl::StatusOr<uint64_t> now_ticks = StartTicks(proc_root_, tgid);
    if (auto it = processes_.find(tgid);
        it != processes_.end() && (!now_ticks.ok() || *now_ticks != it->second.start_ticks)) {
      DropProcess(tgid, it->second);
      processes_.erase(it);
    }
    return s;
  };
  if (!ticks.ok()) return gone(ticks.status());
  if (start_ticks != 0 && *ticks != start_ticks) {
    return gone(absl::NotFoundError(absl::StrCat("pid ", tgid, " is another process now")));
  }
  start_ticks = *ticks;
  std::vector<proc::MapEntry> entries;
  if (snapshot != nullptr) {
    entries = snapshot->maps;
  } else {
    absl::StatusOr<std::string> text =
        proc::ReadFileToString(absl::StrCat(proc_root_, "/", tgid, "/maps"));
    if (!text.ok()) return gone(text.status());
    PS_ASSIGN_OR_RETURN(entries, proc::ParseMaps(*text));
  }

  std::vector<ps_unwind_mapping> out;
  std::vector<Table*> refs;
  budget_failed_ = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    const proc::MapEntry& m = entries[i];
    if (!m.executable()) continue;
    if (out.size() >= PS_UNWIND_MAX_MAPPINGS) {
      ++stats_.mappings_full;
      break;
    }
    ps_unwind_mapping um{};
    um.start = m.start;
    um.end = m.end;
    um.state = PS_TABLE_NONE;
    const proc::PinnedFile* pinned =
        snapshot != nullptr && i < snapshot->files.size() ? snapshot->files[i].get() : nullptr;
    if (Table* t = TableFor(tgid, m, pinned)) {
      uint64_t bias;
      if (UnwindTable::MappingBias(t->loads, m.start, m.end - m.start, m.offset, &bias)) {
        um.bias = bias;
        um.first = t->first;
        um.count = t->count;
        um.state = PS_TABLE_READY;
        t->last_used = ++seq_;
        ++t->refs;
        refs.push_back(t);
      }
    }
    out.push_back(um);
  }
  // Maps read here are the process's only if it is still the same process (pid reuse
  // meanwhile). A snapshot's were checked when it was taken (ProcessTable::ReadMaps): a process
  // that exited since is loaded all the same and leaves an entry the walker never matches (it
  // checks the start time) until SweepExited (10 s; the new-image budget bounds how many), and
  // two /proc reads (6 system calls per exec'd process) are saved.
  if (snapshot == nullptr) {
    absl::StatusOr<uint64_t> again = StartTicks(proc_root_, tgid);
    if (!again.ok() || *again != start_ticks) {
      for (Table* t : refs) Unref(t);
      return gone(absl::NotFoundError(absl::StrCat("pid ", tgid, " exited while being read")));
    }
  }
  const uint32_t n = static_cast<uint32_t>(out.size());
  std::optional<uint32_t> first = mappings_.Allocate(n);
  if (!first) {
    ReleaseQuarantine(NowNs());
    first = mappings_.Allocate(n);
  }
  if (!first) {
    for (Table* t : refs) Unref(t);
    ++stats_.mappings_full;
    return absl::ResourceExhaustedError("unwind mapping slots exhausted");
  }
  maps_->WriteMappings(*first, out);
  ps_unwind_proc proc{start_ticks, *first, n, exec_id, 0};
  absl::Status s = maps_->SetProcess(tgid, proc);
  if (!s.ok() && !processes_.contains(tgid) && NowNs() - last_full_sweep_ns_ >= 10000000000) {
    last_full_sweep_ns_ = NowNs();
    SweepExited();  // the process map may be full of exited processes
    s = maps_->SetProcess(tgid, proc);
  }
  if (!s.ok()) {
    mappings_.Free(*first, n);
    for (Table* t : refs) Unref(t);
    return s;
  }
  // The walker has the process's list now: its vma cache (the image's first walks) goes, before
  // a range in it could be unmapped and reused by another file.
  maps_->DeleteVmaCache(tgid);
  Process& p = processes_[tgid];
  if (p.map_count > 0 || !p.tables.empty()) {
    Quarantine(false, p.map_first, p.map_count);
    for (Table* t : p.tables) Unref(t);
  }
  if (p.start_ticks != start_ticks || p.exec_id != exec_id) p.loads = 0;
  ++p.loads;
  p.start_ticks = start_ticks;
  p.exec_id = exec_id;
  p.map_first = *first;
  p.map_count = n;
  p.tables = std::move(refs);
  p.last_refresh_ns = NowNs();
  p.incomplete = budget_failed_;
  ++stats_.process_loads;
  return absl::OkStatus();
}

void UnwindTables::RetryIncomplete(int64_t now_ns, int64_t min_interval_ns) {
  std::vector<std::pair<uint32_t, uint64_t>> todo;
  for (const auto& [tgid, p] : processes_) {
    if (p.incomplete && now_ns - p.last_refresh_ns >= min_interval_ns) {
      todo.emplace_back(tgid, p.start_ticks);
    }
  }
  for (const auto& [tgid, ticks] : todo) (void)LoadProcess(tgid, ticks);
}

bool UnwindTables::RefreshDue(uint32_t tgid, uint64_t start_ticks, int64_t now_ns,
                              int64_t min_interval_ns) const {
  auto it = processes_.find(tgid);
  if (it == processes_.end() || it->second.start_ticks != start_ticks) return true;
  // A new image maps its libraries in its first milliseconds (ld.so after exec): its first
  // reloads are allowed at once, later ones at the rate.
  const int64_t interval = it->second.loads < kQuickReloads ? kQuickReloadNs : min_interval_ns;
  return now_ns - it->second.last_refresh_ns >= interval;
}

absl::Status UnwindTables::RefreshProcess(uint32_t tgid, uint64_t start_ticks, int64_t now_ns,
                                          int64_t min_interval_ns) {
  if (!RefreshDue(tgid, start_ticks, now_ns, min_interval_ns)) return absl::OkStatus();
  return LoadProcess(tgid, start_ticks);
}

void UnwindTables::SweepExited() {
  // The tgids alive now: proc(5) lists one directory per process (not per thread).
  absl::flat_hash_set<uint32_t> listed;
  DIR* dir = opendir(proc_root_.c_str());
  if (dir == nullptr) return;  // keep everything: nothing is known to be gone
  // readdir(3) returns null at the end and on an error, telling them apart by errno only: a
  // listing cut short by an error would call every process after the cut gone.
  for (;;) {
    errno = 0;
    const dirent* e = readdir(dir);
    if (e == nullptr) {
      const bool failed = errno != 0;
      closedir(dir);
      if (failed) return;  // keep everything, as above
      break;
    }
    uint32_t tgid;
    if (absl::SimpleAtoi(e->d_name, &tgid)) listed.insert(tgid);
  }
  const bool verify = ++sweeps_ % kVerifyEverySweeps == 0;
  for (auto it = processes_.begin(); it != processes_.end();) {
    bool gone = !listed.contains(it->first);
    if (!gone && verify) {
      absl::StatusOr<uint64_t> ticks = StartTicks(proc_root_, it->first);
      gone = !ticks.ok() || *ticks != it->second.start_ticks;
    }
    if (gone) {
      DropProcess(it->first, it->second);
      processes_.erase(it++);
    } else {
      ++it;
    }
  }
}

void UnwindTables::LoadAll() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(proc_root_, ec)) {
    uint32_t tgid;
    if (!absl::SimpleAtoi(e.path().filename().string(), &tgid) || tgid == 0) continue;
    // Kernel threads have no executable mapping: an empty list.
    absl::Status s = LoadProcess(tgid);
    if (absl::IsResourceExhausted(s) || (!s.ok() && !absl::IsNotFound(s) &&
                                        processes_.size() >= maps_->process_capacity())) {
      break;  // the process map or the mapping slots are full: the rest load on demand
    }
  }
}

// ---- UnwindService ----

UnwindService::UnwindService(std::unique_ptr<UnwindMaps> maps, Poller poll, std::string proc_root,
                             proc::ProcessTable* processes, std::function<void()> wake)
    : maps_(std::move(maps)),
      poll_(std::move(poll)),
      wake_(std::move(wake)),
      processes_(processes),
      proc_root_(proc_root),
      tables_(maps_.get(), std::move(proc_root)) {}

UnwindService::~UnwindService() { Stop(); }

void UnwindService::Start(const std::vector<uint32_t>& tgids, bool preload) {
  if (preload) {
    std::lock_guard<std::mutex> l(mu_);
    if (tgids.empty()) {
      tables_.LoadAll();
    } else {
      for (uint32_t t : tgids) (void)tables_.LoadProcess(t);
    }
  }
  table_thread_ = std::thread([this] {
    NameThisThread("ps-unwind-table");
    TableLoop();
  });
  claim_thread_ = std::thread([this] {
    NameThisThread("ps-unwind-claim");
    ClaimLoop();
  });
  thread_ = std::thread([this] {
    NameThisThread("ps-unwind-poll");
    PollLoop();
  });
}

void UnwindService::Stop() {
  stop_ = true;
  // Taking each mutex orders the store before a waiter's next predicate check: without it a
  // waiter that checked stop_ just before the store would miss this notification (the claim
  // thread waits with no timeout).
  { std::lock_guard<std::mutex> l(queue_mu_); }
  { std::lock_guard<std::mutex> l(claim_mu_); }
  queue_cv_.notify_all();
  claim_cv_.notify_all();
  if (wake_) wake_();  // after the store: the poll thread checks stop_ when poll returns
  if (thread_.joinable()) thread_.join();
  if (claim_thread_.joinable()) claim_thread_.join();
  if (table_thread_.joinable()) table_thread_.join();
}

void UnwindService::ClaimLoop() {
  std::deque<ps_unwind_event> batch;
  while (!stop_) {
    {
      // No timeout: claims and Stop notify; a tick would wake an idle agent 10 times a second.
      std::unique_lock<std::mutex> l(claim_mu_);
      claim_cv_.wait(l, [this] { return stop_ || !claims_.empty(); });
      batch.swap(claims_);
    }
    for (const ps_unwind_event& e : batch) {
      if (stop_) break;
      Work w{e, nullptr};
      const proc::ProcessKey key{e.tgid, e.tgid_start_ns, e.exec_id};
      // Queued maybe seconds ago: an exec since makes /proc show another image (a snapshot
      // taken across an exec remains possible, in a window of one maps read).
      if (Superseded(key)) continue;
      if (processes_ != nullptr && !processes_->HasSnapshot(key)) {
        auto s = processes_->Snapshot(key);
        Log(LogLevel::kDebug, "process %d (exec %d): snapshot after its claim: %s", e.tgid,
            e.exec_id,
            s.ok() ? absl::StrCat((*s)->maps.size(), " mappings") : s.status().ToString());
        if (s.ok()) w.snapshot = *std::move(s);
      }
      std::lock_guard<std::mutex> l(queue_mu_);
      if (queue_.size() >= kMaxQueued) {
        ++dropped_;
        continue;
      }
      w.queued_ns = MonotonicNowNs();
      queue_.push_back(std::move(w));
      queue_cv_.notify_one();
    }
    batch.clear();
  }
}

UnwindTableStats UnwindService::stats() const {
  UnwindTableStats s;
  {
    std::lock_guard<std::mutex> l(mu_);
    s = tables_.stats();
  }
  s.exec_snapshots_shed = exec_shed_.load(std::memory_order_relaxed);
  s.exec_snapshot_cpu_ns = exec_cpu_ns_.load(std::memory_order_relaxed);
  s.exec_forgiven_cpu_ns = exec_forgiven_ns_.load(std::memory_order_relaxed);
  s.exec_capped_cpu_ns = exec_capped_ns_.load(std::memory_order_relaxed);
  s.exec_inline_loads = inline_loads_.load(std::memory_order_relaxed);
  return s;
}

namespace {
// CPU time of the calling thread, ns (clock_gettime(2), CLOCK_THREAD_CPUTIME_ID).
int64_t ThreadCpuNs() {
  struct timespec ts {};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}
}  // namespace

bool UnwindService::ExecBudgetLeft(int64_t now_ns) {
  if (exec_refill_ns_ != 0 && now_ns > exec_refill_ns_) {
    const int64_t add = static_cast<int64_t>(static_cast<__int128>(now_ns - exec_refill_ns_) *
                                             kExecRefillNsPerS / 1000000000);
    int64_t have = exec_tokens_ns_.load(std::memory_order_relaxed);
    while (!exec_tokens_ns_.compare_exchange_weak(have, std::min(kExecBurstNs, have + add))) {
    }
  }
  exec_refill_ns_ = now_ns;
  return exec_tokens_ns_.load(std::memory_order_relaxed) > 0;
}

void UnwindService::ChargeExec(int64_t measured_ns, int64_t cap_ns) {
  exec_cpu_ns_.fetch_add(measured_ns, std::memory_order_relaxed);
  int64_t spent_ns = measured_ns;
  if (spent_ns > cap_ns) {
    exec_capped_ns_.fetch_add(static_cast<uint64_t>(spent_ns - cap_ns), std::memory_order_relaxed);
    spent_ns = cap_ns;
  }
  // The debt stops at one burst: a load that builds the table of a big new file (seconds, once
  // per file) would otherwise shed every new image for minutes after it.
  int64_t have = exec_tokens_ns_.load(std::memory_order_relaxed);
  while (!exec_tokens_ns_.compare_exchange_weak(have,
                                                std::max(-kExecBurstNs, have - spent_ns))) {
  }
  const int64_t forgiven = -kExecBurstNs - (have - spent_ns);  // > 0: below the floor
  if (forgiven > 0) {
    exec_forgiven_ns_.fetch_add(static_cast<uint64_t>(std::min(forgiven, spent_ns)),
                                std::memory_order_relaxed);
  }
}

namespace {
// True when an image's executable mappings are those of a dynamically linked program whose
// libraries ld.so has not mapped yet: exactly two files, the program and its interpreter
// (ld-linux-*.so, ld-musl-*.so; named by PT_INTERP, System V gABI "Program Interpreter").
bool AwaitsLibraries(const proc::ProcessInfo& info) {
  absl::flat_hash_set<std::string> files;
  bool interpreter = false;
  for (const proc::MapEntry& m : info.maps) {
    if (m.inode == 0 || m.path.empty() || m.path[0] != '/') continue;
    files.insert(m.path);
    absl::string_view base = m.path;
    base.remove_prefix(base.rfind('/') + 1);
    if (absl::StartsWith(base, "ld-linux") || absl::StartsWith(base, "ld-musl") ||
        absl::StartsWith(base, "ld64.so") || absl::StartsWith(base, "ld.so")) {
      interpreter = true;
    }
  }
  return interpreter && files.size() == 2;
}
}  // namespace

void UnwindService::ScheduleFollowUp(const proc::ProcessInfo& snapshot, uint32_t tries,
                                     int64_t now_ns) {
  // ld.so maps the libraries in the image's first millisecond or so: the snapshot is taken
  // again 1, 3 and 7 ms after the exec's (1 ms, then twice the previous wait).
  constexpr int64_t kFollowUpNs = 1000000;
  constexpr uint32_t kMaxFollowUpTries = 3;
  if (!AwaitsLibraries(snapshot)) return;
  if (tries >= kMaxFollowUpTries) return;  // ld.so is slow: the walker's requests take over
  if (follow_ups_.size() >= kMaxFollowUps) {
    ++follow_ups_dropped_;
    return;
  }
  follow_ups_.push_back({snapshot.key, now_ns + (kFollowUpNs << tries), tries + 1,
                         snapshot.exe_path});
}

bool UnwindService::AwaitsExec(const ps_unwind_event& e) const {
  if (e.kind != PS_UNWIND_EVENT_NEW_PROCESS) return false;
  {
    std::lock_guard<std::mutex> l(exec_mu_);
    auto it = latest_exec_.find(e.tgid);
    // An image that came from a known exec (or one a later exec superseded) is not a fork child
    // before its exec.
    if (it != latest_exec_.end() && it->second.start_boot_ns == e.tgid_start_ns &&
        static_cast<int32_t>(it->second.exec_id - e.exec_id) >= 0) {
      return false;
    }
  }
  return processes_ == nullptr ||
         !processes_->HasSnapshot(proc::ProcessKey{e.tgid, e.tgid_start_ns, e.exec_id});
}

bool UnwindService::Superseded(const proc::ProcessKey& key) const {
  std::lock_guard<std::mutex> l(exec_mu_);
  auto it = latest_exec_.find(key.tgid);
  return it != latest_exec_.end() && it->second.start_boot_ns == key.start_boot_ns &&
         static_cast<int32_t>(it->second.exec_id - key.exec_id) > 0;
}

void UnwindService::PollLoop() {
  // Snapshots for images that report unknown pcs (libraries loaded since): at once for the first
  // few (ld.so maps libc and friends right after exec), then at most every 0.2 s.
  constexpr int64_t kSnapshotRefreshNs = 200000000;
  constexpr uint32_t kQuickSnapshots = 4;
  std::vector<ps_unwind_event> batch;
  bool paused = false;  // the last round ended in the shed pause below
  // A round that had new images to handle (read or shed) is charged its whole thread CPU time
  // (end_round): the wake-up that brought the events, the ring buffer, the waits and the
  // hand-off to TableLoop, not only the snapshots. Under continuous churn that was half of
  // this thread's CPU, beyond the budget (perf: a wake-up and a context switch cost 20-50 us
  // on this kind of VM). Measured from the end of the previous round, so the pause below and
  // the wake-up after it are in it. A round that only sheds is charged too (the walker repeats
  // a shed process's request while it runs, at most every 0.1 s per CPU): that is what churn
  // costs this thread, and the debt it adds lengthens the pause.
  int64_t round_cpu0 = ThreadCpuNs();
  int64_t charged = 0;      // of this round: charged as it went (snapshots, loads), or left out
  bool new_images = false;  // this round had new images (EXEC, NEW_PROCESS) or follow-ups
  auto charge = [&](int64_t ns) {
    ChargeExec(ns);
    charged += ns;
  };
  auto end_round = [&] {
    const int64_t cpu = ThreadCpuNs();
    if (new_images) ChargeExec(std::max<int64_t>(0, cpu - round_cpu0 - charged));
    round_cpu0 = cpu;
    charged = 0;
    new_images = false;
  };
  while (!stop_) {
    batch.clear();
    // Without a wake-up for Stop, a 100 ms timeout to see it; with one, until an event or the
    // next follow-up (-1: none due).
    int timeout_ms = wake_ ? -1 : 100;
    int64_t now = MonotonicNowNs();
    for (const FollowUp& f : follow_ups_) {
      const int64_t due_ms = std::max<int64_t>(0, (f.due_ns - now + 999999) / 1000000);
      if (timeout_ms < 0 || due_ms < timeout_ms) {
        timeout_ms = static_cast<int>(std::min<int64_t>(due_ms, 3600000));
      }
    }
    int rc = poll_(timeout_ms, [&](const ps_unwind_event& e) { batch.push_back(e); });
    if (rc < 0 && rc != -EINTR) {
      static RateLimitedLog log;
      log.Log(LogLevel::kWarning, "unwind: polling the table requests failed: %s",
              std::strerror(-rc));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // The latest image of each process, from the kernel's exec events in arrival order (the
    // last one wins): a follow-up of an older image is void (it would read the new image's maps
    // under the old identity).
    auto record_execs = [&](size_t from) {
      std::lock_guard<std::mutex> l(exec_mu_);
      for (size_t i = from; i < batch.size(); ++i) {
        const ps_unwind_event& e = batch[i];
        if (e.kind != PS_UNWIND_EVENT_EXEC) continue;
        if (latest_exec_.size() >= kMaxLatestExecs) latest_exec_.clear();
        latest_exec_[e.tgid] = {e.tgid_start_ns, e.exec_id};
      }
    };
    record_execs(0);
    // A process the walker met before its exec event came is most often a fork child about to
    // exec (a shell running a command): by the time /proc is read it shows the new image, whose
    // maps would be filed under the old one's identity and read again at its exec event.
    // Measured, 1000 `/bin/true` run by sh: 807 NEW_PROCESS snapshots, nearly all of them
    // 2-mapping reads of the exec'd image. The exec follows the fork child's first switch
    // within a millisecond, so a batch holding such a request (AwaitsExec) waits that long for
    // it: the events then share a batch, and the old image's request is superseded
    // (Superseded). Not while new images are shed (the request would not be read anyway), nor
    // after a shed pause (the batch spans the pause, exec events included): under continuous
    // churn a second sleep per round raised the poll thread's switches from 10k to 14-18k per
    // 30 s.
    new_images = std::any_of(batch.begin(), batch.end(), [](const ps_unwind_event& e) {
      return e.kind == PS_UNWIND_EVENT_EXEC || e.kind == PS_UNWIND_EVENT_NEW_PROCESS;
    });
    if (!stop_ && !paused &&
        std::any_of(batch.begin(), batch.end(),
                    [this](const ps_unwind_event& e) { return AwaitsExec(e); }) &&
        ExecBudgetLeft(MonotonicNowNs())) {
      const size_t drained = batch.size();
      std::this_thread::sleep_for(std::chrono::nanoseconds(kExecWaitNs));
      poll_(0, [&](const ps_unwind_event& e) { batch.push_back(e); });
      record_execs(drained);
    }
    now = MonotonicNowNs();
    const int64_t handling_start = now;
    // Exec events first: a new image's maps must be read while it lives (a 20 ms process).
    // Stable: the exec events keep their arrival order (latest_exec_ above took the last).
    auto execs_end = std::stable_partition(
        batch.begin(), batch.end(),
        [](const ps_unwind_event& e) { return e.kind == PS_UNWIND_EVENT_EXEC; });
    // After a shed pause the batch holds the execs of the whole pause, the oldest of them
    // likely gone: the newest first, so the budget the pause refilled reads a process that
    // still lives rather than failing on the exited ones (a failed snapshot is cheap, so the
    // refill is spent on the first live one either way). After latest_exec_ is recorded.
    if (paused) std::reverse(batch.begin(), execs_end);
    paused = false;
    std::vector<Work> work;
    work.reserve(batch.size());
    // Due follow-ups: a forced snapshot and load of their image, if it still runs the program
    // it ran (its exe link unchanged, no later exec seen).
    for (size_t i = 0; processes_ != nullptr && i < follow_ups_.size();) {
      if (follow_ups_[i].due_ns > now) {
        ++i;
        continue;
      }
      FollowUp f = std::move(follow_ups_[i]);
      follow_ups_[i] = std::move(follow_ups_.back());
      follow_ups_.pop_back();
      if (Superseded(f.key)) continue;
      if (!ExecBudgetLeft(now)) continue;  // its exec was read: not shed, only not re-read
      new_images = true;
      const int64_t cpu0 = ThreadCpuNs();
      absl::Cleanup charge_follow_up = [&] { charge(ThreadCpuNs() - cpu0); };
      char exe[PATH_MAX];
      const std::string link = absl::StrCat(proc_root_, "/", f.key.tgid, "/exe");
      const ssize_t n = readlink(link.c_str(), exe, sizeof(exe));
      if (n <= 0 || absl::string_view(exe, n) != f.exe_path) continue;
      auto snap = processes_->Snapshot(f.key);
      if (!snap.ok()) continue;
      Work w{{}, *std::move(snap)};
      w.event.tgid = f.key.tgid;
      w.event.kind = kFollowUpEvent;
      w.event.tgid_start_ns = f.key.start_boot_ns;
      w.event.exec_id = f.key.exec_id;
      ScheduleFollowUp(*w.snapshot, f.tries, now);
      work.push_back(std::move(w));
    }
    if (batch.empty() && work.empty()) {
      end_round();
      continue;
    }
    for (const ps_unwind_event& e : batch) {
      Work w{e, nullptr};
      const proc::ProcessKey key{e.tgid, e.tgid_start_ns, e.exec_id};
      // An event of an image replaced by an exec in this batch or before (a sample just before
      // the exec, or the first of two quick execs as in `sh -c 'exec prog'`): its maps are gone,
      // and reading /proc now would file the new image's maps under the old identity, for the
      // symbolizer and the unwind tables alike. The newest exec is never superseded (strict >).
      if (Superseded(key)) continue;
      if (e.kind == PS_UNWIND_EVENT_CLAIM) {
        std::lock_guard<std::mutex> l(claim_mu_);
        if (claims_.size() >= kMaxQueued) {
          ++dropped_;
        } else {
          claims_.push_back(e);
          claim_cv_.notify_one();
        }
        continue;
      }
      // A new image (an exec, or a process the walker met first: a fork child, one whose exec
      // was shed) past the budget: no snapshot, and no table load (it would read the maps).
      const bool new_image =
          e.kind == PS_UNWIND_EVENT_EXEC || e.kind == PS_UNWIND_EVENT_NEW_PROCESS;
      if (new_image && !ExecBudgetLeft(now)) {
        // Counted once per image: the walker repeats its request while the process runs.
        if (shed_images_.size() >= kMaxImageEntries) shed_images_.clear();
        if (shed_images_.insert(key).second) exec_shed_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      const int64_t cpu0 = new_image ? ThreadCpuNs() : 0;
      if (processes_ != nullptr) {
        bool take;
        if (e.kind == PS_UNWIND_EVENT_UNKNOWN_PC) {
          SnapshotRate& r = snapshot_rate_[key];
          take = now - r.last_ns >= (r.count < kQuickSnapshots ? 0 : kSnapshotRefreshNs);
        } else {
          take = e.kind == PS_UNWIND_EVENT_EXEC || !processes_->HasSnapshot(key);
        }
        if (take) {
          // A known image's re-read (a library loaded since) is not new-image work: its CPU
          // is left out of the round's charge.
          const int64_t snapshot_cpu0 = new_image ? 0 : ThreadCpuNs();
          absl::Cleanup leave_out = [&] {
            if (!new_image) charged += ThreadCpuNs() - snapshot_cpu0;
          };
          if (snapshot_rate_.size() >= kMaxImageEntries) snapshot_rate_.clear();
          SnapshotRate& r = snapshot_rate_[key];
          r.last_ns = now;
          ++r.count;
          auto s = processes_->Snapshot(key);
          Log(LogLevel::kDebug, "process %d (exec %d): snapshot after event %d: %s", e.tgid,
              e.exec_id, e.kind,
              s.ok() ? absl::StrCat((*s)->maps.size(), " mappings") : s.status().ToString());
          if (s.ok()) {
            w.snapshot = *std::move(s);
            if (e.kind == PS_UNWIND_EVENT_EXEC) ScheduleFollowUp(*w.snapshot, 0, now);
          } else {
            w.gone = absl::IsNotFound(s.status());
          }
        }
      }
      if (new_image) charge(ThreadCpuNs() - cpu0);
      work.push_back(std::move(w));
    }
    // A new image whose every file's table is loaded already (a short-lived process of a
    // program run before: under churn, nearly all) is loaded here, in tens of microseconds,
    // rather than handed to TableLoop: the hand-off's futex wake and TableLoop's wake-up cost
    // more on this kind of VM than the load. So is one whose snapshot found it gone (its entry
    // forgotten). Only while TableLoop holds no work (mu_ free, the queue empty and no batch
    // taken from it) so that the loads keep their order: TableLoop may be building a big file's
    // table for seconds, and then this thread must not wait on it. A load here can still run
    // long in one case: the BPF process map full, when LoadProcess sweeps /proc for exited
    // processes (at most every 10 s). TableLoop's housekeeping (ReleaseQuarantine) then runs on
    // its 1 s tick rather than after each load: freed mapping slots wait up to 2 s, not 1 s.
    // Requires mu_ (HandleWork's tables_ and retry_after_).
    auto exec_or_follow_up = [](const Work& w) {
      return w.event.kind == PS_UNWIND_EVENT_EXEC || w.event.kind == kFollowUpEvent;
    };
    auto inlinable = [this, &exec_or_follow_up](const Work& w) {
      return exec_or_follow_up(w) &&
             (w.gone || (w.snapshot != nullptr && tables_.LoadsWithoutBuilding(*w.snapshot)));
    };
    size_t inlined = 0;
    if (!work.empty() && exec_or_follow_up(work[0])) {
      std::unique_lock<std::mutex> tl(mu_, std::try_to_lock);
      bool idle = false;
      if (tl.owns_lock()) {
        std::lock_guard<std::mutex> q(queue_mu_);
        idle = queue_.empty() && !batch_taken_;
      }
      for (; idle && inlined < work.size() && inlinable(work[inlined]); ++inlined) {
        int loads = 0;
        int64_t spent = 0;
        HandleWork(work[inlined], now, &spent, &loads);
        charged += spent;  // charged to the budget by HandleWork
        inline_loads_ += loads;
      }
    }
    {
      std::lock_guard<std::mutex> l(queue_mu_);
      const int64_t queued = MonotonicNowNs();
      for (size_t i = inlined; i < work.size(); ++i) {
        Work& w = work[i];
        if (queue_.size() >= kMaxQueued) {
          ++dropped_;
          continue;
        }
        w.queued_ns = queued;
        queue_.push_back(std::move(w));
      }
    }
    if (inlined < work.size()) queue_cv_.notify_one();
    // Past the new-image budget nothing here is urgent (new images are shed): a pause lets the
    // events arrive together. Measured, 3000 /bin/true exec'd and reaped back to back: 6164
    // wake-ups for 7801 events without a pause, 2300 with 2 ms; the unwinder's threads
    // 0.55-0.8 ms -> 0.2-0.4 ms of CPU per process. The pause lasts until the bucket has
    // refilled what it owes (no exec can be read before), 2 to 20 ms: under continuous churn a
    // wake-up, a context switch, was most of the poll thread's CPU (perf: 29% of its samples
    // in the hypervisor's irq-enable after a switch at 2 ms). Within the budget an exec is read
    // at once, while a short-lived process still lives.
    // The bucket is refilled first (ExecBudgetLeft): a batch of other events after a quiet
    // spell must not read an old debt and pause for nothing. The round is charged first, so
    // the pause repays all of it.
    end_round();
    if (!batch.empty() && !ExecBudgetLeft(MonotonicNowNs())) {
      const int64_t have = exec_tokens_ns_.load(std::memory_order_relaxed);
      const int64_t refill_ns =
          static_cast<int64_t>(static_cast<__int128>(-have) * 1000000000 / kExecRefillNsPerS);
      std::this_thread::sleep_for(
          std::chrono::nanoseconds(std::clamp<int64_t>(refill_ns + 100000, 2000000, 20000000)));
      paused = true;
    }
    const int64_t handled_ns = MonotonicNowNs() - handling_start;
    if (handled_ns > 5000000) {
      Log(LogLevel::kDebug, "unwind: %d events and %d follow-ups took %.1f ms", batch.size(),
          work.size(), handled_ns / 1e6);
    }
  }
}

void UnwindService::HandleWork(const Work& w, int64_t now, int64_t* charged, int* loads) {
  constexpr int64_t kRefreshNs = 200000000;  // a process's maps re-read at most every 0.2 s
  // An image whose load failed, or whose snapshot found it gone, is not loaded again for 0.4 s
  // unless it execs (one image, one failure counted).
  auto retry_later = [&](uint32_t tgid) {
    if (retry_after_.size() >= kMaxImageEntries) retry_after_.clear();
    retry_after_[tgid] = now + kRefreshNs * 2;
  };
  const ps_unwind_event& e = w.event;
  uint64_t ticks = e.tgid_start_ns / PS_NS_PER_TICK;
  // A known image needs nothing; another image of a known process (an exec whose event was
  // lost or folded into another's) is reloaded.
  if ((e.kind == PS_UNWIND_EVENT_NEW_PROCESS || e.kind == PS_UNWIND_EVENT_CLAIM) &&
      tables_.KnownImage(e.tgid, ticks, e.exec_id)) {
    return;
  }
  // A claim only adopts an entry read from /proc: one that now holds another image's list
  // (an exec came between the claim and here) stays, and so does a process forgotten since.
  if (e.kind == PS_UNWIND_EVENT_CLAIM) return;
  if (auto it = retry_after_.find(e.tgid); it != retry_after_.end()) {
    if (now < it->second && e.kind != PS_UNWIND_EVENT_EXEC && e.kind != kFollowUpEvent) {
      return;
    }
    retry_after_.erase(it);
  }
  // After an exec the old image's mappings are wrong: reload whatever the rate.
  const bool load = e.kind == PS_UNWIND_EVENT_EXEC || e.kind == kFollowUpEvent ||
                    e.kind == PS_UNWIND_EVENT_NEW_PROCESS || e.kind == PS_UNWIND_EVENT_CLAIM ||
                    tables_.RefreshDue(e.tgid, ticks, now, kRefreshNs);
  if (!load) return;
  // The snapshot (read when the event arrived) is used if it is this image's; a later
  // event's maps are read here.
  const bool exec_work = e.kind == PS_UNWIND_EVENT_EXEC || e.kind == kFollowUpEvent ||
                         e.kind == PS_UNWIND_EVENT_NEW_PROCESS;
  // The snapshot found the image gone: reading /proc again here would find it gone too
  // (two stat reads), under churn for most short-lived processes.
  // Its later requests in this batch or the next 0.4 s are skipped as after a failed load
  // (one image, one process_gone), and an entry of the dead process itself goes now.
  if (w.gone) {
    tables_.ForgetGone(e.tgid, ticks);
    retry_later(e.tgid);
    return;
  }
  const int64_t cpu0 = ThreadCpuNs();
  const uint64_t build_rows0 = tables_.build_rows();
  absl::Status s = tables_.LoadProcess(e.tgid, ticks, e.exec_id, w.snapshot.get());
  const int64_t spent = ThreadCpuNs() - cpu0;
  // Capped by the size of what it built: a big file's build is the cost that really runs long.
  if (exec_work) ChargeExec(spent, ChargeCapNs(tables_.build_rows() - build_rows0));
  *charged += spent;  // a refresh of a known process is not new-image work: left out
  ++*loads;
  if (w.queued_ns != 0) {
    if (const int64_t late = MonotonicNowNs() - w.queued_ns; late > 5000000) {
      Log(LogLevel::kDebug, "process %d (exec %d): table of event %d loaded %.1f ms after queued",
          e.tgid, e.exec_id, e.kind, late / 1e6);
    }
  }
  if (!s.ok()) retry_later(e.tgid);
}

void UnwindService::TableLoop() {
  // Exited processes are forgotten every 10 s (UnwindTables::SweepExited: one read of /proc,
  // and a /proc/<tgid>/stat read per process every minute for reused pids). A stale entry is
  // harmless meanwhile: the walker checks the start time, and a new process with the pid
  // replaces it on its first sample.
  constexpr int64_t kSweepNs = 10000000000;
  int64_t last_sweep = MonotonicNowNs();
  int64_t last_perf_map_poll = 0;
  std::deque<Work> batch;
  // As in PollLoop: a batch with new-image work is charged its whole thread CPU time, from the
  // end of the previous batch (the wake-up included), not only the loads (measured under
  // continuous churn: the wake-ups alone were 40% of this thread).
  int64_t batch_cpu0 = ThreadCpuNs();
  while (!stop_) {
    {
      // Work and Stop notify; the 1 s tick is the housekeeping below (quarantined rows are
      // freed 1 s after their release, perf maps are looked for every 1 s, exited processes
      // swept every 10 s), so an idle agent wakes here once a second, not ten times.
      std::unique_lock<std::mutex> l(queue_mu_);
      queue_cv_.wait_for(l, std::chrono::seconds(1), [this] { return stop_ || !queue_.empty(); });
      batch.swap(queue_);
      batch_taken_ = !batch.empty();
    }
    const int64_t wait_start = MonotonicNowNs();
    std::lock_guard<std::mutex> l(mu_);
    const int64_t now = MonotonicNowNs();
    int loads = 0;
    int64_t charged = 0;  // the loads: charged as they went, or not new-image work
    const bool new_images = std::any_of(batch.begin(), batch.end(), [](const Work& w) {
      return w.event.kind == PS_UNWIND_EVENT_EXEC || w.event.kind == kFollowUpEvent ||
             w.event.kind == PS_UNWIND_EVENT_NEW_PROCESS;
    });
    for (const Work& w : batch) HandleWork(w, now, &charged, &loads);
    batch_taken_ = false;  // under mu_: PollLoop may load inline from here on (see there)
    const size_t handled = batch.size();
    batch.clear();
    // Housekeeping below is charged to no batch (it runs whatever the churn).
    const int64_t batch_cpu = ThreadCpuNs();
    if (new_images) ChargeExec(std::max<int64_t>(0, batch_cpu - batch_cpu0 - charged));
    const int64_t loaded = MonotonicNowNs();
    tables_.ReleaseQuarantine(now);
    // At most once a second (a perf map is looked for every 1 s per process anyway): each call
    // scans every process entry, and under churn batches come hundreds of times a second.
    if (processes_ != nullptr && now - last_perf_map_poll >= 1000000000) {
      processes_->PollPerfMaps(now);
      last_perf_map_poll = now;
    }
    if (const int64_t end = MonotonicNowNs(); end - wait_start > 5000000) {
      Log(LogLevel::kDebug,
          "unwind: table batch of %d (%d loads): lock %.1f ms, loads %.1f ms, housekeeping %.1f ms",
          handled, loads, (now - wait_start) / 1e6, (loaded - now) / 1e6, (end - loaded) / 1e6);
    }
    if (now - last_sweep >= kSweepNs) {
      tables_.SweepExited();
      tables_.RetryIncomplete(now, kSweepNs);
      last_sweep = now;
    }
    batch_cpu0 = ThreadCpuNs();
  }
}

}  // namespace parascope::unwind
