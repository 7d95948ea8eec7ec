#include "agent/bpf/probe.h"

#include <bpf/libbpf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace parascope {

absl::Status ProbeBpfEnvironment() {
  struct stat st;
  if (stat("/sys/kernel/btf/vmlinux", &st) != 0) {
    return absl::FailedPreconditionError(
        "kernel BTF not found at /sys/kernel/btf/vmlinux: parascope's CO-RE BPF programs need a "
        "kernel built with CONFIG_DEBUG_INFO_BTF=y (Linux 5.8+; default on Debian 11+, Ubuntu "
        "20.10+, RHEL 8.2+)");
  }
  int rc = libbpf_probe_bpf_prog_type(BPF_PROG_TYPE_PERF_EVENT, nullptr);
  if (rc == 1) return absl::OkStatus();
  if (rc == -EPERM || rc == -EACCES) {
    return absl::PermissionDeniedError(
        "loading BPF programs was denied: run parascope as root, or grant CAP_BPF, CAP_PERFMON, "
        "CAP_SYS_PTRACE and CAP_SYSLOG (CAP_SYS_ADMIN before Linux 5.8)");
  }
  if (rc == 0) {
    return absl::FailedPreconditionError(
        "this kernel does not support BPF perf_event programs (CONFIG_BPF_EVENTS)");
  }
  return absl::FailedPreconditionError(
      absl::StrCat("probing BPF support failed: ", std::strerror(-rc),
                   (geteuid() != 0 ? " (not running as root)" : "")));
}

}  // namespace parascope
