// Small file helpers for /proc, whose files report st_size 0 and must be read until EOF.
#pragma once

#include <string>

#include "absl/status/statusor.h"

namespace parascope::proc {

// Reads the whole file at `path` until EOF. Errors via ErrnoStatus with the path as context:
// NotFound for ENOENT/ESRCH (the process exited), PermissionDenied for EACCES/EPERM, etc.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Returns the target of the symbolic link at `path` (readlink(2), any length). Same errors as
// ReadFileToString.
absl::StatusOr<std::string> ReadLink(const std::string& path);

}  // namespace parascope::proc
