// Environment probes run before anything is loaded, so a missing privilege or kernel feature is
// reported as what to grant or enable, not as a libbpf error deep in a load.
#pragma once

#include "absl/status/status.h"

struct btf;

namespace parascope {

// Checks, in order: kernel BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF=y, needed for
// CO-RE); the bpf(2) syscall can load a perf_event program (root or CAP_BPF + CAP_PERFMON;
// kernel.unprivileged_bpf_disabled does not matter for those). Errors: FailedPrecondition or
// PermissionDenied whose message says what to grant or enable.
absl::Status ProbeBpfEnvironment();

// Arguments of tracepoint `name` (e.g. "sched_switch") as tp_btf programs see them: the
// parameters of the function prototype behind typedef btf_trace_<name> in `btf`, minus the
// leading `void *__data` (include/trace/bpf_probe.h declares the typedef as
// `void (*)(void *__data, <TP_PROTO>)`). sched_switch has 3 before Linux 5.18 and 4 from it
// (prev_state, commit fa2c3254d7cf). Returns -ENOENT when the typedef is missing, -EINVAL when it
// is not a pointer to a function prototype.
int TracepointArgCount(const struct btf* btf, const char* name);


}  // namespace parascope
