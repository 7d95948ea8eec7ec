// Environment probes run before anything is loaded, so a missing privilege or kernel feature is
// reported as what to grant or enable, or which Linux version has it, not as a libbpf or verifier
// error deep in a load. The floor is Linux 5.10 with BTF (README, "Requirements and limits").
#pragma once

#include <linux/bpf.h>

#include <cstdint>
#include <memory>

#include "absl/status/status.h"

struct btf;

namespace parascope {

// Checks, in order: kernel BTF at /sys/kernel/btf/vmlinux (CONFIG_DEBUG_INFO_BTF=y, needed for
// CO-RE); the bpf(2) syscall can load a perf_event program (root or CAP_BPF + CAP_PERFMON;
// kernel.unprivileged_bpf_disabled does not matter for those); then every program type, map
// type, helper and BTF type the programs rely on (CheckBpfFeatures). Errors: FailedPrecondition
// or PermissionDenied whose message says what to grant or enable, or which kernel feature is
// missing and the Linux version that added it.
absl::Status ProbeBpfEnvironment();

// The kernel facts CheckBpfFeatures needs, behind an interface so that the check and its messages
// are unit-tested without root or an old kernel (test/unit/bpf_probe_test.cc). Every method
// answers like libbpf 1.1's libbpf_probe_bpf_* functions: 1 present, 0 absent, < 0 a -errno when
// the probe itself failed (-EPERM, -EACCES: not privileged).
class BpfFeatureProber {
 public:
  virtual ~BpfFeatureProber() = default;
  // A program of `type` loads (a two-instruction program).
  virtual int ProgType(bpf_prog_type type) = 0;
  // A two-instruction BPF_PROG_TYPE_TRACING program with `attach` (BPF_TRACE_RAW_TP: tp_btf,
  // BPF_TRACE_ITER: iter) loads against the kernel's BTF type `btf_name` of kind `btf_kind`.
  // (libbpf 1.1's probe of the program type alone relies on the error message of an fentry
  // load, which the Linux 6.18 development VM refuses with EPERM and no message instead; this
  // loads what the programs load.)
  virtual int TracingProgram(bpf_attach_type attach, const char* btf_name, int btf_kind) = 0;
  // A map of `type` created with `flags` (BPF_F_*; 0 for none) can be created.
  virtual int MapType(bpf_map_type type, uint32_t flags) = 0;
  // A program of `type` may call `helper`.
  virtual int Helper(bpf_prog_type type, bpf_func_id helper) = 0;
  // The kernel's BTF has a type named `name` of kind `kind` (BTF_KIND_*, linux/btf.h).
  virtual int BtfType(const char* name, int kind) = 0;
  // Arguments of tracepoint `name` per the kernel's BTF (TracepointArgCount), or < 0.
  virtual int TracepointArgs(const char* name) = 0;
};

// Checks that the kernel has every program type, map type, helper and BTF type that bpf/*.bpf.c
// rely on (the list and the versions are in probe.cc; helpers were read off the compiled objects'
// call instructions). Returns OK; FailedPrecondition naming the first missing feature and the
// Linux version that added it, e.g. "this kernel lacks BPF ring buffers (BPF_MAP_TYPE_RINGBUF,
// Linux 5.8+); ..."; PermissionDenied when a probe was refused. Optional features, used where
// present with a fallback elsewhere (bpf_task_pt_regs, sched_switch's prev_state), are logged at
// debug level.
absl::Status CheckBpfFeatures(BpfFeatureProber& prober);

// The prober of the running kernel: libbpf_probe_bpf_prog_type / _map_type / _helper,
// bpf_map_create for map flags, and the BTF at /sys/kernel/btf/vmlinux (loaded on first use).
// Helpers of tracing programs (tp_btf, iter) are to be probed with BPF_PROG_TYPE_RAW_TRACEPOINT:
// libbpf cannot probe helpers for BPF_PROG_TYPE_TRACING (a load needs an attach target), and the
// kernel offers tracing programs every helper raw_tp programs have (kernel/trace/bpf_trace.c:
// tracing_prog_func_proto falls back to raw_tp_prog_func_proto).
std::unique_ptr<BpfFeatureProber> NewKernelFeatureProber();

// Arguments of tracepoint `name` (e.g. "sched_switch") as tp_btf programs see them: the
// parameters of the function prototype behind typedef btf_trace_<name> in `btf`, minus the
// leading `void *__data` (include/trace/bpf_probe.h declares the typedef as
// `void (*)(void *__data, <TP_PROTO>)`). sched_switch has 3 before Linux 5.18 and 4 from it
// (prev_state, commit fa2c3254d7cf). Returns -ENOENT when the typedef is missing, -EINVAL when it
// is not a pointer to a function prototype.
int TracepointArgCount(const struct btf* btf, const char* name);

// True when `btf` has a struct `struct_name` with a member `member` (of any type): a kernel
// feature read from the kernel's BTF rather than its version, so that a backport counts.
bool StructHasMember(const struct btf* btf, const char* struct_name, const char* member);

}  // namespace parascope
