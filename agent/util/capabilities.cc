#include "agent/util/capabilities.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/util/log.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

// Numbers newer than some libc headers (include/uapi/linux/capability.h).
constexpr int kCapPerfmon = 38, kCapBpf = 39, kCapCheckpointRestore = 40;
constexpr int kCapLast = 63;

absl::Status GetCaps(__user_cap_data_struct data[2]) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  if (syscall(SYS_capget, &hdr, data) != 0) return ErrnoStatus(errno, "capget");
  return absl::OkStatus();
}

bool Has(uint64_t set, int cap) { return (set >> cap) & 1; }

}  // namespace

const std::vector<CapabilityNeed>& AgentCapabilities() {
  static const auto* needs = new std::vector<CapabilityNeed>{
      {kCapBpf, "CAP_BPF", "loading the BPF programs", false},
      {kCapPerfmon, "CAP_PERFMON", "perf events and tracing programs", false},
      {CAP_SYS_PTRACE, "CAP_SYS_PTRACE", "reading other processes' /proc/<pid>/maps and files",
       true},
      {CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH", "reading binaries the agent's uid may not read",
       true},
      {CAP_SYSLOG, "CAP_SYSLOG", "kernel symbol addresses in /proc/kallsyms", true},
      {kCapCheckpointRestore, "CAP_CHECKPOINT_RESTORE",
       "reading deleted or replaced binaries and memfd code through /proc/<pid>/map_files", true},
  };
  return *needs;
}

absl::Status EffectiveCapabilities(uint64_t* effective) {
  __user_cap_data_struct data[2] = {};
  if (absl::Status s = GetCaps(data); !s.ok()) return s;
  *effective = data[0].effective | (uint64_t{data[1].effective} << 32);
  return absl::OkStatus();
}

absl::Status CheckAgentCapabilities() {
  uint64_t eff = 0;
  if (absl::Status s = EffectiveCapabilities(&eff); !s.ok()) return s;
  const bool sys_admin = Has(eff, CAP_SYS_ADMIN);
  std::vector<std::string> missing;
  for (const CapabilityNeed& n : AgentCapabilities()) {
    const bool stand_in =
        sys_admin && (n.cap == kCapBpf || n.cap == kCapPerfmon || n.cap == kCapCheckpointRestore);
    if (!Has(eff, n.cap) && !stand_in) missing.push_back(absl::StrCat(n.name, " (", n.why, ")"));
  }
  if (missing.empty()) return absl::OkStatus();
  const std::string text = absl::StrCat(
      "missing capabilit", missing.size() == 1 ? "y " : "ies ", absl::StrJoin(missing, ", "),
      ": run parascope as root, or grant ", missing.size() == 1 ? "it" : "them",
      " (AmbientCapabilities= in its systemd unit, securityContext.capabilities.add in "
      "Kubernetes; deploy/systemd/parascope.service lists the whole set)");
  const char* unchecked = getenv("PARASCOPE_UNCHECKED_CAPABILITIES");
  if (unchecked != nullptr && strcmp(unchecked, "1") == 0) {
    Log(LogLevel::kWarning, "%s; going on (PARASCOPE_UNCHECKED_CAPABILITIES=1)", text);
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(text);
}

absl::Status DropCapabilitiesAfterAttach(std::vector<std::string>* dropped) {
  __user_cap_data_struct data[2] = {};
  if (absl::Status s = GetCaps(data); !s.ok()) return s;
  uint64_t keep = (uint64_t{1} << CAP_SYS_ADMIN) | (uint64_t{1} << CAP_DAC_OVERRIDE) |
                  (uint64_t{1} << CAP_KILL);
  for (const CapabilityNeed& n : AgentCapabilities()) {
    if (n.needed_after_attach) keep |= uint64_t{1} << n.cap;
  }
  const uint64_t permitted = data[0].permitted | (uint64_t{data[1].permitted} << 32);
  const uint64_t drop = permitted & ~keep;
  if (drop == 0) return absl::OkStatus();
  // Ambient capabilities must leave first: the kernel keeps ambient within permitted and
  // inheritable (PR_CAP_AMBIENT, prctl(2)).
  for (int cap = 0; cap <= kCapLast; ++cap) {
    if (Has(drop, cap)) (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap, 0, 0);
  }
  const uint64_t eff = (data[0].effective | (uint64_t{data[1].effective} << 32)) & ~drop;
  const uint64_t perm = permitted & ~drop;
  const uint64_t inh = (data[0].inheritable | (uint64_t{data[1].inheritable} << 32)) & ~drop;
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  data[0].effective = static_cast<uint32_t>(eff);
  data[1].effective = static_cast<uint32_t>(eff >> 32);
  data[0].permitted = static_cast<uint32_t>(perm);
  data[1].permitted = static_cast<uint32_t>(perm >> 32);
  data[0].inheritable = static_cast<uint32_t>(inh);
  data[1].inheritable = static_cast<uint32_t>(inh >> 32);
  if (syscall(SYS_capset, &hdr, data) != 0) return ErrnoStatus(errno, "capset");
  for (int cap = 0; cap <= kCapLast; ++cap) {
    if (!Has(drop, cap)) continue;
    const char* name = nullptr;
    for (const CapabilityNeed& n : AgentCapabilities()) {
      if (n.cap == cap) name = n.name;
    }
    dropped->push_back(name != nullptr ? std::string(name) : absl::StrCat("cap ", cap));
  }
  return absl::OkStatus();
}

}  // namespace parascope
