// The Linux capabilities the agent needs (capabilities(7)), checked at start and dropped after
// attaching. The set was found by experiment (test/e2e/deploy_e2e_test.cc "capabilities: ..."
// runs the agent as uid 65534 with it, then with each one removed):
//
//   CAP_BPF             load the BPF programs, create their maps (bpf(2); Linux 5.8+)
//   CAP_PERFMON         open the cpu-clock perf events on every CPU, attach tracing programs,
//                       read kernel memory from BPF (perf_event_open(2); Linux 5.8+)
//   CAP_SYS_PTRACE      read other users' /proc/<pid>/maps, /proc/<pid>/root/... and
//                       /tmp/perf-<pid>.map (ptrace access mode READ_FSCREDS, proc(5))
//   CAP_DAC_READ_SEARCH open binaries and libraries the agent's uid may not read (mode 0700
//                       files, directories of other users)
//   CAP_SYSLOG          kernel symbol addresses in /proc/kallsyms (zeros without it; kallsyms
//                       show_value in kernel/kallsyms.c)
//   CAP_CHECKPOINT_RESTORE  /proc/<pid>/map_files/: mapped files that were deleted or replaced
//                       (upgraded packages) and memfd code (fs/proc/base.c
//                       proc_map_files_get_link; Linux 5.9+)
//
// CAP_SYS_ADMIN stands in for CAP_BPF, CAP_PERFMON and CAP_CHECKPOINT_RESTORE, as the kernel
// accepts it for each. It is not required; when the agent has it, it also names BPF programs'
// frames (BPF_PROG_GET_NEXT_ID). Not needed: CAP_SYS_RESOURCE (Linux 5.11+ charges BPF memory to
// the memory cgroup; on 5.10 the unit's LimitMEMLOCK=infinity does it), CAP_NET_BIND_SERVICE
// (port 7070), CAP_DAC_OVERRIDE (as a non-root uid the agent writes only its own directories).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace parascope {

struct CapabilityNeed {
  int cap;            // CAP_* number (include/uapi/linux/capability.h)
  const char* name;   // "CAP_BPF"
  const char* why;    // what breaks without it
  bool needed_after_attach;
};

// The set above, in that order.
const std::vector<CapabilityNeed>& AgentCapabilities();

// The effective set (capget(2), version 3: 64 bits). Errors: capget's errno.
absl::Status EffectiveCapabilities(uint64_t* effective);

// PermissionDenied naming each capability of AgentCapabilities() missing from the effective set
// (CAP_SYS_ADMIN counting for the three it stands in for) and what it is for, e.g.
// "missing capabilities: CAP_SYSLOG (kernel symbol addresses ...): run parascope as root, or
// grant them ...". With the environment variable PARASCOPE_UNCHECKED_CAPABILITIES=1 (for the
// experiment that finds the set) a missing one is logged as a warning instead.
absl::Status CheckAgentCapabilities();

// After the programs are loaded and attached: removes from the permitted, effective, inheritable
// and ambient sets every capability the agent has that is not needed after attaching (CAP_BPF,
// CAP_PERFMON and everything outside AgentCapabilities(), e.g. a root agent's CAP_NET_ADMIN or
// CAP_SYS_MODULE), keeping CAP_SYS_ADMIN (BPF program names), CAP_DAC_OVERRIDE (a root agent
// writing into directories other users own) and CAP_KILL (command mode passes signals on to a
// command that changed its uid). Returns the names dropped. Errors: capget/capset's errno.
absl::Status DropCapabilitiesAfterAttach(std::vector<std::string>* dropped);

}  // namespace parascope
