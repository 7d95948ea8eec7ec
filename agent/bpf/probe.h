// Environment probes run before anything is loaded, so a missing privilege or kernel feature is
// reported as what to grant or enable, not as a libbpf error deep in a load.
#pragma once

#include "absl/status/status.h"

namespace parascope {

// Checks, in order: kernel BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF=y, needed for
// CO-RE); the bpf(2) syscall can load a perf_event program (root or CAP_BPF + CAP_PERFMON;
// kernel.unprivileged_bpf_disabled does not matter for those). Errors: FailedPrecondition or
// PermissionDenied whose message says what to grant or enable.
absl::Status ProbeBpfEnvironment();

}  // namespace parascope
