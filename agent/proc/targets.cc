#include "agent/proc/targets.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/util/status.h"

namespace parascope::proc {
namespace {

// The Tgid: line of /proc/<pid>/status (man 5 proc), or 0 when absent.
uint32_t StatusTgid(const std::string& text) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::ConsumePrefix(&line, "Tgid:")) {
      uint32_t tgid = 0;
      if (absl::SimpleAtoi(line, &tgid)) return tgid;
    }
  }
  return 0;
}

}  // namespace

TargetProcesses::TargetProcesses(TargetProcesses&& o) noexcept
    : targets_(std::exchange(o.targets_, {})) {}

TargetProcesses& TargetProcesses::operator=(TargetProcesses&& o) noexcept {
  if (this != &o) {
    for (Target& t : targets_) {
      if (t.pidfd >= 0) close(t.pidfd);
    }
    targets_ = std::exchange(o.targets_, {});
  }
  return *this;
}

TargetProcesses::~TargetProcesses() {
  for (Target& t : targets_) {
    if (t.pidfd >= 0) close(t.pidfd);
  }
}

absl::StatusOr<TargetProcesses> TargetProcesses::Pin(const std::vector<uint32_t>& tgids,
                                                     const std::string& proc_root) {
  TargetProcesses out;
  for (uint32_t tgid : tgids) {
    // pidfd first, then the start time: the pidfd refers to the process that had the pid when
    // it was opened; if that process exits before stat is read, the pidfd is readable and the
    // target counts as exited at the first wait.
    int fd = static_cast<int>(syscall(SYS_pidfd_open, static_cast<pid_t>(tgid), 0));
    if (fd < 0) {
      int err = errno;
      if (err == ESRCH) return absl::NotFoundError(absl::StrCat("--pid ", tgid, ": no such process"));
      if (err == EINVAL) {
        // Not a thread-group leader: a thread id (pidfd_open(2) before PIDFD_THREAD).
        absl::StatusOr<std::string> status =
            ReadFileToString(absl::StrCat(proc_root, "/", tgid, "/status"));
        uint32_t leader = status.ok() ? StatusTgid(*status) : 0;
        if (leader != 0 && leader != tgid) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--pid ", tgid, " is a thread of process ", leader, ": give the process id"));
        }
      }
      return ErrnoStatus(err, absl::StrCat("--pid ", tgid, ": pidfd_open"));
    }
    Target t{tgid, 0, fd};
    out.targets_.push_back(t);  // owns fd from here
    absl::StatusOr<std::string> text = ReadFileToString(absl::StrCat(proc_root, "/", tgid, "/stat"));
    if (!text.ok()) {
      if (absl::IsNotFound(text.status())) {
        return absl::NotFoundError(absl::StrCat("--pid ", tgid, ": no such process"));
      }
      return text.status();
    }
    PS_ASSIGN_OR_RETURN(ProcStat st, ParseStat(*text));
    out.targets_.back().start_ticks = st.start_time_ticks;
  }
  return out;
}

bool TargetProcesses::Matches(const ProcessKey& key) const {
  const uint64_t ticks = BootNsToTicks(key.start_boot_ns);
  for (const Target& t : targets_) {
    if (t.tgid != key.tgid) continue;
    uint64_t diff = ticks > t.start_ticks ? ticks - t.start_ticks : t.start_ticks - ticks;
    return diff <= 1;
  }
  return false;
}

std::vector<int> TargetProcesses::live_fds() const {
  std::vector<int> out;
  for (const Target& t : targets_) {
    if (t.pidfd >= 0) out.push_back(t.pidfd);
  }
  return out;
}

std::vector<uint32_t> TargetProcesses::ReapExited() {
  std::vector<uint32_t> out;
  for (Target& t : targets_) {
    if (t.pidfd < 0) continue;
    pollfd p{t.pidfd, POLLIN, 0};
    if (poll(&p, 1, 0) == 1 && (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0) {
      close(t.pidfd);
      t.pidfd = -1;
      out.push_back(t.tgid);
    }
  }
  return out;
}

bool TargetProcesses::all_exited() const {
  if (targets_.empty()) return false;
  for (const Target& t : targets_) {
    if (t.pidfd >= 0) return false;
  }
  return true;
}

}  // namespace parascope::proc
