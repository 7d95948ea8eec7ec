#include "agent/bpf/probe.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/btf.h>
#include <linux/capability.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "agent/util/log.h"

namespace parascope {
namespace {

constexpr char kFloor[] = "parascope needs Linux 5.10+ with BTF";

// Effective capability check through capget(2) (include/uapi/linux/capability.h, v3: two
// 32-bit words). CAP_PERFMON (38) and CAP_BPF (39) exist since Linux 5.8.
bool HasEffectiveCapability(int cap) {
  __user_cap_header_struct hdr{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[2] = {};
  if (syscall(SYS_capget, &hdr, data) != 0) return false;
  return (data[cap / 32].effective >> (cap % 32)) & 1;
}

// What the programs rely on. The versions are the releases that added each feature (the
// helpers' are those of include/uapi/linux/bpf.h's enum bpf_func_id entries, whose order follows
// the releases). Helpers were read off the call instructions of the compiled oncpu.bpf.o and
// sched.bpf.o (llvm-objdump -d); bpf_get_current_task_btf and bpf_task_pt_regs are left out:
// they are called only where bpf_core_enum_value_exists() finds them (bpf/unwind.bpf.h), which
// the verifier's dead-code pass removes elsewhere; bpf_find_vma only in ps_on_cpu_sample_vma
// and ps_process_exec_vma, loaded only where it is probed (agent/bpf/programs.cc).
struct ProgTypeNeed {
  bpf_prog_type type;
  const char* what;
};
constexpr ProgTypeNeed kProgTypes[] = {
    {BPF_PROG_TYPE_PERF_EVENT,
     "BPF perf_event programs (BPF_PROG_TYPE_PERF_EVENT, CONFIG_BPF_EVENTS, Linux 4.9+)"},
    // Not used itself: the stand-in on which tracing programs' helpers are probed.
    {BPF_PROG_TYPE_RAW_TRACEPOINT,
     "raw tracepoint programs (BPF_PROG_TYPE_RAW_TRACEPOINT, Linux 4.17+)"},
};

struct MapTypeNeed {
  bpf_map_type type;
  uint32_t flags;
  const char* what;
};
constexpr MapTypeNeed kMapTypes[] = {
    {BPF_MAP_TYPE_HASH, 0, "BPF hash maps (BPF_MAP_TYPE_HASH, Linux 3.19+)"},
    {BPF_MAP_TYPE_ARRAY, 0, "BPF array maps (BPF_MAP_TYPE_ARRAY, Linux 3.19+)"},
    {BPF_MAP_TYPE_PERCPU_ARRAY, 0, "per-CPU BPF arrays (BPF_MAP_TYPE_PERCPU_ARRAY, Linux 4.6+)"},
    {BPF_MAP_TYPE_RINGBUF, 0, "BPF ring buffers (BPF_MAP_TYPE_RINGBUF, Linux 5.8+)"},
    {BPF_MAP_TYPE_ARRAY, BPF_F_MMAPABLE, "mmap-able BPF arrays (BPF_F_MMAPABLE, Linux 5.5+)"},
};

struct HelperNeed {
  bpf_func_id helper;
  const char* name;
  const char* since;
  bool sampler;  // called by the perf_event program (oncpu.bpf.c)
  bool tracing;  // called by the tp_btf or iter programs (both objects)
};
constexpr HelperNeed kHelpers[] = {
    {BPF_FUNC_map_lookup_elem, "bpf_map_lookup_elem", "3.19", true, true},
    {BPF_FUNC_map_update_elem, "bpf_map_update_elem", "3.19", true, true},
    {BPF_FUNC_map_delete_elem, "bpf_map_delete_elem", "3.19", false, true},
    {BPF_FUNC_ktime_get_ns, "bpf_ktime_get_ns", "4.1", true, true},
    {BPF_FUNC_get_prandom_u32, "bpf_get_prandom_u32", "4.1", false, true},
    {BPF_FUNC_get_current_pid_tgid, "bpf_get_current_pid_tgid", "4.2", true, true},
    {BPF_FUNC_get_current_comm, "bpf_get_current_comm", "4.2", true, true},
    {BPF_FUNC_get_current_task, "bpf_get_current_task", "4.8", true, true},
    {BPF_FUNC_get_stack, "bpf_get_stack", "4.18", true, true},
    {BPF_FUNC_probe_read_user, "bpf_probe_read_user", "5.5", true, true},
    {BPF_FUNC_probe_read_kernel, "bpf_probe_read_kernel", "5.5", true, true},
    {BPF_FUNC_probe_read_kernel_str, "bpf_probe_read_kernel_str", "5.5", false, true},
    {BPF_FUNC_ringbuf_reserve, "bpf_ringbuf_reserve", "5.8", true, true},
    {BPF_FUNC_ringbuf_submit, "bpf_ringbuf_submit", "5.8", true, true},
    {BPF_FUNC_get_task_stack, "bpf_get_task_stack", "5.9", false, true},
};

// Types the kernel's BTF must have: tp_btf programs attach through btf_trace_<tracepoint>, the
// task iterator through bpf_iter_task (kernel/bpf/task_iter.c DEFINE_BPF_ITER_FUNC).
struct BtfNeed {
  const char* name;
  int kind;
  const char* what;
};
constexpr BtfNeed kBtfTypes[] = {
    {"btf_trace_sched_switch", BTF_KIND_TYPEDEF,
     "the sched_switch tracepoint in its BTF (btf_trace_sched_switch, for tp_btf, Linux 5.5+)"},
    {"btf_trace_sched_process_exit", BTF_KIND_TYPEDEF,
     "the sched_process_exit tracepoint in its BTF (btf_trace_sched_process_exit, for tp_btf, "
     "Linux 5.5+)"},
    {"btf_trace_sched_process_exec", BTF_KIND_TYPEDEF,
     "the sched_process_exec tracepoint in its BTF (btf_trace_sched_process_exec, for tp_btf, "
     "Linux 5.5+)"},
    {"bpf_iter_task", BTF_KIND_FUNC, "the BPF task iterator (iter/task, Linux 5.8+)"},
};

// BPF_PROG_TYPE_TRACING programs as the objects have them, each loaded against its BTF target
// (after kBtfTypes has found the targets).
struct TracingNeed {
  bpf_attach_type attach;
  const char* btf_name;
  int btf_kind;
  const char* what;
};
constexpr TracingNeed kTracing[] = {
    {BPF_TRACE_RAW_TP, "btf_trace_sched_switch", BTF_KIND_TYPEDEF,
     "BTF-typed tracepoint programs (tp_btf: BPF_PROG_TYPE_TRACING, BPF_TRACE_RAW_TP, Linux "
     "5.5+)"},
    {BPF_TRACE_ITER, "bpf_iter_task", BTF_KIND_FUNC,
     "BPF task iterators (iter/task: BPF_PROG_TYPE_TRACING, BPF_TRACE_ITER, Linux 5.8+)"},
};

const char* ProgTypeName(bpf_prog_type type) {
  const char* n = libbpf_bpf_prog_type_str(type);
  return n != nullptr ? n : "?";
}

// The status for a probe result < 0.
absl::Status ProbeFailed(int rc, absl::string_view what) {
  if (rc == -EPERM || rc == -EACCES) {
    return absl::PermissionDeniedError(absl::StrCat(
        "probing ", what, " was denied: run parascope as root, or grant CAP_BPF, CAP_PERFMON, "
        "CAP_SYS_PTRACE and CAP_SYSLOG (CAP_SYS_ADMIN before Linux 5.8)"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("probing ", what, " failed: ", std::strerror(-rc)));
}

absl::Status Lacks(absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat("this kernel lacks ", what, "; ", kFloor));
}

class KernelFeatureProber : public BpfFeatureProber {
 public:
  ~KernelFeatureProber() override {
    if (btf_ != nullptr) btf__free(btf_);
  }
  int ProgType(bpf_prog_type type) override { return libbpf_probe_bpf_prog_type(type, nullptr); }
  int TracingProgram(bpf_attach_type attach, const char* btf_name, int btf_kind) override {
    if (int rc = LoadBtf(); rc < 0) return rc;
    int id = btf__find_by_name_kind(btf_, btf_name, btf_kind);
    if (id <= 0) return 0;
    const bpf_insn insns[] = {
        {BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 0},  // r0 = 0
        {BPF_JMP | BPF_EXIT, 0, 0, 0, 0},                   // exit
    };
    LIBBPF_OPTS(bpf_prog_load_opts, opts, .expected_attach_type = attach,
                .attach_btf_id = static_cast<uint32_t>(id));
    int fd = bpf_prog_load(BPF_PROG_TYPE_TRACING, "ps_probe", "GPL", insns, 2, &opts);
    if (fd >= 0) {
      close(fd);
      return 1;
    }
    int err = errno;
    return err == EPERM || err == EACCES ? -err : 0;
  }
  int MapType(bpf_map_type type, uint32_t flags) override {
    if (flags == 0) return libbpf_probe_bpf_map_type(type, nullptr);
    LIBBPF_OPTS(bpf_map_create_opts, opts, .map_flags = flags);
    int fd = bpf_map_create(type, "ps_probe", sizeof(uint32_t), sizeof(uint32_t), 1, &opts);
    if (fd >= 0) {
      close(fd);
      return 1;
    }
    int err = errno;
    return err == EINVAL || err == E2BIG ? 0 : -err;
  }
  int Helper(bpf_prog_type type, bpf_func_id helper) override {
    return libbpf_probe_bpf_helper(type, helper, nullptr);
  }
  int BtfType(const char* name, int kind) override {
    if (int rc = LoadBtf(); rc < 0) return rc;
    return btf__find_by_name_kind(btf_, name, kind) > 0 ? 1 : 0;
  }
  int TracepointArgs(const char* name) override {
    if (int rc = LoadBtf(); rc < 0) return rc;
    return TracepointArgCount(btf_, name);
  }

 private:
  // Loads the kernel's BTF once. Returns 0 or -errno.
  int LoadBtf() {
    if (btf_ == nullptr) btf_ = btf__load_vmlinux_btf();
    return btf_ != nullptr ? 0 : (errno != 0 ? -errno : -ENOENT);
  }
  btf* btf_ = nullptr;
};

}  // namespace

bool StructHasMember(const struct btf* btf, const char* struct_name, const char* member) {
  const int id = btf__find_by_name_kind(btf, struct_name, BTF_KIND_STRUCT);
  if (id <= 0) return false;
  const btf_type* t = btf__type_by_id(btf, id);
  const btf_member* m = btf_members(t);
  for (int i = 0; i < btf_vlen(t); ++i, ++m) {
    if (std::strcmp(btf__name_by_offset(btf, m->name_off), member) == 0) return true;
  }
  return false;
}

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

std::unique_ptr<BpfFeatureProber> NewKernelFeatureProber() {
  return std::make_unique<KernelFeatureProber>();
}

absl::Status CheckBpfFeatures(BpfFeatureProber& prober) {
  for (const ProgTypeNeed& p : kProgTypes) {
    int rc = prober.ProgType(p.type);
    if (rc < 0) return ProbeFailed(rc, p.what);
    if (rc == 0) return Lacks(p.what);
  }
  for (const MapTypeNeed& m : kMapTypes) {
    int rc = prober.MapType(m.type, m.flags);
    if (rc < 0) return ProbeFailed(rc, m.what);
    if (rc == 0) return Lacks(m.what);
  }
  for (const HelperNeed& h : kHelpers) {
    for (bpf_prog_type type : {BPF_PROG_TYPE_PERF_EVENT, BPF_PROG_TYPE_RAW_TRACEPOINT}) {
      if (!(type == BPF_PROG_TYPE_PERF_EVENT ? h.sampler : h.tracing)) continue;
      const std::string what =
          absl::StrCat("the BPF helper ", h.name, " in ",
                       type == BPF_PROG_TYPE_PERF_EVENT ? "perf_event" : "tracing",
                       " programs (Linux ", h.since, "+)");
      int rc = prober.Helper(type, h.helper);
      if (rc < 0) return ProbeFailed(rc, what);
      if (rc == 0) return Lacks(what);
    }
  }
  for (const BtfNeed& b : kBtfTypes) {
    int rc = prober.BtfType(b.name, b.kind);
    if (rc < 0) return ProbeFailed(rc, b.what);
    if (rc == 0) return Lacks(b.what);
  }
  for (const TracingNeed& t : kTracing) {
    int rc = prober.TracingProgram(t.attach, t.btf_name, t.btf_kind);
    if (rc < 0) return ProbeFailed(rc, t.what);
    if (rc == 0) return Lacks(t.what);
  }
  int args = prober.TracepointArgs("sched_switch");
  if (args < 0) return ProbeFailed(args, "the sched_switch tracepoint's arguments in the BTF");
  if (args < 3) {
    return Lacks(absl::StrCat("a sched_switch tracepoint with (preempt, prev, next) arguments "
                              "(its BTF shows ", args, ")"));
  }
  // Optional: used where present, with the fallback named.
  Log(LogLevel::kDebug, "sched_switch passes prev_state (Linux 5.18+): %s",
      args >= 4 ? "yes, ps_sched_switch uses it"
                : "no, ps_sched_switch3 reads prev's task_struct state instead");
  for (bpf_prog_type type : {BPF_PROG_TYPE_PERF_EVENT, BPF_PROG_TYPE_RAW_TRACEPOINT}) {
    int rc = prober.Helper(type, BPF_FUNC_task_pt_regs);
    Log(LogLevel::kDebug, "bpf_task_pt_regs in %s programs (Linux 5.15+): %s", ProgTypeName(type),
        rc == 1 ? "yes, used for user registers"
                : "no, user registers are found from task_struct::stack instead");
  }
  return absl::OkStatus();
}

absl::Status ProbeBpfEnvironment() {
  struct stat st;
  if (stat("/sys/kernel/btf/vmlinux", &st) != 0) {
    return absl::FailedPreconditionError(
        "kernel BTF not found at /sys/kernel/btf/vmlinux: parascope's CO-RE BPF programs need a "
        "kernel built with CONFIG_DEBUG_INFO_BTF=y (default on Debian 11+, Ubuntu 20.10+, RHEL "
        "8.2+); parascope needs Linux 5.10+ with BTF");
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
  if (rc == -EPERM || rc == -EACCES) {
    return absl::PermissionDeniedError(
        "loading BPF programs was denied: run parascope as root, or grant CAP_BPF, CAP_PERFMON, "
        "CAP_SYS_PTRACE and CAP_SYSLOG (CAP_SYS_ADMIN before Linux 5.8)");
  }
  if (rc == 0) {
    return absl::FailedPreconditionError(
        "this kernel does not support BPF perf_event programs (CONFIG_BPF_EVENTS)");
  }
  if (rc < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("probing BPF support failed: ", std::strerror(-rc),
                     (geteuid() != 0 ? " (not running as root)" : "")));
  }
  std::unique_ptr<BpfFeatureProber> prober = NewKernelFeatureProber();
  return CheckBpfFeatures(*prober);
}

}  // namespace parascope
