// Readiness for systemd's Type=notify (sd_notify(3), "NOTIFY_SOCKET"): one datagram of
// newline-separated assignments ("READY=1", "STOPPING=1", "STATUS=...") sent to the AF_UNIX socket
// named by $NOTIFY_SOCKET (a path, or an abstract name when it starts with '@'). The protocol is
// a few lines; libsystemd is not linked for it.
#pragma once

#include <string>

#include "absl/status/status.h"

namespace parascope {

// Sends `state` to $NOTIFY_SOCKET. OK and nothing sent when the variable is unset or empty (not
// started by systemd). Errors: socket/sendto's errno, a name longer than sun_path (108 bytes).
absl::Status SdNotify(const std::string& state);

}  // namespace parascope
