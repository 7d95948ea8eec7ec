#include "agent/util/capabilities.h"

#include <dirent.h>
#include <linux/capability.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

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

namespace {

// ---- Every thread: capabilities are per thread ----
// capset(2) changes only the calling thread's sets (since Linux 2.6.24), and a thread started
// before the drop (the push client's, the HTTP server's, the unwinder's, gRPC's) keeps what it
// was started with. So each other thread applies the same sets itself, from a signal handler, as
// glibc's setxid broadcast (nptl SIGSETXID) and libcap's psx do.
// Static, and the handler stays installed once set: a signal still queued for a thread that was
// slow to answer (real-time signals queue) must find the same sets, never SIG_DFL (whose action
// for a real-time signal ends the process) nor a freed frame.
struct Broadcast {
  __user_cap_data_struct data[2];
  uint64_t drop_ambient;
  std::atomic<int> done{0};
  std::atomic<int> failed{0};
};
Broadcast g_broadcast_storage;
Broadcast* g_broadcast = &g_broadcast_storage;

void ApplyInThisThread(int) {
  const int saved = errno;
  Broadcast* b = g_broadcast;
  for (int cap = 0; cap <= kCapLast; ++cap) {
    if (Has(b->drop_ambient, cap)) (void)prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_LOWER, cap, 0, 0);
  }
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {b->data[0], b->data[1]};
  if (syscall(SYS_capset, &hdr, data) != 0) b->failed.fetch_add(1);
  b->done.fetch_add(1);
  errno = saved;
}

// Other threads of this process (tids from /proc/self/task).
std::vector<pid_t> OtherThreads() {
  std::vector<pid_t> tids;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return tids;
  const pid_t self = static_cast<pid_t>(syscall(SYS_gettid));
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    long tid = strtol(e->d_name, &end, 10);
    if (end != e->d_name && *end == '\0' && tid != self) tids.push_back(static_cast<pid_t>(tid));
  }
  closedir(dir);
  return tids;
}

// The effective set of thread `tid` (proc(5) /proc/self/task/<tid>/status CapEff), or ~0.
uint64_t ThreadEffective(pid_t tid) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, static_cast<int>(tid)};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return ~uint64_t{0};
  return data[0].effective | (uint64_t{data[1].effective} << 32);
}

// Applies `data` (and lowers the ambient capabilities in drop_ambient) in every other thread.
// A thread can start meanwhile from one that has not dropped yet (cpp-httplib's listen thread
// starts its worker pool after Start() returned): it is signalled as soon as it is seen, since
// each listing of the threads signals the ones still holding that were not signalled before.
// Internal when a thread refuses or does not answer within 2 s.
absl::Status ApplyInOtherThreads(const __user_cap_data_struct data[2], uint64_t drop_ambient) {
  const int sig = SIGRTMIN + 2;  // glibc keeps SIGRTMIN-2 and SIGRTMIN-1 for itself
  Broadcast& b = *g_broadcast;
  b.data[0] = data[0];
  b.data[1] = data[1];
  b.drop_ambient = drop_ambient;
  struct sigaction sa {};
  sa.sa_handler = ApplyInThisThread;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(sig, &sa, nullptr) != 0) return ErrnoStatus(errno, "sigaction");
  const uint64_t want = data[0].effective | (uint64_t{data[1].effective} << 32);
  // Threads still holding more than `want` (a thread that exited, or exits meanwhile, holds
  // nothing: capget fails for it).
  auto holding_threads = [want] {
    std::vector<pid_t> out;
    for (pid_t tid : OtherThreads()) {
      const uint64_t eff = ThreadEffective(tid);
      if (eff != ~uint64_t{0} && (eff & ~want) != 0) out.push_back(tid);
    }
    return out;
  };
  // Polled on the threads themselves, not on answers counted: a thread that exits before its
  // handler runs (start-up helpers do) would otherwise cost the whole wait. Every 100 ms the
  // threads still holding are signalled again (a tid reused by a new thread; the handler is
  // idempotent), at most 2 s in all.
  std::vector<pid_t> signalled;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  auto last_round = std::chrono::steady_clock::now();
  for (;;) {
    const std::vector<pid_t> holding = holding_threads();
    if (holding.empty()) break;
    const auto now = std::chrono::steady_clock::now();
    if (now > deadline) break;
    const bool again = now - last_round >= std::chrono::milliseconds(100);
    if (again) last_round = now;
    for (pid_t tid : holding) {
      const bool seen = std::find(signalled.begin(), signalled.end(), tid) != signalled.end();
      if (!seen) signalled.push_back(tid);
      if (!seen || again) (void)syscall(SYS_tgkill, getpid(), tid, sig);
    }
    timespec one_ms{0, 1000000};
    nanosleep(&one_ms, nullptr);
  }
  // Only what the threads hold now counts.
  const int holding = static_cast<int>(holding_threads().size());
  if (holding > 0) {
    return absl::InternalError(absl::StrCat("capabilities: ", holding,
                                            " thread(s) still hold capabilities to drop (",
                                            b.failed.load(), " capset failures)"));
  }
  return absl::OkStatus();
}

}  // namespace

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
  PS_RETURN_IF_ERROR(ApplyInOtherThreads(data, drop));
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
