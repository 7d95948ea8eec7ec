#include "agent/export/file_exporter.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

absl::Status MkdirP(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
  if (errno == ENOENT) {
    size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      PS_RETURN_IF_ERROR(MkdirP(path.substr(0, slash)));
      if (mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return absl::OkStatus();
    }
  }
  return ErrnoStatus(errno, absl::StrCat("mkdir ", path));
}

}  // namespace

FileExporter::~FileExporter() {
  if (dir_fd_ >= 0) close(dir_fd_);
}

std::string FileExporter::RelativeDirFor(const ProcessProfile& p) {
  if (p.group.kind == ProfileGroup::Kind::kCgroup) return absl::StrCat("cgroup/", p.group.id);
  const proc::ProcessKey& k = p.process;
  return absl::StrCat(k.tgid, "/", proc::BootNsToTicks(k.start_boot_ns), ".", k.exec_id);
}

std::string FileExporter::NameFor(const ProcessProfile& p) {
  return absl::StrCat(p.type, "-", p.profile->time_nanos() / 1000000, ".pb.gz");
}

std::string FileExporter::DirFor(const ProcessProfile& p) const {
  return absl::StrCat(dir_, "/", RelativeDirFor(p));
}

std::string FileExporter::PathFor(const ProcessProfile& p) const {
  return absl::StrCat(DirFor(p), "/", NameFor(p));
}

FileExporter::DirKey FileExporter::DirKeyFor(const ProcessProfile& p) {
  if (p.group.kind == ProfileGroup::Kind::kCgroup) return {p.group.id, 0, DirKey::kCgroup};
  return ProcessDirKey(p.process);
}

FileExporter::DirKey FileExporter::ProcessDirKey(const proc::ProcessKey& k) {
  return {uint64_t{k.tgid} << 32 | k.exec_id, proc::BootNsToTicks(k.start_boot_ns),
          DirKey::kProcess};
}

bool FileExporter::KnownDir(const DirKey& key) {
  if (dirs_this_window_.contains(key)) return true;
  if (!dirs_last_window_.contains(key)) return false;
  if (dirs_this_window_.size() < kMaxKnownDirs) dirs_this_window_.insert(key);
  return true;
}

void FileExporter::ForgetDir(const DirKey& key) {
  dirs_this_window_.erase(key);
  dirs_last_window_.erase(key);
}

absl::Status FileExporter::MakeDir(const DirKey& key, const std::string& rel, bool reopened) {
  if (dir_fd_ < 0) {
    dir_fd_ = open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd_ < 0 && errno == ENOENT) {
      PS_RETURN_IF_ERROR(MkdirP(dir_));
      dir_fd_ = open(dir_.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
    }
    if (dir_fd_ < 0) return ErrnoStatus(errno, absl::StrCat("open ", dir_));
    // The filesystem's block (statfs(2) f_bsize; an O_PATH descriptor allows fstatfs since
    // Linux 3.12, open(2)): a profile whose stored gzip fits in one takes the same space
    // compressed or not, and storing costs 0.14 us instead of 12 (SerializeGzip). Bounded to
    // 64 KiB, a stored gzip's single block. Unknown: everything is compressed.
    struct statfs fs {};
    block_bytes_ = fstatfs(dir_fd_, &fs) == 0 && fs.f_bsize > 0
                       ? std::min<size_t>(static_cast<size_t>(fs.f_bsize), 65536)
                       : 0;
  }
  if (KnownDir(key)) return absl::OkStatus();
  // Parent first: a new process's <pid> directory, then its image's. Trying the leaf first
  // would fail with ENOENT for every new process (measured: a third of the mkdir calls).
  bool made = false;  // the leaf was made, not found
  for (size_t slash = rel.find('/');; slash = rel.find('/', slash + 1)) {
    const std::string part = rel.substr(0, slash);
    made = mkdirat(dir_fd_, part.c_str(), 0755) == 0;
    if (!made && errno != EEXIST) {
      if (errno == ENOENT && slash == rel.find('/') && !reopened) {
        // Nothing can be made in a removed directory (ENOENT): DIR was removed since it was
        // opened (`rm -rf DIR`). Made and opened again, once.
        close(dir_fd_);
        dir_fd_ = -1;
        dirs_this_window_.clear();
        dirs_last_window_.clear();
        return MakeDir(key, rel, /*reopened=*/true);
      }
      return ErrnoStatus(errno, absl::StrCat("mkdir ", dir_, "/", part));
    }
    if (slash == std::string::npos) break;
  }
  if (dirs_this_window_.size() < kMaxKnownDirs) dirs_this_window_.insert(key);
  if (key.kind == DirKey::kProcess && made) ++new_dirs_this_window_;
  return absl::OkStatus();
}

bool FileExporter::ShouldMerge(const ProcessProfile& p, const DirKey& key) {
  // A group's profiles (a command-mode tree's) already carry pid and process labels.
  if (key.kind != DirKey::kProcess || p.group.is_group()) return false;
  return MergesImage(key, p.process.tgid);
}

bool FileExporter::MergesProcess(const proc::ProcessKey& k) {
  return MergesImage(ProcessDirKey(k), k.tgid);
}

bool FileExporter::MergesImage(const DirKey& key, uint32_t tgid) {
  if (!merge_decided_.empty()) {
    if (auto it = merge_decided_.find(key); it != merge_decided_.end()) return it->second;
  }
  if (!merged_last_window_.empty() && merged_last_window_.contains(key)) {
    merge_decided_.emplace(key, true);  // ran across the boundary: stays in one place
    return true;
  }
  if (new_dirs_this_window_ < max_new_processes_) return false;
  if (KnownDir(key)) return false;
  // Gone: kill(2) with signal 0 checks existence only; ESRCH names no process (a zombie still
  // counts as running, and so does a new process that got the pid: both only cost a directory).
  const bool gone = kill(static_cast<pid_t>(tgid), 0) != 0 && errno == ESRCH;
  merge_decided_.emplace(key, gone);
  if (gone) merged_processes_.fetch_add(1, std::memory_order_relaxed);
  return gone;
}

void FileExporter::EndWindow(absl::Time now) {
  if (dir_fd_ >= 0) {
    struct stat open_st {};
    struct stat path_st {};
    if (fstat(dir_fd_, &open_st) != 0 || stat(dir_.c_str(), &path_st) != 0 ||
        open_st.st_dev != path_st.st_dev || open_st.st_ino != path_st.st_ino) {
      close(dir_fd_);
      dir_fd_ = -1;
      dirs_this_window_.clear();
    }
  }
  dirs_last_window_ = std::move(dirs_this_window_);
  dirs_this_window_.clear();
  new_dirs_this_window_ = 0;
  merged_last_window_.clear();
  for (const auto& [key, merged] : merge_decided_) {
    if (merged) merged_last_window_.insert(key);
  }
  merge_decided_.clear();
  merges_.clear();
  if (retention_.enabled()) retention_.Expire(now);
}

absl::Status FileExporter::Export(const ProcessProfile& p) {
  const DirKey dir_key = DirKeyFor(p);
  if (ShouldMerge(p, dir_key)) {
    Merge& m = merges_[p.type];
    PS_RETURN_IF_ERROR(m.merger.Add(*p.profile, p.process.tgid, p.process_name));
    merged_profiles_.fetch_add(1, std::memory_order_relaxed);
    if (m.merger.approx_bytes() >= kMaxMergedBytes) {
      // Reported by Flush: this profile was merged (the failure is the part's).
      absl::Status s = WriteMerged(p.type);
      if (!s.ok() && pending_error_.ok()) pending_error_ = std::move(s);
    }
    return absl::OkStatus();
  }
  return WriteProfile(dir_key, RelativeDirFor(p), p.type, *p.profile);
}

std::string FileExporter::OverflowNote() const {
  return absl::StrCat("parascope: processes that had exited when the window was written, past the ",
                      max_new_processes_,
                      " new process directories a window may make (--output-max-new-processes)");
}

absl::Status FileExporter::ExportMergedPart(ProcessProfile p) {
  const uint32_t part = merges_[p.type].next_part++;
  p.profile->add_string_table(OverflowNote());
  p.profile->add_comment(p.profile->string_table_size() - 1);
  merged_profiles_.fetch_add(p.group_processes, std::memory_order_relaxed);
  return WriteProfile({part, 0, DirKey::kOverflow}, absl::StrCat("overflow/", part), p.type,
                      *p.profile);
}

absl::Status FileExporter::WriteMerged(const std::string& type) {
  Merge& m = merges_[type];
  if (m.merger.empty()) return absl::OkStatus();
  const uint32_t part = m.next_part++;
  const size_t profiles = m.merger.profiles();
  const perftools::profiles::Profile merged = m.merger.Take(OverflowNote());
  absl::Status s =
      WriteProfile({part, 0, DirKey::kOverflow}, absl::StrCat("overflow/", part), type, merged);
  if (!s.ok()) merged_lost_ += profiles;
  return s;
}

absl::Status FileExporter::Flush() {
  absl::Status first = std::exchange(pending_error_, absl::OkStatus());
  for (auto& [type, m] : merges_) {
    absl::Status s = WriteMerged(type);
    if (first.ok()) first = s;
  }
  return first;
}

absl::Status FileExporter::WriteProfile(const DirKey& dir_key, const std::string& rel_dir,
                                        const std::string& type,
                                        const perftools::profiles::Profile& profile) {
  PS_RETURN_IF_ERROR(MakeDir(dir_key, rel_dir));
  PS_ASSIGN_OR_RETURN(std::string data, SerializeGzip(profile, block_bytes_));
  const int64_t t0_ms = profile.time_nanos() / 1000000;
  const std::string rel = absl::StrCat(rel_dir, "/", type, "-", t0_ms, ".pb.gz");
  if (retention_.enabled()) {
    retention_.MakeRoom(OutputRetention::EstimateAllocated(static_cast<int64_t>(data.size())));
  }
  const std::string tmp = absl::StrCat(rel, ".tmp");
  int fd = openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {
    // The directory was removed meanwhile (retention, a user), or DIR itself (dir_fd_ is then
    // a deleted directory's): made again, and DIR reopened.
    ForgetDir(dir_key);
    close(dir_fd_);
    dir_fd_ = -1;
    PS_RETURN_IF_ERROR(MakeDir(dir_key, rel_dir));
    fd = openat(dir_fd_, tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  const std::string path = absl::StrCat(dir_, "/", rel);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path, ".tmp"));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      unlinkat(dir_fd_, tmp.c_str(), 0);
      return ErrnoStatus(err, absl::StrCat("write ", path, ".tmp"));
    }
    off += n;
  }
  // The blocks the file took, for retention only (a system call per profile otherwise saved).
  int64_t allocated = OutputRetention::EstimateAllocated(static_cast<int64_t>(data.size()));
  if (struct stat st; retention_.enabled() && fstat(fd, &st) == 0) {
    allocated = static_cast<int64_t>(st.st_blocks) * 512;
  }
  if (close(fd) != 0) {
    int err = errno;
    unlinkat(dir_fd_, tmp.c_str(), 0);
    return ErrnoStatus(err, absl::StrCat("close ", path, ".tmp"));
  }
  if (renameat(dir_fd_, tmp.c_str(), dir_fd_, rel.c_str()) != 0) {
    int err = errno;
    unlinkat(dir_fd_, tmp.c_str(), 0);
    return ErrnoStatus(err, absl::StrCat("rename ", path));
  }
  if (retention_.enabled()) {
    // A rewrite of the same window's file (never done today) would be indexed twice; the
    // second unlink then finds nothing.
    retention_.Added(absl::StrCat(dir_, "/", rel_dir), type, t0_ms, allocated);
    retention_.MakeRoom(0, 0);  // the file took more than estimated
  }
  return absl::OkStatus();
}

}  // namespace parascope
