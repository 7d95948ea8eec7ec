#include "agent/util/status.h"

namespace parascope {

absl::Status ErrnoStatus(int err, absl::string_view context) {
  std::string msg = absl::StrCat(context, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
    case ESRCH:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    case EINVAL:
      return absl::InvalidArgumentError(msg);
    case ENOMEM:
    case E2BIG:
    case ENOSPC:
      return absl::ResourceExhaustedError(msg);
    case EOPNOTSUPP:
    case ENOSYS:
      return absl::UnimplementedError(msg);
    default:
      return absl::InternalError(msg);
  }
}

}  // namespace parascope
