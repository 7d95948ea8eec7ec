#include "agent/proc/read_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "agent/util/status.h"

namespace parascope::proc {
namespace {

constexpr size_t kMaxLinkBytes = 1 << 20;

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  int fd;
  do {
    fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return ErrnoStatus(errno, "open " + path);

  std::string out;
  char buf[16384];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      return ErrnoStatus(err, "read " + path);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  return out;
}

absl::StatusOr<std::string> ReadLink(const std::string& path) {
  std::string target(256, '\0');
  for (;;) {
    ssize_t n = readlink(path.c_str(), target.data(), target.size());
    if (n < 0) return ErrnoStatus(errno, "readlink " + path);
    if (static_cast<size_t>(n) < target.size()) {
      target.resize(static_cast<size_t>(n));
      return target;
    }
    if (target.size() >= kMaxLinkBytes) {
      return absl::OutOfRangeError("readlink " + path + ": target longer than 1 MiB");
    }
    target.resize(target.size() * 2);  // possibly truncated: retry with more room
  }
}

}  // namespace parascope::proc
