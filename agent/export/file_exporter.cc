#include "agent/export/file_exporter.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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

std::string FileExporter::DirFor(const ProcessProfile& p) const {
  if (p.group.kind == ProfileGroup::Kind::kCgroup) {
    return absl::StrCat(dir_, "/cgroup/", p.group.id);
  }
  const proc::ProcessKey& k = p.process;
  return absl::StrCat(dir_, "/", k.tgid, "/", proc::BootNsToTicks(k.start_boot_ns), ".", k.exec_id);
}

std::string FileExporter::PathFor(const ProcessProfile& p) const {
  return absl::StrCat(DirFor(p), "/", p.type, "-", p.profile.time_nanos() / 1000000,
                      ".pb.gz");
}

absl::Status FileExporter::Export(const ProcessProfile& p) {
  PS_ASSIGN_OR_RETURN(std::string data, SerializeGzip(p.profile));
  std::string dir = DirFor(p);
  if (!made_dirs_.contains(dir)) {
    PS_RETURN_IF_ERROR(MkdirP(dir));
    if (made_dirs_.size() >= 65536) made_dirs_.clear();
    made_dirs_.insert(dir);
  }
  std::string path = PathFor(p);
  if (retention_.enabled()) {
    retention_.MakeRoom(OutputRetention::EstimateAllocated(static_cast<int64_t>(data.size())));
  }
  std::string tmp = absl::StrCat(path, ".tmp");
  int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0 && errno == ENOENT) {  // the directory was removed meanwhile
    made_dirs_.erase(dir);
    PS_RETURN_IF_ERROR(MkdirP(dir));
    made_dirs_.insert(dir);
    fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  }
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", tmp));
  size_t off = 0;
  while (off < data.size()) {
    ssize_t n = write(fd, data.data() + off, data.size() - off);
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return ErrnoStatus(err, absl::StrCat("write ", tmp));
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
    unlink(tmp.c_str());
    return ErrnoStatus(err, absl::StrCat("close ", tmp));
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    unlink(tmp.c_str());
    return ErrnoStatus(err, absl::StrCat("rename ", path));
  }
  if (retention_.enabled()) {
    // A rewrite of the same window's file (never done today) would be indexed twice; the
    // second unlink then finds nothing.
    retention_.Added(dir, p.type, p.profile.time_nanos() / 1000000, allocated);
    retention_.MakeRoom(0, 0);  // the file took more than estimated
  }
  return absl::OkStatus();
}

}  // namespace parascope
