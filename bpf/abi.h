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
  __u32 parallelism;     /* threads of tgid on a CPU at the sample instant (>= 1) */
  __u32 flags;           /* PS_SAMPLE_* */
};
PS_STATIC_ASSERT(sizeof(struct ps_oncpu_key) == 48, "ps_oncpu_key layout");

/* ps_oncpu_key.flags: parallelism could be wrong, because when the sample was taken some CPU had
 * not been seen switching or sampling since attach (its task's process was not counted). */
#define PS_SAMPLE_PARALLELISM_UNKNOWN 1

/* Value of the on-CPU aggregation hash. */
struct ps_oncpu_value {
  __u64 count;      /* samples */
  __u64 period_sum; /* sum of the samples' periods, in the event's unit (ns for cpu-clock) */
  char comm[PS_TASK_COMM_LEN]; /* thread name at the first sample */
};
PS_STATIC_ASSERT(sizeof(struct ps_oncpu_value) == 32, "ps_oncpu_value layout");

/* Thread states of the off-CPU and wall profiles (SPEC section 2). */
#define PS_STATE_RUNNING 0          /* on a CPU (wall profile only) */
#define PS_STATE_RUNNABLE 1         /* preempted, still TASK_RUNNING: run-queue delay */
#define PS_STATE_SLEEPING 2         /* TASK_INTERRUPTIBLE (and other voluntary waits) */
#define PS_STATE_UNINTERRUPTIBLE 3  /* TASK_UNINTERRUPTIBLE, e.g. disk I/O */

/* A stack error that is not an errno: the thread was already asleep when the agent attached, so
 * its user stack at switch-out was never seen (ps_thread_state.user_stack_err). */
#define PS_ERR_ASLEEP_AT_ATTACH (-100000)

/* Stack errors that are not errnos: the switch-out was not chosen for stack capture (off-CPU stack
 * sampling, see ps_thread_state.stack_weight). For the kernel stack of an interval of 1 ms or more
 * the sched_switch program takes the sleeping thread's kernel stack at switch-in instead. */
#define PS_ERR_NOT_CAPTURED (-100001)

/* Off-CPU stack sampling (--off-cpu-stack-rate R): walking two stacks is ~90% of the cost of a
 * switch (measured: 5.5 us per event with stacks, 0.6 us without, on the 2-CPU PVM guest). A
 * thread that switched out more than R times per second in its last rate period
 * (PS_RATE_PERIOD_NS) has the stacks of each switch-out captured with probability 1/w, w =
 * floor(rate / R). At switch-in, a captured interval shorter than PS_EXACT_OFFCPU_NS counts w
 * times (ns and count), so sums stay unbiased; intervals of PS_EXACT_OFFCPU_NS or more are
 * always kept exactly once (uncaptured ones with the kernel stack taken at switch-in and the
 * user stack PS_ERR_NOT_CAPTURED). Uncaptured shorter intervals are represented by the
 * weighted ones. R = 0 captures every switch-out. */
#define PS_RATE_PERIOD_NS 100000000ULL  /* 100 ms */
#define PS_EXACT_OFFCPU_NS 1000000ULL   /* 1 ms */
#define PS_MAX_STACK_WEIGHT 65536

/* Control block shared by every program (ps_control, array of 1), written by the daemon at each
 * window boundary: the buffer to fill and the window start on CLOCK_MONOTONIC
 * (bpf_ktime_get_ns). */
struct ps_control {
  __u32 active_buffer;       /* 0 or 1 */
  __u32 pad;
  __u64 window_start_ns;     /* ktime of the current window's start */
  __s64 unknown_cpus;        /* online CPUs not yet seen by a switch or a sample since attach */
};
PS_STATIC_ASSERT(sizeof(struct ps_control) == 24, "ps_control layout");

/* Per-thread switch-out state (ps_threads hash, key = tid). An off-CPU interval is accounted by
 * BPF at switch-in from max(out_ns, window start); the part before the window start is left to
 * the daemon: for an interval still running at a boundary it reads out_ns, and for one that ended
 * after the boundary but before the daemon looked, BPF copied it to the carry_* fields first. */
struct ps_thread_state {
  __u64 out_ns;             /* ktime at switch-out; 0 while the thread is on a CPU */
  __u64 tgid_start_ns;
  __u64 user_stack;         /* ps_stacks<N> key at switch-out (0 = none) */
  __u64 kernel_stack;
  __s32 user_stack_err;
  __s32 kernel_stack_err;
  __u32 tgid;
  __u32 state;              /* PS_STATE_* at switch-out */
  /* The interval that crossed window start carry_ws_ns, copied at its switch-in. */
  __u64 carry_ws_ns;
  __u64 carry_out_ns;
  __u64 carry_user_stack;
  __u64 carry_kernel_stack;
  __s32 carry_user_stack_err;
  __s32 carry_kernel_stack_err;
  __u32 carry_state;
  __u32 carry_min_ok;       /* the interval is to be counted (>= the minimum off-CPU duration,
                               and, if its stacks were not captured, >= PS_EXACT_OFFCPU_NS) */
  char comm[PS_TASK_COMM_LEN];
  /* Off-CPU stack sampling (PS_RATE_PERIOD_NS above). */
  __u64 rate_start_ns;      /* start of the current rate period */
  __u32 rate_count;         /* switch-outs in it */
  __u32 sample_weight;      /* w from the last period (0 or 1: capture every switch-out) */
  __u32 stack_weight;       /* this switch-out: w if its stacks were captured, 0 if not */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_thread_state) == 136, "ps_thread_state layout");

/* Key of the off-CPU aggregate (ps_offcpu<N>): time a thread spent off-CPU with one stack and
 * state. Stack fields as in ps_oncpu_key. */
struct ps_offcpu_key {
  __u32 tgid;
  __u32 tid;
  __u64 tgid_start_ns;
  __u64 user_stack;
  __u64 kernel_stack;
  __s32 user_stack_err;
  __s32 kernel_stack_err;
  __u32 state;  /* PS_STATE_RUNNABLE, _SLEEPING or _UNINTERRUPTIBLE */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_offcpu_key) == 48, "ps_offcpu_key layout");

struct ps_offcpu_value {
  __u64 ns;     /* off-CPU nanoseconds */
  __u64 count;  /* intervals (or interval parts) */
  char comm[PS_TASK_COMM_LEN];
};
PS_STATIC_ASSERT(sizeof(struct ps_offcpu_value) == 32, "ps_offcpu_value layout");

/* Per-CPU scheduler view (ps_cpu_state, per-CPU array of 1): the task on this CPU and, for the
 * exact on-CPU time per process, since when. Same carry scheme as ps_thread_state. */
struct ps_cpu_state {
  __u32 tid;          /* task on this CPU, 0 = idle */
  __u32 tgid;
  __u64 tgid_start_ns;
  __u64 in_ns;        /* ktime it was switched in (first seen; or estimated, see below) */
  __u64 known;        /* 1 once this CPU's current task is known (64-bit for atomic xchg) */
  __u32 counted;      /* 1 when the task is counted in ps_running */
  __u32 carry_tgid;
  __u64 carry_ws_ns;
  __u64 carry_in_ns;
  __u64 carry_tgid_start_ns;
  __u64 sample_ns;    /* ktime of the last on-CPU sample on this CPU (0: none yet) */
  __u32 in_switch;    /* 1 while sched_switch updates this entry (an NMI sample must not) */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_cpu_state) == 80, "ps_cpu_state layout");

/* Switches the sched_switch tracepoint did not report. On some hosts the tracepoint misses a
 * share of switches (seen on a PVM guest: switches out of the host agent's threads, ~2-7% of all
 * switches, also with bpftrace alone). They are detected two ways: a switch whose prev is not the
 * task the previous reported switch on that CPU brought in (a broken prev/next chain), and an
 * on-CPU sample whose interrupted task is not the one recorded for its CPU. Either way the stale
 * record's parallelism count is returned and the real task is counted from an estimated switch-in
 * time (the midpoint of the span in which the unseen switch must have happened), so the
 * per-process running counts equal the CPUs running each process again and do not drift. */

/* Key of the exact on-CPU time per process and window (ps_runtime<N>, value __u64 ns). */
struct ps_runtime_key {
  __u32 tgid;
  __u32 pad;
  __u64 tgid_start_ns;
};
PS_STATIC_ASSERT(sizeof(struct ps_runtime_key) == 16, "ps_runtime_key layout");

/* Per-CPU failure and activity counters (index into the ps_counters per-CPU array). The daemon
 * sums them over CPUs and exports them; names mirror SPEC section 7. */
#define PS_CTR_SAMPLES 0                /* perf_event program invocations on a non-idle task */
#define PS_CTR_SAMPLES_IDLE 1           /* samples of the idle task (pid 0), not recorded */
#define PS_CTR_SAMPLES_FILTERED 2       /* samples of processes excluded by the pid filter */
#define PS_CTR_USER_STACK_FAULT 3       /* bpf_get_stack(user) failed for a task with an mm */
#define PS_CTR_KERNEL_STACK_FAULT 4     /* bpf_get_stack(kernel) failed */
#define PS_CTR_STACK_MAP_FULL 5         /* ps_stacks<N> insert failed: stack replaced by error */
#define PS_CTR_AGG_MAP_FULL 6           /* ps_oncpu<N> insert failed: sample lost */
#define PS_CTR_SWITCHES 7               /* sched_switch events */
#define PS_CTR_THREAD_MAP_FULL 8        /* ps_threads insert failed: an off-CPU interval lost */
#define PS_CTR_OFFCPU_MAP_FULL 9        /* ps_offcpu<N> insert failed */
#define PS_CTR_RUNNING_MAP_FULL 10      /* ps_running insert failed: parallelism undercounted */
#define PS_CTR_RUNTIME_MAP_FULL 11      /* ps_runtime<N> insert failed */
#define PS_CTR_SAMPLES_PARALLELISM_UNKNOWN 12 /* samples flagged PS_SAMPLE_PARALLELISM_UNKNOWN */
#define PS_CTR_SWITCH_CHAIN_BREAKS 13   /* sched_switch whose prev was not the CPU's recorded task */
#define PS_CTR_SAMPLE_REPAIRS 14        /* samples that found a task switched in unseen */
#define PS_CTR_OFFCPU_NOT_CAPTURED 15   /* switch-outs whose stacks were not captured (sampling) */
#define PS_CTR_OFFCPU_WEIGHTED 16       /* short intervals counted w times for the uncaptured */
#define PS_CTR_NUM 17

/* Default capacities; the daemon sizes ps_stacks<N> and ps_oncpu<N> before load from the CPU count,
 * frequency and window (agent/bpf/oncpu_program.cc). Entries are preallocated (perf_event programs
 * may only use preallocated hash maps): about sizeof(struct ps_stack) bytes per stack entry. */
#define PS_STACK_MAP_ENTRIES 4096
#define PS_ONCPU_MAP_ENTRIES 4096
#define PS_PID_FILTER_ENTRIES 1024
#define PS_THREAD_MAP_ENTRIES 65536  /* threads tracked off-CPU at once (not preallocated) */
#define PS_RUNNING_ENTRIES 32768     /* processes with a parallelism count */
#define PS_OFFCPU_MAP_ENTRIES 16384
#define PS_RUNTIME_MAP_ENTRIES 8192

#endif /* PARASCOPE_BPF_ABI_H_ */
