#include "agent/util/sd_notify.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "agent/util/status.h"

namespace parascope {

absl::Status SdNotify(const std::string& state) {
  const char* name = getenv("NOTIFY_SOCKET");
  if (name == nullptr || name[0] == '\0') return absl::OkStatus();
  struct sockaddr_un addr = {};
  addr.sun_family = AF_UNIX;
  const size_t len = strlen(name);
  if (len >= sizeof(addr.sun_path)) {
    return absl::InvalidArgumentError("NOTIFY_SOCKET: name longer than sun_path");
  }
  memcpy(addr.sun_path, name, len);
  if (name[0] == '@') addr.sun_path[0] = '\0';  // abstract namespace
  const socklen_t addr_len = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + len);
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return ErrnoStatus(errno, "socket(AF_UNIX) for NOTIFY_SOCKET");
  ssize_t n = sendto(fd, state.data(), state.size(), MSG_NOSIGNAL,
                     reinterpret_cast<struct sockaddr*>(&addr), addr_len);
  int err = errno;
  close(fd);
  if (n < 0) return ErrnoStatus(err, "sendto NOTIFY_SOCKET");
  return absl::OkStatus();
}

}  // namespace parascope
