/* BPF-only definitions shared by the parascope programs. The maps below exist in every object
 * that includes this header; the daemon loads oncpu.bpf.o first and makes the other objects
 * reuse its map fds (bpf_map__reuse_fd), so all programs see one instance of each. */
#ifndef PARASCOPE_BPF_COMMON_BPF_H_
#define PARASCOPE_BPF_COMMON_BPF_H_

#include "abi.h"

/* errno values (include/uapi/asm-generic/errno-base.h, errno.h); vmlinux.h has no macros. */
#define ENOENT 2
#define E2BIG 7 /* a full preallocated hash (kernel/bpf/hashtab.c alloc_htab_elem) */
#define ENOMEM                                                                      \
  12 /* a hash allocated on use could not get an element (Linux 6.1+ bpf_mem_alloc) \
      */
#define EFAULT 14
#define EBUSY 16 /* the bucket lock is held on this CPU (htab_lock_bucket, Linux 5.11+) */
#define EEXIST 17

/* Task states (include/linux/sched.h). */
#define PS_TASK_RUNNING 0x0000
#define PS_TASK_INTERRUPTIBLE 0x0001
#define PS_TASK_UNINTERRUPTIBLE 0x0002
#define PS_TASK_DEAD 0x0080
#define PS_TASK_NOLOAD 0x0400

/* Set by the daemon before load (rodata): 1 to record only tgids present in ps_pid_filter. */
const volatile __u32 ps_cfg_filter_tgid = 0;
/* --latency-group: PS_GROUP_* (abi.h), the key of ps_running. */
const volatile __u32 ps_cfg_group = PS_GROUP_PROCESS;
/* Command mode: a process forked by a tracked one is tracked too, in its parent's tree
 * (oncpu.bpf.c ps_process_fork). */
const volatile __u32 ps_cfg_follow_forks = 0;

/* Per-CPU failure/activity counters indexed by PS_CTR_* (abi.h); summed by the daemon. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, PS_CTR_NUM);
  __type(key, __u32);
  __type(value, __u64);
} ps_counters SEC(".maps");

/* mmap'ed by the daemon, which writes single fields (BPF decrements unknown_cpus concurrently). */
struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, 1);
  __uint(map_flags, BPF_F_MMAPABLE);
  __type(key, __u32);
  __type(value, struct ps_control);
} ps_control SEC(".maps");

/* The processes to record when ps_cfg_filter_tgid: --pid targets, or command mode's tree. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_PID_FILTER_ENTRIES); /* resized by the daemon before load */
  __type(key, __u32);   /* tgid */
  __type(value, __u64); /* the tree's root tgid (PS_GROUP_TREE); unused otherwise */
} ps_pid_filter SEC(".maps");

/* Maps written from NMI context. With a hardware PMU the on-CPU sampler runs in NMI context, so
 * it can interrupt, on its CPU, sched_switch, the exec and exit hooks, the seeding iterator or a
 * daemon syscall while they hold a hash bucket's lock (kernel/bpf/hashtab.c htab_lock_bucket).
 * Linux 5.10 then takes that raw spinlock again in the NMI: a deadlock when it is the same
 * bucket. From 5.11 (commit 20b6cc34ea74, "bpf: Avoid hashtab deadlock with map_locked") the
 * NMI's update fails with -EBUSY instead, whatever the bucket. So the sampler takes no hash lock
 * that another context can hold on its CPU:
 *  - stacks: each writer has its own maps, ps_stacks<N> (the sampler's, oncpu.bpf.c) and
 *    ps_sched_stacks<N> (sched_switch's and the seeding iterator's, sched.bpf.c); the daemon
 *    drains both into one cache keyed by hash (a stack in both has the same hash and frames);
 *  - ps_oncpu<N> is the sampler's alone (the daemon drains only the buffer nobody writes);
 *  - ps_running holds counts both sides change, so it cannot be split: the sampler only looks
 *    entries up and adds atomically, it never inserts (ps_running_add, may_insert). Entries come
 *    from sched_switch's switch-ins and, for processes alive at attach, from the seeding iterator;
 *  - ps_counters, ps_cpu_state and ps_unwind_notify_state are per-CPU arrays and ps_control an
 *    array (no locks); ps_pid_filter and ps_unwind_procs are only looked up by the sampler;
 *  - the ring buffer ps_unwind_events has a lock, but an NMI only tries it (kernel/bpf/ringbuf.c
 *    __bpf_ringbuf_reserve): a request it could not queue is counted, PS_CTR_UNWIND_EVENTS_LOST,
 *    and a later sample asks again.
 * -EBUSY can still reach the other writers on 5.11-6.1 kernels with CONFIG_PREEMPT, when a task
 * is preempted between htab_lock_bucket's map_locked increment and its lock (until "bpf: Disable
 * preemption when increasing per-cpu map_locked"): every insert counts it as PS_CTR_MAP_BUSY,
 * never as a full map (ps_count_insert_error). */

/* Stacks by ps_stack_hash(), one map per buffer and writer (above). */
struct ps_stack_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_STACK_MAP_ENTRIES); /* resized by the daemon before load */
  __type(key, __u64);
  __type(value, struct ps_stack);
};
PS_STATIC_ASSERT(PS_NUM_BUFFERS == 2, "one map set per buffer");

/* Parallelism: threads of each group (abi.h PS_GROUP_*) currently on a CPU. */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_RUNNING_ENTRIES);
  __type(key, __u64);   /* group: tgid, cgroup v2 id or tree root (abi.h PS_GROUP_*) */
  __type(value, __s64); /* running threads */
} ps_running SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_cpu_state);
} ps_cpu_state SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_progress);
} ps_progress SEC(".maps");

/* Brackets a program's run for the daemon's window flip (abi.h, struct ps_progress): ps_enter
 * first thing, ps_leave last. */
static __always_inline void ps_enter(void) {
  __u32 zero = 0;
  struct ps_progress *p = bpf_map_lookup_elem(&ps_progress, &zero);
  if (p)
    __sync_fetch_and_add(&p->depth, 1);
}

static __always_inline void ps_leave(void) {
  __u32 zero = 0;
  struct ps_progress *p = bpf_map_lookup_elem(&ps_progress, &zero);
  if (p)
    __sync_fetch_and_add(&p->depth, -1);
}

static __always_inline void ps_count(__u32 idx) {
  __u64 *c = bpf_map_lookup_elem(&ps_counters, &idx);
  if (c)
    __sync_fetch_and_add(c, 1); /* atomic: an NMI-driven sample may nest in another program */
}

/* Adds `delta` to counter idx (a sum, such as ns). */
static __always_inline void ps_count_add(__u32 idx, __u64 delta) {
  __u64 *c = bpf_map_lookup_elem(&ps_counters, &idx);
  if (c) __sync_fetch_and_add(c, delta);
}

/* Counts a failed hash insert (err: bpf_map_update_elem's result, not 0 or -EEXIST): -EBUSY as
 * PS_CTR_MAP_BUSY (the bucket lock was held on this CPU, see "Maps written from NMI context"),
 * anything else (-E2BIG: full) as `full_ctr`. */
static __always_inline void ps_count_insert_error(long err, __u32 full_ctr) {
  ps_count(err == -EBUSY ? PS_CTR_MAP_BUSY : full_ctr);
}

/* 1 when a stack error came from storing the stack (ps_store_stack), not from walking it. */
static __always_inline int ps_stack_store_failed(__s32 err) {
  return err == -E2BIG || err == -EBUSY || err == -ENOMEM;
}

static __always_inline struct ps_control *ps_get_control(void) {
  __u32 zero = 0;
  return bpf_map_lookup_elem(&ps_control, &zero);
}

static __always_inline int ps_tgid_tracked(__u32 tgid) {
  return !ps_cfg_filter_tgid || bpf_map_lookup_elem(&ps_pid_filter, &tgid) != 0;
}

/* The parallelism group of `task` (of process `tgid`): abi.h PS_GROUP_*; 0 for none (no tgid, cgroup
 * id or tree root is 0). A tree member whose filter entry its last thread's exit deleted a moment
 * ago has none: it is not counted, rather than counted in a group nothing would delete. */
static __always_inline __u64 ps_group_of(struct task_struct *task, __u32 tgid) {
  if (ps_cfg_group == PS_GROUP_CGROUP)
    return BPF_CORE_READ(task, cgroups, dfl_cgrp, kn, id);
  if (ps_cfg_group == PS_GROUP_TREE) {
    __u64 *root = bpf_map_lookup_elem(&ps_pid_filter, &tgid);
    return root ? *root : 0;
  }
  return tgid;
}

/* Adds delta to the running-thread count of `group`; returns 1 when it did. A missing entry is
 * created at 0 for an increment when `may_insert` (never from the sampler: "Maps written from NMI
 * context" above), else the increment is dropped and counted (PS_CTR_RUNNING_UNCOUNTED). A
 * decrement of a missing entry is dropped: the group ended and its entry went with it (its
 * process's last thread exited, sched.bpf.c ps_on_exit; or its cgroup was released) before
 * the thread's final switch-out. */
static __always_inline int ps_running_add(__u64 group, __s64 delta, int may_insert) {
  if (group == 0)
    return 0; /* no group (ps_group_of) */
  __s64 *n = bpf_map_lookup_elem(&ps_running, &group);
  if (!n) {
    if (delta < 0)
      return 0;
    if (!may_insert) {
      ps_count(PS_CTR_RUNNING_UNCOUNTED);
      return 0;
    }
    __s64 zero = 0;
    long err = bpf_map_update_elem(&ps_running, &group, &zero, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count_insert_error(err, PS_CTR_RUNNING_MAP_FULL);
      return 0;
    }
    if (!err)
      ps_count(PS_CTR_GROUPS_MADE);
    n = bpf_map_lookup_elem(&ps_running, &group);
    if (!n)
      return 0;
  }
  __sync_fetch_and_add(n, delta);
  return 1;
}

/* 64-bit FNV-1a style hash of the first `len` frames, never 0 (0 means "no stack"). Different
 * stacks collide with probability ~2^-64 per pair, unlike BPF_MAP_TYPE_STACK_TRACE whose bucket
 * collisions (-EEXIST) lose a sizable share of stacks once the map is a few percent full. */
static __always_inline __u64 ps_stack_hash(const struct ps_stack *st, __u64 seed) {
  __u64 h = 0xcbf29ce484222325ULL ^ seed;
  for (__u32 i = 0; i < PS_MAX_STACK_DEPTH; i++) {
    if (i >= st->len)
      break;
    h ^= st->ips[i];
    h *= 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h ? h : 1;
}

/* Stores the `n`-byte stack (a bpf_get_stack/bpf_get_task_stack result) in `st` into `stacks`.
 * Returns its hash, or 0 with *err = -errno (n itself when n <= 0: 0 means legitimately empty). */
static __always_inline __u64 ps_store_stack(void *stacks, struct ps_stack *st, long n, __u64 seed,
                                            __s32 *err) {
  *err = 0;
  if (n <= 0) {
    *err = (__s32)n;
    return 0;
  }
  st->len = (__u32)n / sizeof(__u64);
  __u64 h = ps_stack_hash(st, seed ^ ((__u64)st->flags << 40));
  /* Most stacks repeat: a lock-free lookup first skips the bucket lock of an update. */
  if (bpf_map_lookup_elem(stacks, &h))
    return h;
  long rc = bpf_map_update_elem(stacks, &h, st, BPF_NOEXIST);
  if (rc && rc != -EEXIST) {
    ps_count_insert_error(rc, PS_CTR_STACK_MAP_FULL);
    *err = (__s32)rc;
    return 0;
  }
  return h;
}

/* Copies the current task's kernel stack via the per-CPU `scratch` into `stacks`. Returns its
 * hash, or 0 with *err = -errno (0 when the stack is legitimately empty: a sample taken in user
 * mode). User stacks are unwound instead (unwind.bpf.h ps_capture_user_stack). */
static __always_inline __u64 ps_capture_kernel_stack(void *ctx, void *scratch, void *stacks,
                                                     __s32 *err) {
  __u32 zero = 0;
  struct ps_stack *st = bpf_map_lookup_elem(scratch, &zero);
  *err = 0;
  if (!st)
    return 0;
  st->flags = 0;
  return ps_store_stack(stacks, st, bpf_get_stack(ctx, st->ips, sizeof(st->ips), 0), 0, err);
}

/* Keeps the compiler from reordering the stores around it (x86-64 and arm64 order the
 * daemon's view through the syscall copy; the fields written before it are complete first). */
#define ps_barrier() asm volatile("" ::: "memory")

/* The process's exec generation (abi.h, "Process identity"). self_exec_id is a u64 since 5.7 and
 * a u32 before; the low 32 bits of an 8-byte read are the field either way (little-endian). */
static __always_inline __u32 ps_exec_id(struct task_struct *task) {
  return (__u32)BPF_CORE_READ(task, self_exec_id);
}

/* Makes `cs` (this CPU's entry) record task `tid` of `tgid` as on the CPU since in_ns, tracked
 * (on-CPU time, and an increment of its group's ps_running count) when `counted`; `may_insert` as
 * in ps_running_add. `keep` (only with `counted`): the old record's count is in `group` already
 * and stays, as this record's (sched_switch between threads of one group; the entry may have
 * gone with its group meanwhile, and then the later decrement finds none); else the caller has
 * already returned it (when cs->in_running). Only this CPU writes its entry; `counted` is cleared
 * first and set last so that the daemon's ScanCpus never pairs one task's switch-in time with
 * another task's process. */
static __always_inline void ps_cpu_record(struct ps_cpu_state *cs, __u32 tid, __u32 tgid,
                                          __u64 group, __u64 tgid_start_ns, __u32 exec_id,
                                          __u64 in_ns, int counted, int may_insert, int keep) {
  cs->counted = 0;
  cs->in_running = 0;
  ps_barrier();
  cs->tid = tid;
  cs->tgid = tgid;
  cs->tgid_start_ns = counted ? tgid_start_ns : 0;
  cs->exec_id = exec_id;
  cs->in_ns = in_ns;
  cs->group = group;
  ps_barrier();
  cs->counted = counted;
  if (counted) cs->in_running = keep ? 1 : ps_running_add(group, 1, may_insert);
}

/* Estimated time of a switch the tracepoint did not report on this CPU: it happened after the
 * recorded task came in and after the last sample (which still saw the recorded state), and
 * before `now`; the midpoint halves the worst-case error. */
static __always_inline __u64 ps_unseen_switch_ns(const struct ps_cpu_state *cs, __u64 now) {
  __u64 lo = cs->in_ns > cs->sample_ns ? cs->in_ns : cs->sample_ns;
  return lo < now ? lo + (now - lo) / 2 : now;
}

/* Marks this CPU's current task as known on first sight after attach (the daemon starts with
 * ps_control.unknown_cpus = online CPUs). Called by the sampler with the interrupted task, and
 * by sched_switch before it handles prev. Returns 1 when the CPU was unknown until now. */
static __always_inline int ps_cpu_first_seen(struct ps_cpu_state *cs, struct ps_control *ctl) {
  if (cs->known)
    return 0;
  /* A plain store, not an atomic exchange (BPF_XCHG needs Linux 5.12): the entry is this CPU's,
   * and only an NMI sample landing between the test and the store could also see it unknown,
   * once, in the first instant after attach. */
  cs->known = 1;
  __sync_fetch_and_add(&ctl->unknown_cpus, -1);
  return 1;
}

#endif /* PARASCOPE_BPF_COMMON_BPF_H_ */
