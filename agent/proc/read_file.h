// Small file helpers for /proc, whose files report st_size 0 and must be read until EOF.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::proc {

// Reads the whole file at `path` until EOF. Errors via ErrnoStatus with the path as context:
// NotFound for ENOENT/ESRCH (the process exited), PermissionDenied for EACCES/EPERM, etc.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Returns the target of the symbolic link at `path` (readlink(2), any length). Same errors as
// ReadFileToString.
absl::StatusOr<std::string> ReadLink(const std::string& path);

// The same for `name` relative to the directory `dir` open as `dirfd` (openat(2), readlinkat(2);
// AT_FDCWD with an empty `dir`: `name` is a path); `dir` names the file in errors. A /proc/<pid>
// directory fd resolves each name without walking /proc and the pid again, and once that process
// has been reaped (even if its pid was reused since) every read through it fails: NotFound. (A
// zombie's stat still reads; its maps read empty.)
absl::StatusOr<std::string> ReadFileAt(int dirfd, absl::string_view dir, const char* name);
absl::StatusOr<std::string> ReadLinkAt(int dirfd, absl::string_view dir, const char* name);

}  // namespace parascope::proc
