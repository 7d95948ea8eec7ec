#include "agent/bpf/probe.h"

#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/btf.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace parascope {
namespace {

// Effective capability check through capget(2) (include/uapi/linux/capability.h, v3: two
// 32-bit words). CAP_PERFMON (38) and CAP_BPF (39) exist since Linux 5.8.
bool HasEffectiveCapability(int cap) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[cap / 32].effective >> (cap % 32)) & 1;
}

}  // namespace

int TracepointArgCount(const struct btf* btf, const char* name) {
  int id = btf__find_by_name_kind(btf, absl::StrCat("btf_trace_", name).c_str(), BTF_KIND_TYPEDEF);
  if (id <= 0) return -ENOENT;
  // typedef -> (modifiers) -> pointer -> (modifiers) -> function prototype.
  auto skip_mods = [btf](const btf_type* t) {
    while (t != nullptr && (btf_is_mod(t) || btf_is_typedef(t))) t = btf__type_by_id(btf, t->type);
    return t;
  };
  const btf_type* t = skip_mods(btf__type_by_id(btf, id));
  if (t == nullptr || !btf_is_ptr(t)) return -EINVAL;
  t = skip_mods(btf__type_by_id(btf, t->type));
  if (t == nullptr || !btf_is_func_proto(t) || btf_vlen(t) < 1) return -EINVAL;
  return btf_vlen(t) - 1;
}

absl::Status ProbeBpfEnvironment() {
  struct stat st;
  if (stat("/sys/kernel/btf/vmlinux", &st) != 0) {
    return absl::FailedPreconditionError(
        "kernel BTF not found at /sys/kernel/btf/vmlinux: parascope's CO-RE BPF programs need a "
        "kernel built with CONFIG_DEBUG_INFO_BTF=y (Linux 5.8+; default on Debian 11+, Ubuntu "
        "20.10+, RHEL 8.2+)");
  }
  constexpr int kCapPerfmon = 38, kCapBpf = 39;
  if (!HasEffectiveCapability(CAP_SYS_ADMIN) &&
      !(HasEffectiveCapability(kCapBpf) && HasEffectiveCapability(kCapPerfmon))) {
    return absl::PermissionDeniedError(
        "missing privileges: run parascope as root, or grant CAP_BPF and CAP_PERFMON (plus "
        "CAP_SYS_PTRACE to read other processes' maps and CAP_SYSLOG for kernel symbols; "
        "CAP_SYS_ADMIN before Linux 5.8)");
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
