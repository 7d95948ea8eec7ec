// The --pid targets, pinned at start with pidfds (pidfd_open(2), Linux 5.3): each target's
// identity (tgid, start time) is fixed when the agent starts, its exit is seen at once (its pidfd
// becomes readable; man 2 pidfd_open), and a later process that gets the same pid is never taken
// for it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "agent/proc/process_table.h"

namespace parascope::proc {

class TargetProcesses {
 public:
  TargetProcesses() = default;
  TargetProcesses(TargetProcesses&&) noexcept;
  TargetProcesses& operator=(TargetProcesses&&) noexcept;
  ~TargetProcesses();

  // Pins every tgid. Errors: NotFound "--pid N: no such process" for a pid that does not exist,
  // InvalidArgument for a thread id that is not its process's (the message names the process),
  // else the errno of pidfd_open or of reading <proc_root>/<pid>/stat.
  static absl::StatusOr<TargetProcesses> Pin(const std::vector<uint32_t>& tgids,
                                             const std::string& proc_root = "/proc");

  bool empty() const { return targets_.empty(); }
  // True when `key` is one of the targets: same tgid and start time (within one tick of
  // rounding, as ProcessTable); any exec id (a target that execs is still the target).
  bool Matches(const ProcessKey& key) const;
  // pidfds of the targets still running (for poll(2); readable once the target exits).
  std::vector<int> live_fds() const;
  // Marks the targets whose pidfd is readable as exited and returns their tgids.
  std::vector<uint32_t> ReapExited();
  // True when every target has exited (false when there are none).
  bool all_exited() const;

 private:
  struct Target {
    uint32_t tgid = 0;
    uint64_t start_ticks = 0;
    int pidfd = -1;  // -1 once exited
  };
  std::vector<Target> targets_;
};

}  // namespace parascope::proc
