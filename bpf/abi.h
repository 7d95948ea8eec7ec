/* parascope kernel/daemon ABI: the one header both bpf/ and agent/ include.
 *
 * Rules (ARCHITECTURE.md, convention 2): fixed-width fields only, no bool/pointers/enums inside
 * shared structs, every pid field says tgid or tid, every name carries the ps_ / PS_ prefix
 * (vmlinux.h already defines names such as `struct sample`). Sizes are pinned with
 * _Static_assert so both compilers agree on the layout.
 */
#ifndef PARASCOPE_BPF_ABI_H_
#define PARASCOPE_BPF_ABI_H_

#ifdef __bpf__
/* vmlinux.h provides __u32/__u64 in BPF builds. */
#else
#include <linux/types.h>
#endif

#ifdef __cplusplus
#define PS_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define PS_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

/* Deepest stack recorded, in frames. Equals the default of kernel.perf_event_max_stack
 * (include/uapi/linux/perf_event.h PERF_MAX_STACK_DEPTH); bpf_get_stackid() rejects a stack map
 * whose value is larger than that sysctl allows. */
#define PS_MAX_STACK_DEPTH 127

/* Length of task_struct::comm (include/linux/sched.h TASK_COMM_LEN). */
#define PS_TASK_COMM_LEN 16

/* Number of on-CPU aggregation buffers. The daemon drains one while the BPF program fills the
 * other, so samples taken during a drain land in the next window instead of being lost. */
#define PS_NUM_BUFFERS 2

/* A stack as copied by bpf_get_stack(): `len` frames, leaf first; entries past `len` are
 * garbage. Stored once per buffer in ps_stacks<N>, keyed by ps_stack_hash() of its frames. */
struct ps_stack {
  __u32 len; /* number of valid frames in ips */
  __u32 pad;
  __u64 ips[PS_MAX_STACK_DEPTH];
};
PS_STATIC_ASSERT(sizeof(struct ps_stack) == 1024, "ps_stack layout");

/* Key of the on-CPU aggregation hash: one entry per distinct (thread, user stack, kernel stack)
 * in a window. A stack field is the 64-bit hash keying ps_stacks<N> of the same buffer, or 0 when
 * there is no such stack; then the matching *_stack_err holds -errno from bpf_get_stack()
 * (0: legitimately empty, e.g. a kernel thread's user stack or a sample taken in user mode). */
struct ps_oncpu_key {
  __u32 tgid;            /* process id (thread group id) */
  __u32 tid;             /* thread id */
  __u64 tgid_start_ns;   /* group leader's start_boottime, ns since boot: process identity */
  __u64 user_stack;      /* ps_stacks<N> key, 0 = none */
  __u64 kernel_stack;    /* ps_stacks<N> key, 0 = none */
  __s32 user_stack_err;  /* 0, or -errno when the user stack was lost */
  __s32 kernel_stack_err;
};
PS_STATIC_ASSERT(sizeof(struct ps_oncpu_key) == 40, "ps_oncpu_key layout");

/* Value of the on-CPU aggregation hash. */
struct ps_oncpu_value {
  __u64 count;      /* samples */
  __u64 period_sum; /* sum of the samples' periods, in the event's unit (ns for cpu-clock) */
  char comm[PS_TASK_COMM_LEN]; /* thread name at the first sample */
};
PS_STATIC_ASSERT(sizeof(struct ps_oncpu_value) == 32, "ps_oncpu_value layout");

/* Per-CPU failure and activity counters (index into the ps_counters per-CPU array). The daemon
 * sums them over CPUs and exports them; names mirror SPEC section 7. */
#define PS_CTR_SAMPLES 0                /* perf_event program invocations on a non-idle task */
#define PS_CTR_SAMPLES_IDLE 1           /* samples of the idle task (pid 0), not recorded */
#define PS_CTR_SAMPLES_FILTERED 2       /* samples of processes excluded by the pid filter */
#define PS_CTR_USER_STACK_FAULT 3       /* bpf_get_stack(user) failed for a task with an mm */
#define PS_CTR_KERNEL_STACK_FAULT 4     /* bpf_get_stack(kernel) failed */
#define PS_CTR_STACK_MAP_FULL 5         /* ps_stacks<N> insert failed: stack replaced by error */
#define PS_CTR_AGG_MAP_FULL 6           /* ps_oncpu<N> insert failed: sample lost */
#define PS_CTR_NUM 7

/* Default capacities; the daemon sizes ps_stacks<N> and ps_oncpu<N> before load from the CPU count,
 * frequency and window (agent/bpf/oncpu_program.cc). Entries are preallocated (perf_event programs
 * may only use preallocated hash maps): about sizeof(struct ps_stack) bytes per stack entry. */
#define PS_STACK_MAP_ENTRIES 4096
#define PS_ONCPU_MAP_ENTRIES 4096
#define PS_PID_FILTER_ENTRIES 1024

#endif /* PARASCOPE_BPF_ABI_H_ */
