#include "agent/export/retention.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "agent/util/log.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

// "<type>-<t0>.pb.gz" -> type, t0. False for other names.
bool ParseProfileName(absl::string_view name, absl::string_view* type, int64_t* t0) {
  if (!absl::ConsumeSuffix(&name, ".pb.gz")) return false;
  size_t dash = name.rfind('-');
  if (dash == absl::string_view::npos || dash == 0) return false;
  absl::string_view digits = name.substr(dash + 1);
  if (digits.empty() || !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return false;
  }
  if (!absl::SimpleAtoi(digits, t0)) return false;
  *type = name.substr(0, dash);
  for (char c : *type) {
    if (!absl::ascii_islower(c) && !absl::ascii_isdigit(c) && c != '_') return false;
  }
  return true;
}

}  // namespace

OutputRetention::OutputRetention(std::string root, RetentionOptions options)
    : root_(std::move(root)), options_(options) {
  while (root_.size() > 1 && root_.back() == '/') root_.pop_back();
}

uint32_t OutputRetention::InternDir(const std::string& path) {
  auto it = dir_ids_.find(path);
  if (it != dir_ids_.end()) return it->second;
  uint32_t id;
  if (!free_dirs_.empty()) {
    id = free_dirs_.back();
    free_dirs_.pop_back();
    dirs_[id] = Dir{path, 0};
  } else {
    id = static_cast<uint32_t>(dirs_.size());
    dirs_.push_back(Dir{path, 0});
  }
  dir_ids_.emplace(path, id);
  return id;
}

uint16_t OutputRetention::InternType(absl::string_view type) {
  for (size_t i = 0; i < types_.size(); ++i) {
    if (types_[i] == type) return static_cast<uint16_t>(i);
  }
  types_.emplace_back(type);
  return static_cast<uint16_t>(types_.size() - 1);
}

void OutputRetention::ScanDir(const std::string& path, int depth) {
  DIR* d = opendir(path.c_str());
  if (d == nullptr) {
    if (errno != ENOENT) errors_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  std::vector<std::string> subdirs;
  while (struct dirent* e = readdir(d)) {
    absl::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st;
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    std::string full = absl::StrCat(path, "/", name);
    if (S_ISDIR(st.st_mode)) {
      if (depth < 2) subdirs.push_back(std::move(full));
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    if (absl::EndsWith(name, ".pb.gz.tmp")) {
      unlinkat(dirfd(d), e->d_name, 0);
      continue;
    }
    absl::string_view type;
    int64_t t0;
    if (!ParseProfileName(name, &type, &t0)) continue;
    Added(path, type, t0, static_cast<int64_t>(st.st_blocks) * 512);
  }
  closedir(d);
  for (const std::string& s : subdirs) ScanDir(s, depth + 1);
}

absl::Status OutputRetention::Scan(absl::Time now) {
  DIR* d = opendir(root_.c_str());
  if (d == nullptr) {
    if (errno == ENOENT) return absl::OkStatus();
    return ErrnoStatus(errno, absl::StrCat("opendir ", root_));
  }
  closedir(d);
  ScanDir(root_, 0);
  Expire(now);
  MakeRoom(0, 0);
  return absl::OkStatus();
}

void OutputRetention::Added(const std::string& dir, absl::string_view type, int64_t t0_unix_ms,
                            int64_t bytes) {
  Entry e;
  e.dir = InternDir(dir);
  e.type = InternType(type);
  e.bytes = bytes;
  ++dirs_[e.dir].files;
  windows_[t0_unix_ms].push_back(e);
  bytes_ += bytes;
  ++files_;
  stat_bytes_.store(bytes_, std::memory_order_relaxed);
  stat_files_.store(files_, std::memory_order_relaxed);
}

void OutputRetention::DeleteOldest(Reason reason) {
  auto w = windows_.begin();
  if (w == windows_.end()) return;
  Entry e = w->second.front();
  w->second.pop_front();
  const int64_t t0 = w->first;
  if (w->second.empty()) windows_.erase(w);
  Dir& dir = dirs_[e.dir];
  std::string path = absl::StrCat(dir.path, "/", types_[e.type], "-", t0, ".pb.gz");
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    errors_.fetch_add(1, std::memory_order_relaxed);
    log_.Log(LogLevel::kWarning, "retention: unlink %s: %s", path, strerror(errno));
  }
  bytes_ -= e.bytes;
  --files_;
  stat_bytes_.store(bytes_, std::memory_order_relaxed);
  stat_files_.store(files_, std::memory_order_relaxed);
  deleted_bytes_.fetch_add(e.bytes, std::memory_order_relaxed);
  switch (reason) {
    case Reason::kBytes: deleted_bytes_bound_.fetch_add(1, std::memory_order_relaxed); break;
    case Reason::kAge: deleted_age_.fetch_add(1, std::memory_order_relaxed); break;
    case Reason::kFiles: deleted_files_bound_.fetch_add(1, std::memory_order_relaxed); break;
  }
  if (--dir.files == 0) {
    // The directory (an image's or a cgroup's) and its parent (the pid's), when empty; rmdir
    // fails harmlessly on a directory that still holds anything, or on the root.
    if (rmdir(dir.path.c_str()) == 0) {
      size_t slash = dir.path.find_last_of('/');
      if (slash != std::string::npos && slash > root_.size()) {
        rmdir(dir.path.substr(0, slash).c_str());
      }
    }
    dir_ids_.erase(dir.path);
    dir.path.clear();
    dir.path.shrink_to_fit();
    free_dirs_.push_back(e.dir);
  }
}

void OutputRetention::MakeRoom(int64_t bytes, int64_t files) {
  if (options_.max_bytes > 0) {
    while (files_ > 0 && bytes_ + bytes > options_.max_bytes) DeleteOldest(Reason::kBytes);
  }
  while (files_ > 0 && files_ + files > static_cast<int64_t>(options_.max_files)) {
    DeleteOldest(Reason::kFiles);
  }
}

void OutputRetention::Expire(absl::Time now) {
  if (options_.max_age <= absl::ZeroDuration()) return;
  const int64_t cutoff = absl::ToUnixMillis(now - options_.max_age);
  while (!windows_.empty() && windows_.begin()->first < cutoff) DeleteOldest(Reason::kAge);
}

RetentionStats OutputRetention::stats() const {
  RetentionStats s;
  s.bytes = stat_bytes_.load(std::memory_order_relaxed);
  s.files = stat_files_.load(std::memory_order_relaxed);
  s.deleted_bytes_bound = deleted_bytes_bound_.load(std::memory_order_relaxed);
  s.deleted_age = deleted_age_.load(std::memory_order_relaxed);
  s.deleted_files_bound = deleted_files_bound_.load(std::memory_order_relaxed);
  s.deleted_bytes = deleted_bytes_.load(std::memory_order_relaxed);
  s.errors = errors_.load(std::memory_order_relaxed);
  return s;
}

}  // namespace parascope
