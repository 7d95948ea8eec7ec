#include "agent/proc/read_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "absl/strings/str_cat.h"
#include "agent/util/status.h"

namespace parascope::proc {
namespace {

constexpr size_t kMaxLinkBytes = 1 << 20;

std::string PathOf(absl::string_view dir, const char* name) {
  return dir.empty() ? std::string(name) : absl::StrCat(dir, "/", name);
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  return ReadFileAt(AT_FDCWD, "", path.c_str());
}

absl::StatusOr<std::string> ReadLink(const std::string& path) {
  return ReadLinkAt(AT_FDCWD, "", path.c_str());
}

absl::StatusOr<std::string> ReadFileAt(int dirfd, absl::string_view dir, const char* name) {
  int fd;
  do {
    fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "open " + PathOf(dir, name));

  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, "read " + PathOf(dir, name));
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::StatusOr<std::string> ReadLinkAt(int dirfd, absl::string_view dir, const char* name) {
  std::string target(256, '\0');
  for (;;) {
    ssize_t n = readlinkat(dirfd, name, target.data(), target.size());
    if (n < 0) return ErrnoStatus(errno, "readlink " + PathOf(dir, name));
    if (static_cast<size_t>(n) < target.size()) {
      target.resize(static_cast<size_t>(n));
      return target;
    }
    if (target.size() >= kMaxLinkBytes) {
      return absl::OutOfRangeError("readlink " + PathOf(dir, name) + ": target longer than 1 MiB");
    }
    target.resize(target.size() * 2);  // possibly truncated: retry with more room
  }
}

}  // namespace parascope::proc
