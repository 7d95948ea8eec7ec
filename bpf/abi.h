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

/* A stack: `len` frames, leaf first; entries past `len` are garbage. Kernel stacks come from
 * bpf_get_stack(); user stacks from the unwinder (bpf/unwind.bpf.h), whose outcome is in `flags`
 * (PS_UNWIND_*). Stored once per buffer in its writer's map, ps_stacks<N> (on-CPU sampler) or
 * ps_sched_stacks<N> (sched_switch), keyed by ps_stack_hash() of its frames. */
struct ps_stack {
  __u32 len;   /* number of valid frames in ips */
  __u32 flags; /* user stacks: PS_UNWIND_* outcome (0 for kernel stacks) */
  __u64 ips[PS_MAX_STACK_DEPTH];
};
PS_STATIC_ASSERT(sizeof(struct ps_stack) == 1024, "ps_stack layout");

/* Process identity, in every key and record: (tgid, tgid_start_ns, exec_id). tgid_start_ns
 * (the group leader's start_boottime) tells a reused pid from the process it had before;
 * exec_id tells the programs one process runs one after another (execve keeps tgid and start
 * time): the low 32 bits of task_struct::self_exec_id, which begin_new_exec() increments
 * (fs/exec.c) and fork/clone copy, so every thread of a process has its value. Its absolute value
 * counts the execs in the process's ancestry; only equality means anything. */

/* Key of the on-CPU aggregation hash: one entry per distinct (thread, user stack, kernel stack)
 * in a window. A stack field is the 64-bit hash keying ps_stacks<N> of the same buffer, or 0 when
 * there is no such stack; then the matching *_stack_err holds -errno from bpf_get_stack() or
 * from storing the stack (-E2BIG: map full, -EBUSY: map busy) (0: legitimately empty, e.g. a
 * kernel thread's user stack or a sample taken in user mode). */
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
  __u32 exec_id;         /* ps_exec_id(): which program the process runs (changes at execve) */
  __u32 pad;
  __u64 group;           /* the parallelism group (PS_GROUP_*): tgid, cgroup v2 id or tree root */
};
PS_STATIC_ASSERT(sizeof(struct ps_oncpu_key) == 64, "ps_oncpu_key layout");

/* --latency-group (SPEC section 2): what shares one parallelism count, the key of ps_running.
 *  - PS_GROUP_PROCESS: the tgid. The entry goes with the process's last thread (exit hook).
 *  - PS_GROUP_CGROUP: the id of the task's cgroup on the default (v2) hierarchy,
 *    task->cgroups->dfl_cgrp->kn->id (what bpf_get_current_cgroup_id() returns, and the inode
 *    number of the cgroup's directory in cgroup2fs). The entry goes when the cgroup is removed
 *    (tracepoints cgroup:cgroup_rmdir, and cgroup_release when the kernel frees it).
 *  - PS_GROUP_TREE: the tgid of the tree's root, the value of the process's ps_pid_filter entry.
 *    A new process joins its parent's tree at fork (sched_process_fork, before it first runs)
 *    and leaves it at its last thread's exit; the root's count lives as long as the agent (one
 *    root per command mode run).
 * So ps_running holds at most one entry per live process, live cgroup or root (bounded by
 * PS_RUNNING_ENTRIES; an insert beyond it is counted, PS_CTR_RUNNING_MAP_FULL). */
#define PS_GROUP_PROCESS 0
#define PS_GROUP_CGROUP 1
#define PS_GROUP_TREE 2

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
 * sampling, see ps_thread_state.stack_weight and budget_weight). For the kernel stack of an
 * interval that counts once, exactly (ps_offcpu_weight), the sched_switch program takes the
 * sleeping thread's kernel stack at switch-in instead. */
#define PS_ERR_NOT_CAPTURED (-100001)

/* Not a stack: a ps_offcpu<N> record with this as both stack errors (stacks 0, state 0) carries
 * an exiting thread's ps_uncaptured sums of the window, which its state, freed with the thread,
 * can no longer give the daemon (sched.bpf.c ps_hand_over_uncaptured): one key for the three
 * states, in ps_offcpu_value's fields ns (runnable), sampled_ns (sleeping) and sampled_raw_ns
 * (uninterruptible). Written only when the sums reach PS_EXACT_OFFCPU_NS: each key is taken
 * from the window's buffer, which process churn fills with real intervals. */
#define PS_ERR_UNCAPTURED_SUM (-100002)

/* Off-CPU stack sampling (--off-cpu-stack-rate R): walking two stacks is ~90% of the cost of a
 * switch (measured: 5.5 us per event with stacks, 0.6 us without, on the 2-CPU PVM guest). A
 * thread that switched out more than R times per second in its last rate period
 * (PS_RATE_PERIOD_NS) has the stacks of each switch-out captured with probability 1/w, w =
 * floor(rate / R). At switch-in, a captured interval shorter than PS_EXACT_OFFCPU_NS counts w
 * times (ns and count), so sums stay unbiased; this stage keeps intervals of PS_EXACT_OFFCPU_NS
 * or more exactly once (uncaptured ones with the kernel stack taken at switch-in and the user
 * stack PS_ERR_NOT_CAPTURED), unless the CPU's budget below samples them. Uncaptured shorter
 * intervals are represented by the weighted ones in the split across stacks; their exact length
 * makes the totals exact (ps_uncaptured). R = 0 captures every switch-out. */
#define PS_RATE_PERIOD_NS 100000000ULL  /* 100 ms */
#define PS_EXACT_OFFCPU_NS 1000000ULL   /* 1 ms */
#define PS_MAX_STACK_WEIGHT 65536

/* Machine-wide capture budget (--off-cpu-stack-budget B, captures per second per CPU): the
 * per-thread rate above leaves every thread of a busy host free to walk its stacks at each
 * switch-out (500 threads sleeping 1-10 ms: 90k walks a second on 2 CPUs). Each CPU therefore
 * counts the switch-outs the per-thread stage chose for capture (candidates) over a rate period;
 * when the last period had more than B per second, each candidate in the next one is captured
 * with probability 1/c, c = ceil(rate / B) (ps_cpu_state.budget_weight), so sampled captures
 * stay at or under B a second. The choice is made at switch-out, before the interval's length is
 * known, so weights keep sums unbiased: a captured interval shorter than PS_BUDGET_EXACT_OFFCPU_NS
 * counts c times (times w if also under PS_EXACT_OFFCPU_NS), an uncaptured one is represented by
 * them across stacks (its length still counts exactly in the totals: ps_uncaptured); intervals of
 * PS_BUDGET_EXACT_OFFCPU_NS or more always count once, exactly (uncaptured ones with the kernel
 * stack taken at switch-in), so a rare long stall is never lost or inflated, also across window
 * boundaries (ps_offcpu_weight_final). A thread whose last interval was that long
 * (ps_thread_state.last_long) has its next voluntary switch-out captured outside the budget,
 * weight 1, while the CPU has taken fewer than B such captures a second: a thread that mostly
 * waits long, the one whose waits matter, keeps its user stack (which switch-in cannot take: the
 * thread's memory is not current then). So a CPU captures at most 2B a second. B = 0: no budget.
 *
 * The budget in CPU time (--off-cpu-stack-cpu-budget P, ps_cfg_stack_cpu_ns: P% of a second, in
 * ns): a capture's cost depends on the host (2-5 us on the VM the budget B was tuned on; on a
 * 6.18 guest of the same kind 5 us warm and 10-35 us cold: bpf_get_stack alone 4-10 us on first
 * call and 1 us when called again at once, the user walk 3-8 us; measured with the clock around
 * each), so B alone does not bound the CPU the walks take. Each CPU also sums the clock time of
 * its captures in the period (clock time: an NMI or, on a VM, steal time inside a capture counts
 * too); c is then at least ceil(rate * m / T), m the mean cost of a capture in the last period
 * that had one and T the allowance in ns per second, so that candidates take at most about P% of
 * the CPU, on average over a period: the limit follows the last period, so the first busy
 * period after a quiet one, or one before any capture was timed, is not held to it. The exempt
 * captures stay within as much again (their count a period times m, within T / 10; unlimited in
 * time until a cost is known). The stricter of the two limits applies. P = 0: no limit in time.
 * This bounds the captures only, not the rest of the switch path. */
#define PS_BUDGET_EXACT_OFFCPU_NS 100000000ULL /* 100 ms */

/* How many times an off-CPU interval of `ns` counts (ns and count), given the stages' choices at
 * its switch-out (ps_thread_state.stack_weight and budget_weight): 0 = not counted. Used by BPF
 * at switch-in and by the daemon for an interval still running at a window boundary. The
 * minimum off-CPU duration (--off-cpu-min-duration) is applied apart. */
static inline __u64 ps_offcpu_weight(__u32 stack_weight, __u32 budget_weight, __u64 ns) {
  if (stack_weight == 0) /* not chosen by the per-thread stage */
    return ns >= PS_EXACT_OFFCPU_NS ? 1 : 0;
  if (budget_weight == 0) /* chosen, then not captured for the CPU's budget */
    return ns >= PS_BUDGET_EXACT_OFFCPU_NS ? 1 : 0;
  __u64 w = 1;
  if (ns < PS_EXACT_OFFCPU_NS) w *= stack_weight;
  if (ns < PS_BUDGET_EXACT_OFFCPU_NS) w *= budget_weight;
  return w;
}

/* Whether the weight of an interval `ns` long so far, and whether it reaches the minimum off-CPU
 * duration min_ns, stay the same however long it lasts. An interval running at a window boundary
 * is split there only once this holds at the boundary: the daemon then counts the part before it
 * (by this final weight), and BPF the part after, at switch-in. Until then the whole interval is
 * left to whichever sees it end or become final: BPF counts it at switch-in from its start, and
 * the daemon, at the first boundary where it is final, from its start too (so the part before a
 * boundary may land in the next window, by at most max(min_ns, PS_BUDGET_EXACT_OFFCPU_NS)).
 * Splitting by the weight so far would make a long interval's parts count different numbers of
 * times: its first 50 ms dropped or multiplied by c, then the rest once. */
static inline int ps_offcpu_weight_final(__u32 stack_weight, __u32 budget_weight, __u64 ns,
                                         __u64 min_ns) {
  if (ns < min_ns) return 0;
  if (stack_weight == 0) return ns >= PS_EXACT_OFFCPU_NS;
  if (budget_weight != 1 && ns < PS_BUDGET_EXACT_OFFCPU_NS) return 0;
  if (stack_weight != 1 && ns < PS_EXACT_OFFCPU_NS) return 0;
  return 1;
}

/* Control block shared by every program (ps_control, array of 1), written by the daemon at each
 * window boundary: the buffer to fill and the window start on CLOCK_MONOTONIC
 * (bpf_ktime_get_ns). */
struct ps_control {
  __u32 active_buffer;       /* 0 or 1 */
  __u32 pad;
  __u64 window_start_ns;     /* ktime of the current window's start */
  __s64 unknown_cpus;        /* online CPUs not yet seen by a switch or a sample since attach */
  /* The start of the window each buffer holds. The daemon writes the new buffer's before it
   * flips active_buffer (and window_start_ns), so a program that reads active_buffer, then
   * buffer_start_ns[active_buffer], gets a consistent pair; active_buffer and window_start_ns
   * read one after the other can pair the old buffer with the new start while the daemon is
   * between its two stores. */
  __u64 buffer_start_ns[PS_NUM_BUFFERS];
};
PS_STATIC_ASSERT(sizeof(struct ps_control) == 40, "ps_control layout");

/* Per-CPU progress of the programs (ps_progress, per-CPU array of 1): every program that reads
 * ps_control.active_buffer adds 1 to `depth` before it reads the control block and subtracts 1
 * after its last write to a buffer's maps, atomically: an NMI sample may nest in sched_switch
 * on the same CPU, so depth can be 2 (a pair of enter/exit counts would not do: the nested
 * program's exit could make the outer one look finished). At a window flip the daemon writes
 * the new buffer, then reads every CPU's depth; a CPU whose depth was not 0 is waited for until
 * it is seen at 0 once: every program in flight at the read has then returned, and one that
 * entered after the read sees the new buffer. Works for any set of CPUs (cpusets, isolated and
 * offline CPUs: nothing migrates), unlike waiting by moving the daemon onto each CPU. On x86-64
 * the atomic add is a locked instruction, a full barrier, which orders it before the program's
 * read of the control block (the store-buffering pattern: either the daemon sees the increment
 * or the program sees the new buffer). A relaxed atomic (arm64's STADD for a BPF add without
 * BPF_FETCH) would not order them: an arm64 port needs fetching atomics (Linux 5.12+) here. The
 * thread-seeding iterator (sched.bpf.c ps_seed_threads) also reads active_buffer but runs only
 * synchronously from the daemon before the first flip, so it needs no bracket. */
struct ps_progress {
  __s64 depth; /* programs running on this CPU now */
  __u64 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_progress) == 16, "ps_progress layout");

/* A thread's last complete user stack walk at switch-out, reused instead of walking again
 * (bpf/unwind.bpf.h ps_user_memo_hit). The walk is a function of the registers it started from
 * (pc, sp, and fp where a rule used it), the stack words it read, and the tables; so while the
 * registers and every word it read are unchanged, in the same process image and window, a new
 * walk would give the same frames. A thread that blocks again and again at one call site (a
 * worker's condition wait, an event loop's epoll_wait, a sleep in a loop) then costs its
 * re-reads of those words (one bpf_probe_read_user each) instead of a walk's table searches.
 * Only walks that reached the outermost frame, reading at most PS_MEMO_READS words, all within
 * 64 KiB above sp, are kept. */
#define PS_MEMO_READS 16
struct ps_user_memo {
  __u64 pc, sp, fp;   /* the registers the walk started from */
  __u64 hash;         /* of the words it read, with their offsets from sp, in read order */
  __u64 stack;        /* the walk's ps_sched_stacks<N> key */
  __u64 ws_ns;        /* window start when stored: the stack is in that window's map */
  __u32 n;            /* words read; 0: no memo */
  __u32 fp_used;      /* a rule used the starting fp (it must match too) */
  __u16 off[PS_MEMO_READS]; /* byte offsets from sp of the words read */
};
PS_STATIC_ASSERT(sizeof(struct ps_user_memo) == 88, "ps_user_memo layout");

/* The exact length of a thread's off-CPU intervals that count 0 times for sampling (their stacks
 * not captured: ps_offcpu_weight is 0, and the interval reached the minimum duration), per state,
 * in one window. The intervals that count more than once stand for these (ps_offcpu_value
 * sampled_ns), so the daemon knows each thread's exact total per state and window: their
 * sampled_raw_ns plus these. It scales the weighted ones to that total (agent/collect/
 * collector.cc ExactOffCpuTotals): the split across stacks stays sampled, the total does not.
 * Two slots, indexed by the buffer (ps_control.active_buffer) the window fills: BPF resets a slot
 * when it first adds to it in a new window, and the daemon reads the closed buffer's slot before
 * the next flip. A program that read the old buffer and then the new window start (between the
 * daemon's two stores at a flip) resets the closed buffer's slot: the daemon then finds it of
 * another window and keeps that thread's weighted figures for the window (nothing is counted
 * twice). A thread that exits hands its current slot to the daemon as a PS_ERR_UNCAPTURED_SUM
 * record when the sums reach PS_EXACT_OFFCPU_NS (else it keeps its weighted figures). Only
 * intervals BPF counts whole are added: one closed at an estimated switch-in before the window
 * start (abi.h ps_cpu_state) was cut there by the daemon. */
struct ps_uncaptured {
  __u64 ws_ns; /* window start the sums are of (0: none yet) */
  __u64 ns[3]; /* by state: [PS_STATE_RUNNABLE - 1], [_SLEEPING - 1], [_UNINTERRUPTIBLE - 1] */
};
PS_STATIC_ASSERT(sizeof(struct ps_uncaptured) == 32, "ps_uncaptured layout");

/* Per-thread switch-out state (sched.bpf.c: task storage, or the ps_threads hash by tid). An
 * off-CPU interval is accounted by BPF at switch-in from max(out_ns, window start), or from out_ns
 * when its weight was not final at the window start (ps_offcpu_weight_final); the part before the
 * window start is then left to the daemon: for an interval still running at a boundary it reads
 * out_ns, and for one that ended after the boundary but before the daemon looked, BPF copied it to
 * the carry_* fields first. */
struct ps_thread_state {
  __u64 out_ns;             /* ktime at switch-out; 0 while the thread is on a CPU */
  __u64 tgid_start_ns;
  __u64 user_stack;         /* ps_sched_stacks<N> key at switch-out (0 = none) */
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
  __u32 carry_weight; /* times the part before carry_ws_ns counts (ps_offcpu_weight, clamped
                         to 2^32-1); 0: none of it is the daemon's (under the minimum off-CPU
                         duration, or not final at the boundary and so counted whole by BPF:
                         ps_offcpu_weight_final) */
  char comm[PS_TASK_COMM_LEN];
  /* Off-CPU stack sampling (PS_RATE_PERIOD_NS above). */
  __u64 rate_start_ns;      /* start of the current rate period */
  __u32 rate_count;         /* switch-outs in it */
  __u32 sample_weight;      /* w from the last period (0 or 1: capture every switch-out) */
  __u32 stack_weight;       /* this switch-out: w if the per-thread stage chose it, 0 if not */
  __u32 exec_id;            /* ps_exec_id() at switch-out (ps_oncpu_key.exec_id) */
  struct ps_user_memo memo; /* the last complete user walk at switch-out (BPF's only) */
  __u32 budget_weight;      /* this switch-out, if chosen: c if captured within the CPU's budget
                               (PS_BUDGET_EXACT_OFFCPU_NS), 0 if not */
  __u32 last_long;          /* the thread's last off-CPU interval that was not a preemption
                               lasted PS_BUDGET_EXACT_OFFCPU_NS or more: its next switch-out may
                               be captured outside the budget */
  struct ps_uncaptured uncaptured[2]; /* by buffer (ps_uncaptured above) */
};
PS_STATIC_ASSERT(sizeof(struct ps_thread_state) == 296, "ps_thread_state layout");

/* What the iterator sched.bpf.c ps_dump_threads writes per thread that has a state in task
 * storage: this head, then the struct ps_thread_state, 304 bytes in all. */
struct ps_thread_record_head {
  __u32 tid;
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_thread_record_head) == 8, "ps_thread_record_head layout");

/* Key of the off-CPU aggregate (ps_offcpu<N>): time a thread spent off-CPU with one stack and
 * state. Stack fields as in ps_oncpu_key, keying ps_sched_stacks<N>. */
struct ps_offcpu_key {
  __u32 tgid;
  __u32 tid;
  __u64 tgid_start_ns;
  __u64 user_stack;
  __u64 kernel_stack;
  __s32 user_stack_err;
  __s32 kernel_stack_err;
  __u32 state;  /* PS_STATE_RUNNABLE, _SLEEPING or _UNINTERRUPTIBLE */
  __u32 exec_id; /* ps_oncpu_key.exec_id */
};
PS_STATIC_ASSERT(sizeof(struct ps_offcpu_key) == 48, "ps_offcpu_key layout");

struct ps_offcpu_value {
  __u64 ns;             /* off-CPU nanoseconds, each interval (part) times its weight */
  __u64 count;          /* intervals (or interval parts), each times its weight */
  __u64 sampled_ns;     /* the part of ns from intervals of weight 2 or more (ps_offcpu_weight) */
  __u64 sampled_raw_ns; /* the same intervals' length, once each (ps_uncaptured) */
  char comm[PS_TASK_COMM_LEN];
};
PS_STATIC_ASSERT(sizeof(struct ps_offcpu_value) == 48, "ps_offcpu_value layout");

/* On-CPU time of one process image in one window that a CPU has not added to ps_runtime<N> yet
 * (ps_cpu_state.pending, by buffer): sched_switch adds a switched-out task's time here while the
 * image and window stay the same (a pipe ping-pong, a thread pool: every switch), and to the map
 * only when they change, so most switches make no hash operation. The daemon adds the pending
 * time of the window it reads (ws_ns its start) to the map's (agent/collect/collector.cc
 * ScanCpus); BPF drops a pending entry of an older window, which the daemon has read. */
struct ps_runtime_pending {
  __u64 ws_ns; /* start of the window the time is in; 0: none */
  __u64 tgid_start_ns;
  __u64 ns;
  __u32 tgid;
  __u32 exec_id;
};
PS_STATIC_ASSERT(sizeof(struct ps_runtime_pending) == 32, "ps_runtime_pending layout");

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
  __u32 exec_id;      /* the task's ps_exec_id() (ps_oncpu_key.exec_id) */
  __u32 carry_exec_id;
  __u32 in_running;   /* 1 when the task is counted in ps_running (counted, and the entry was
                         there or could be made: bpf/common.bpf.h ps_running_add; or the count
                         passed on from a task of the same group, ps_cpu_record's keep) */
  __u64 group;        /* the ps_running key the task is counted under (PS_GROUP_*) */
  /* Off-CPU capture budget (PS_BUDGET_EXACT_OFFCPU_NS above), sched_switch's only. */
  __u64 budget_start_ns; /* start of the current rate period */
  __u32 budget_count;    /* capture candidates in it (exempt ones not included) */
  __u32 budget_weight;   /* c from the last period (0 or 1: capture every candidate) */
  __u32 budget_exempt;   /* captures in it outside the budget (ps_thread_state.last_long) */
  __u32 budget_captures; /* captures in it, exempt ones included */
  __u64 budget_capture_ns; /* their CPU time (ns: the clock read before and after each) */
  __u32 budget_cost_ns;    /* mean CPU time of a capture (ns) in the last period that had one; 0:
                              none yet */
  __u32 pad2;
  struct ps_runtime_pending pending[PS_NUM_BUFFERS]; /* by buffer; sched_switch's only */
};
PS_STATIC_ASSERT(sizeof(struct ps_cpu_state) == 200, "ps_cpu_state layout");

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
  __u32 exec_id; /* ps_oncpu_key.exec_id */
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
#define PS_CTR_STACK_MAP_FULL 5         /* ps_[sched_]stacks<N> insert failed: stack replaced by
                                           error */
#define PS_CTR_AGG_MAP_FULL 6           /* ps_oncpu<N> insert failed: sample lost */
#define PS_CTR_SWITCHES 7               /* sched_switch events */
#define PS_CTR_THREAD_MAP_FULL                                    \
  8 /* no thread state (ps_threads full; task storage not made or \
      not allocated): an off-CPU interval lost */
#define PS_CTR_OFFCPU_MAP_FULL 9        /* ps_offcpu<N> insert failed */
#define PS_CTR_RUNNING_MAP_FULL 10      /* ps_running insert failed: parallelism undercounted */
#define PS_CTR_RUNTIME_MAP_FULL 11      /* ps_runtime<N> insert failed */
#define PS_CTR_SAMPLES_PARALLELISM_UNKNOWN 12 /* samples flagged PS_SAMPLE_PARALLELISM_UNKNOWN */
#define PS_CTR_SWITCH_CHAIN_BREAKS 13   /* sched_switch whose prev was not the CPU's recorded task */
#define PS_CTR_SAMPLE_REPAIRS 14        /* samples that found a task switched in unseen */
#define PS_CTR_OFFCPU_NOT_CAPTURED 15   /* switch-outs whose stacks were not captured (sampling) */
#define PS_CTR_OFFCPU_WEIGHTED 16       /* intervals counted more than once for the uncaptured */
#define PS_CTR_UNWIND_COMPLETE 17      /* user stacks unwound to their outermost frame */
#define PS_CTR_UNWIND_TRUNCATED 18     /* user stacks cut at PS_MAX_STACK_DEPTH frames */
#define PS_CTR_UNWIND_NO_TABLE_YET 19  /* stopped: process or file table not loaded yet (FP used) */
#define PS_CTR_UNWIND_NO_TABLE_PC 20   /* stopped: no table covers a pc and frame pointers failed */
#define PS_CTR_UNWIND_READ_FAULT 21    /* stopped: reading the user stack faulted */
#define PS_CTR_UNWIND_BAD_FRAME 22     /* stopped: the unwound frame is impossible (sp went down) */
#define PS_CTR_UNWIND_FP_FRAMES 23     /* frames found by the frame-pointer fallback */
#define PS_CTR_UNWIND_EVENTS_LOST 24   /* table requests the ring buffer could not take */
#define PS_CTR_MAP_BUSY 25             /* a map insert met its bucket lock held on its CPU (-EBUSY,
                                          Linux 5.11+): lost like a full map's, map not full */
#define PS_CTR_RUNNING_UNCOUNTED                                                                   \
  26                                    /* a task not counted in ps_running: a sample found it     \
                                           switched in unseen of a process without an entry (the   \
                                           sampler inserts none; counted from its next switch-in), \
                                           or it switched in while its process was exiting */
#define PS_CTR_UNWIND_VMA_FRAMES 27     /* frames unwound through a file found by bpf_find_vma
                                          (a mapping the process's list lacks yet) */
#define PS_CTR_UNWIND_VMA_CACHE_FULL 28 /* an exec found ps_vma_cache full: that image's walks
                                          look up one unlisted file each */
#define PS_CTR_GROUPS_MADE 29          /* ps_running entries inserted (parallelism groups) */
#define PS_CTR_GROUPS_RELEASED 30      /* ps_running entries deleted (process exit, cgroup release) */
#define PS_CTR_TREE_JOINED 31          /* processes that joined a tree at fork (command mode) */
#define PS_CTR_TREE_LEFT 32            /* tree members whose last thread exited */
#define PS_CTR_TREE_FULL 33            /* forks not followed: ps_pid_filter was full */
#define PS_CTR_UNWIND_MEMO_HITS 34    /* switch-outs whose user stack was the thread's last walk
                                        (ps_user_memo), not walked again */
/* switch-outs not captured for their CPU's capture budget (--off-cpu-stack-budget) */
#define PS_CTR_OFFCPU_OVER_BUDGET 35
#define PS_CTR_OFFCPU_CAPTURES 36   /* switch-outs whose stacks sched_switch captured */
#define PS_CTR_OFFCPU_CAPTURE_NS 37 /* their CPU time, ns (the clock read before and after) */
#define PS_CTR_NUM 38

/* Default capacities; the daemon sizes ps_stacks<N> and ps_oncpu<N> before load from the CPU count,
 * frequency and window, ps_sched_stacks<N> by whether off-CPU stacks are taken, and ps_threads
 * from the host's threads (agent/bpf/programs.cc). Hash maps are preallocated (perf_event
 * programs may only use preallocated hash maps before Linux 6.1, and sched_switch must not
 * kmalloc under the run-queue lock, sched.bpf.c ps_threads): about sizeof(struct ps_stack) bytes
 * per stack entry. Exceptions: on Linux 6.1+, whose hash maps allocate from bpf_mem_alloc,
 * ps_runtime<N> and ps_offcpu<N> (*_ON_USE below). */
#define PS_STACK_MAP_ENTRIES 4096
#define PS_SCHED_STACK_MAP_ENTRIES 8192 /* off-CPU stacks per buffer (ps_sched_stacks<N>) */
#define PS_ONCPU_MAP_ENTRIES 4096
#define PS_PID_FILTER_ENTRIES 1024   /* --pid targets; command mode sizes it PS_TREE_ENTRIES */
#define PS_TREE_ENTRIES 32768        /* live processes of a command mode tree */
/* at most, threads tracked off-CPU at once in the ps_threads hash (kernels without task storage
 * for tracing programs; preallocated, ~368 bytes each with the bucket; sized by the daemon) */
#define PS_THREAD_MAP_ENTRIES 65536
#define PS_RUNNING_ENTRIES 32768     /* processes with a parallelism count */
#define PS_OFFCPU_MAP_ENTRIES 16384
#define PS_RUNTIME_MAP_ENTRIES 8192
/* ps_runtime<N> and ps_offcpu<N> where hash maps allocate on use (Linux 6.1+,
 * agent/bpf/programs.cc LoadSched); the two above are their preallocated sizes below 6.1. */
#define PS_RUNTIME_MAP_ENTRIES_ON_USE 65536
#define PS_OFFCPU_MAP_ENTRIES_ON_USE 32768

/* ---- User-stack unwinding from .eh_frame / .debug_frame (bpf/unwind.bpf.h, agent/unwind/) ----
 *
 * The daemon turns each ELF file's call frame information (DWARF CFI: .eh_frame, .debug_frame;
 * DWARF 5 section 6.4, LSB "Exception Frames") into a sorted table of rows, one per address
 * range with the same rules for the three registers an unwinder needs: the canonical frame
 * address (CFA), the frame pointer and the return address. Tables live in one array,
 * ps_unwind_rows, as runs [first, first + count) shared by every process that maps the file;
 * each process has a run of ps_unwind_mapping entries in ps_unwind_maps, found through
 * ps_unwind_procs. The BPF walker binary-searches the mapping of a pc, then the last row whose
 * pc is <= it, computes CFA, reads the return address and the saved frame pointer from the user
 * stack, and repeats. Registers are abstract (SP, FP, PC): x86-64 is rsp/rbp/rip (DWARF 7/6/16),
 * arm64 would be sp/x29/pc with its return address in x30 (PS_RA_LR, not built). */

/* Outcome of a user-stack walk (ps_stack.flags). */
#define PS_UNWIND_COMPLETE 0        /* reached the outermost frame (RA undefined, or pc/FP 0) */
#define PS_UNWIND_TRUNCATED 1       /* PS_MAX_STACK_DEPTH frames and more remained */
#define PS_UNWIND_NO_TABLE_YET 2    /* the process or a file had no table loaded yet */
#define PS_UNWIND_NO_TABLE_PC 3     /* no table for a pc (JIT, no CFI) and no frame pointer */
#define PS_UNWIND_READ_FAULT 4      /* a read of the user stack failed (unmapped, paged out) */
#define PS_UNWIND_BAD_FRAME 5       /* an impossible frame (CFA not above SP, pc in kernel) */

/* Rule for the CFA (ps_unwind_row.cfa_rule). */
#define PS_CFA_NONE 0     /* no CFI for this pc: the walker falls back to frame pointers */
#define PS_CFA_SP 1       /* CFA = SP + cfa_offset */
#define PS_CFA_FP 2       /* CFA = FP + cfa_offset */
#define PS_CFA_DEREF_SP 3 /* CFA = *(SP + cfa_offset) (DW_OP_breg<sp> N; DW_OP_deref) */
#define PS_CFA_DEREF_FP 4 /* CFA = *(FP + cfa_offset) (stack realignment: DW_OP_breg<fp>) */
#define PS_CFA_PLT 5      /* x86-64 PLT: CFA = SP + cfa_offset + ((pc & 15) >= k ? 8 : 0), with
                             k = flags >> PS_ROW_PLT_SHIFT (11 for the lazy PLT, binutils) */
#define PS_CFA_END 6      /* outermost frame: the return address is undefined (_start, clone) */

/* Rule for the caller's FP (ps_unwind_row.fp_rule). */
#define PS_FP_SAME 0      /* unchanged */
#define PS_FP_AT_CFA 1    /* saved at CFA + fp_offset */
#define PS_FP_AT_SP 2     /* saved at SP + fp_offset (DW_CFA_expression DW_OP_breg<sp> N) */
#define PS_FP_UNDEFINED 3 /* lost: the caller's FP is unknown (0) */
#define PS_FP_AT_FP 4     /* saved at FP + fp_offset (DW_CFA_expression DW_OP_breg<fp> N) */

/* Rule for the return address (ps_unwind_row.ra_rule). */
#define PS_RA_AT_CFA 0    /* saved at CFA + ra_offset (x86-64: always CFA - 8) */
#define PS_RA_AT_SP 1     /* saved at SP + ra_offset (signal frames: the saved pc) */
#define PS_RA_LR 2        /* in the link register (arm64 leaf; not used on x86-64) */

/* ps_unwind_row.flags */
#define PS_ROW_SIGNAL 1   /* signal trampoline (CIE augmentation 'S'): the caller's pc is exact,
                             not a return address, so it is looked up without the -1 */
#define PS_ROW_PLT_SHIFT 4 /* bits 4-7: the PS_CFA_PLT threshold */

/* One row: the rules for pcs from `pc` (ELF virtual address in the file, 32 bits: text below
 * 4 GiB) up to the next row's pc. The caller's SP is the CFA under every rule. 16 bytes: array
 * map values are rounded up to 8 bytes (kernel/bpf/arraymap.c elem_size). */
struct ps_unwind_row {
  __u32 pc;
  __u8 cfa_rule;   /* PS_CFA_* */
  __u8 fp_rule;    /* PS_FP_* */
  __u8 ra_rule;    /* PS_RA_* */
  __u8 flags;      /* PS_ROW_* */
  __s32 cfa_offset;
  __s16 fp_offset;
  __s16 ra_offset;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_row) == 16, "ps_unwind_row layout");

/* Table state of a mapping (ps_unwind_mapping.state). */
#define PS_TABLE_READY 0    /* rows [first, first + count) of ps_unwind_rows */
#define PS_TABLE_NONE 1     /* no CFI (JIT, anonymous, unreadable, over budget): frame pointers */

/* One executable mapping of a process: pc in [start, end) has ELF address pc - bias. */
struct ps_unwind_mapping {
  __u64 start;
  __u64 end;
  __u64 bias;
  __u32 first;  /* first row in ps_unwind_rows */
  __u32 count;  /* rows */
  __u32 state;  /* PS_TABLE_* */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_mapping) == 40, "ps_unwind_mapping layout");

/* ps_unwind_procs value: the process's mappings are ps_unwind_maps[first, first + count), sorted
 * by start and non-overlapping. */
struct ps_unwind_proc {
  __u64 tgid_start_ticks; /* identity: the group leader's start_boottime / PS_NS_PER_TICK, as
                             /proc/<tgid>/stat field 22 shows it (fs/proc/array.c) */
  __u32 first;
  __u32 count;
  __u32 exec_id; /* the image these mappings belong to, or PS_EXEC_ID_UNKNOWN (read from /proc,
                    which does not show it): the walker then claims the entry for the running
                    image and sends PS_UNWIND_EVENT_NEW_PROCESS so the daemon learns the id */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_proc) == 24, "ps_unwind_proc layout");
#define PS_EXEC_ID_UNKNOWN 0xffffffffu

/* USER_HZ clock ticks of /proc/<pid>/stat start times: nsec_to_clock_t (kernel/time/time.c). */
#define PS_NS_PER_TICK 10000000ULL

/* ps_unwind_files: the table of a file by the identity its vmas show (Linux 5.17+, where the
 * walker has bpf_find_vma). A pc in no mapping of the process's list (ld.so mapped the library
 * after the daemon read the maps, or the process has no list yet) is looked up by its vma's file:
 * key as /proc/<pid>/maps shows it (dev = vma->vm_file->f_inode->i_sb->s_dev in the kernel's
 * MKDEV encoding, major << 20 | minor, include/linux/kdev_t.h; ino = i_ino; fs/proc/task_mmu.c
 * show_map_vma). The file's executable PT_LOAD (one per file; files with several are not
 * entered) gives the bias: pc - vm_start + vm_pgoff * PAGE_SIZE - seg_offset + seg_vaddr is the
 * pc's ELF address (ELF gABI "Program Header"). */
struct ps_unwind_file_key {
  __u64 dev;
  __u64 ino;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_file_key) == 16, "ps_unwind_file_key layout");
struct ps_unwind_file {
  __u64 seg_offset; /* p_offset of the PF_X PT_LOAD */
  __u64 seg_vaddr;  /* its p_vaddr */
  __u64 seg_filesz; /* its p_filesz */
  __u64 size;       /* the file's size when its table was built: an inode rewritten in place
                       or reused by a new file of another size is not taken for it (i_size) */
  __u32 first;      /* rows [first, first + count) of ps_unwind_rows */
  __u32 count;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_file) == 40, "ps_unwind_file layout");
#define PS_UNWIND_FILE_ENTRIES 8192 /* files with a table reachable by bpf_find_vma */

/* Ring-buffer event (ps_unwind_events): the walker met a process without an entry, or a pc in
 * no known mapping (a library loaded since), or the process exec'ed (same tgid and start time,
 * new image), so the daemon should (re)load its tables. */
#define PS_UNWIND_EVENT_NEW_PROCESS 1
#define PS_UNWIND_EVENT_UNKNOWN_PC 2
#define PS_UNWIND_EVENT_EXEC 3 /* sched_process_exec: the old image's entry was deleted */
#define PS_UNWIND_EVENT_CLAIM 4 /* the walker claimed an entry read from /proc (exec id unknown):
                                   a process that ran before the agent loaded it, not urgent */
struct ps_unwind_event {
  __u32 tgid;
  __u32 kind; /* PS_UNWIND_EVENT_* */
  __u64 tgid_start_ns;
  __u32 exec_id; /* ps_oncpu_key.exec_id of the image running when the event was sent */
  __u32 pad;
};
PS_STATIC_ASSERT(sizeof(struct ps_unwind_event) == 24, "ps_unwind_event layout");

/* Bounds of the walker's searches; every loop in bpf/unwind.bpf.h is bounded by one of these. */
#define PS_UNWIND_MAX_MAPPINGS 256     /* executable mappings per process */
#define PS_UNWIND_MAP_SEARCH_STEPS 9   /* ceil(log2(PS_UNWIND_MAX_MAPPINGS)) + 1 */
#define PS_UNWIND_MAX_TABLE_ROWS (1u << 22) /* rows per file table (4M) */
#define PS_UNWIND_ROW_SEARCH_STEPS 23  /* log2(PS_UNWIND_MAX_TABLE_ROWS) + 1 */
PS_STATIC_ASSERT((1u << (PS_UNWIND_MAP_SEARCH_STEPS - 1)) >= PS_UNWIND_MAX_MAPPINGS,
                 "mapping search covers every mapping");
PS_STATIC_ASSERT((1u << (PS_UNWIND_ROW_SEARCH_STEPS - 1)) >= PS_UNWIND_MAX_TABLE_ROWS,
                 "row search covers every row");
#define PS_UNWIND_PROC_ENTRIES 8192    /* processes with tables (ps_unwind_procs) */
#define PS_UNWIND_MAP_ENTRIES 65536    /* mapping slots shared by all processes (2.5 MiB) */
#define PS_UNWIND_ROW_ENTRIES 2097152  /* default rows: 32 MiB (--unwind-table-bytes / 16) */

#endif /* PARASCOPE_BPF_ABI_H_ */
