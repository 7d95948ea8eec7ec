// SPDX-License-Identifier: GPL-2.0
/* Scheduler tracing for the off-CPU, wall and latency profiles (SPEC sections 1-2).
 *
 * On every sched_switch:
 *  - prev leaves its CPU: its tgid's running-thread count (parallelism, read by the on-CPU
 *    sampler) drops, its exact on-CPU time is added to ps_runtime<N>, and its switch-out time,
 *    state (the tracepoint's prev_state where it has one) and stacks are stored in the thread's
 *    state: its task storage (ps_thread_storage), or on kernels without task storage for
 *    tracing programs the ps_threads hash by tid (ps_thread_state_of);
 *  - next enters: its count rises and, if it was switched out before, the interval it spent
 *    off-CPU is added to ps_offcpu<N> under the stack and state captured at switch-out.
 * Intervals are split at window boundaries once their weight is final there (abi.h
 * ps_offcpu_weight_final): BPF accounts from the window start, the part before is the daemon's
 * (see struct ps_thread_state in abi.h); a younger interval is counted whole, from its start.
 * Attached as tp_btf (BPF_PROG_TYPE_TRACING, Linux 5.5+; the floor is 5.10): its arguments are
 * typed kernel pointers the verifier lets helpers such as bpf_get_task_stack take. */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "abi.h"
#include "common.bpf.h"
#include "unwind.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set before load. */
const volatile __u32 ps_cfg_offcpu = 1;        /* track off-CPU intervals (off_cpu, wall) */
const volatile __u64 ps_cfg_min_offcpu_ns = 0; /* --off-cpu-min-duration */
const volatile __u32 ps_cfg_stack_rate = 0;    /* --off-cpu-stack-rate (0: every switch-out) */
const volatile __u32 ps_cfg_stack_budget = 0;  /* --off-cpu-stack-budget (0: no budget) */
/* --off-cpu-stack-cpu-budget: capture CPU time allowed per second per CPU, ns (0: no limit). */
const volatile __u64 ps_cfg_stack_cpu_ns = 0;
/* 1: thread states live in ps_thread_storage (task storage), 0: in the ps_threads hash. Set by
 * the daemon from the kernel's BTF (agent/bpf/programs.cc LoadSched); every task-storage helper
 * call below sits in a branch on it, which the verifier removes as dead code where it is 0, so
 * the object loads on kernels without task storage (Linux 5.10). */
const volatile __u32 ps_cfg_task_storage = 0;

/* Thread states in task-local storage (BPF_MAP_TYPE_TASK_STORAGE; usable from tracing programs
 * once task_struct has bpf_storage, commit a10787e6d58c "bpf: Enable task local storage for
 * tracing programs", Linux 5.13): one element hangs off each task_struct, so sched_switch finds
 * prev's and next's states from the task pointers it already holds, and there is no table to
 * fill up. The kernel frees a task's storage with the task (bpf_task_storage_free), so nothing
 * is deleted at exit. sched_switch only looks states up: it never creates one, since creating
 * allocates (kernel/bpf/bpf_local_storage.c bpf_selem_alloc; in Linux 6.1 a kmalloc(GFP_ATOMIC)),
 * which under the run-queue lock is the hazard described at ps_threads below. A state is created
 * outside the scheduler instead, with no lock held:
 *  - for every new task, in copy_process (ps_thread_new on task_newtask, which also sees the
 *    tasks that do not pass through sched_process_fork: io_uring workers, vhost tasks), before
 *    the task can first run;
 *  - for every tracked thread alive at attach, by an iterator run before sched_switch is attached
 *    (ps_make_states), so that no switch-out after the attach finds none;
 *  - for a tracked thread still without one (an allocation that failed; on Linux 5.13-6.1 a
 *    create that met the per-CPU busy counter of task storage, kernel/bpf/bpf_task_storage.c),
 *    by the daemon's read of the states each window (ps_dump_threads).
 * Until then its switch-outs are counted as PS_CTR_THREAD_MAP_FULL and its off-CPU intervals
 * lost. Kernel memory: one storage element per tracked thread (about 0.8 KiB: the 296-byte value,
 * the element's header and the task's struct bpf_local_storage), so it follows the threads alive;
 * the kernel's own memory per thread (task_struct and kernel stack) is over 20 KiB. Where the
 * daemon selects the ps_threads hash instead (ps_cfg_task_storage == 0), it turns this map into
 * a 1-entry hash before load, since such a kernel cannot create a task storage map. */
struct {
  __uint(type, BPF_MAP_TYPE_TASK_STORAGE);
  __uint(map_flags, BPF_F_NO_PREALLOC);
  __type(key, int);
  __type(value, struct ps_thread_state);
} ps_thread_storage SEC(".maps");

/* Thread states by tid, where task storage is not used (ps_cfg_task_storage == 0; else 1 entry,
 * unused). Preallocated: sched_switch inserts here with the run-queue lock held,
 * where a BPF_F_NO_PREALLOC hash would kmalloc(GFP_ATOMIC) its element (kernel/bpf/hashtab.c
 * alloc_htab_elem), which is unsafe in that context until Linux 6.1's BPF memory allocator
 * ("bpf: Convert hash map to bpf_mem_alloc"): the allocator may wake kswapd, and a wake-up takes
 * a run-queue lock. Cost, all at load: 352 bytes per entry (48-byte struct htab_elem + 8-byte
 * key + 296-byte value, plus one spare element per possible CPU) and 16 bytes of bucket, i.e.
 * 23 MiB at PS_THREAD_MAP_ENTRIES; the daemon sizes it from the threads alive at start
 * (agent/bpf/programs.cc LoadSched). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_THREAD_MAP_ENTRIES); /* resized by the daemon before load */
  __type(key, __u32);                         /* tid */
  __type(value, struct ps_thread_state);
} ps_threads SEC(".maps");

/* A new entry's value (in .rodata: the state is larger than the switch path's stack allows). */
const struct ps_thread_state ps_empty_thread_state = {};

/* The seeding iterator's state under construction. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_thread_state);
} ps_seed_scratch SEC(".maps");

/* The state of thread `task` (tid `tid`), or NULL when it has none. Task storage: never created
 * here (see ps_thread_storage). */
static __always_inline struct ps_thread_state *ps_thread_state_of(struct task_struct *task,
                                                                  __u32 tid) {
  if (ps_cfg_task_storage) return bpf_task_storage_get(&ps_thread_storage, task, 0, 0);
  return bpf_map_lookup_elem(&ps_threads, &tid);
}

/* Off-CPU intervals and exact on-CPU time, a buffer each per window: sized, and on Linux 6.1+
 * made BPF_F_NO_PREALLOC, by the daemon before load (agent/bpf/programs.cc LoadSched). */
struct ps_offcpu_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_OFFCPU_MAP_ENTRIES);
  __type(key, struct ps_offcpu_key);
  __type(value, struct ps_offcpu_value);
};
struct ps_offcpu_map ps_offcpu0 SEC(".maps");
struct ps_offcpu_map ps_offcpu1 SEC(".maps");

struct ps_runtime_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_RUNTIME_MAP_ENTRIES);
  __type(key, struct ps_runtime_key);
  __type(value, __u64); /* on-CPU ns */
};
struct ps_runtime_map ps_runtime0 SEC(".maps");
struct ps_runtime_map ps_runtime1 SEC(".maps");

/* Off-CPU stacks, written by sched_switch and the seeding iterator only: the on-CPU sampler
 * has its own ps_stacks<N> (common.bpf.h, "Maps written from NMI context"). */
struct ps_stack_map ps_sched_stacks0 SEC(".maps");
struct ps_stack_map ps_sched_stacks1 SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_stack);
} ps_sched_scratch SEC(".maps");

/* prev's state where the tracepoint does not pass it (ps_sched_switch3), and a task's state in
 * the seeding iterator. task_struct::state was renamed __state in Linux 5.14 (commit
 * 2f064a59a11f). */
struct task_struct___pre514 {
  long state;
} __attribute__((preserve_access_index));

static __always_inline __u32 ps_task_state(struct task_struct *t) {
  if (bpf_core_field_exists(t->__state))
    return BPF_CORE_READ(t, __state);
  struct task_struct___pre514 *old = (void *)t;
  return (__u32)BPF_CORE_READ(old, state);
}

/* The same fields of the tracepoint's own task pointers, prev and next, by direct loads. tp_btf
 * arguments are BTF-typed (PTR_TO_BTF_ID), and so are pointers loaded from them: the verifier lets
 * the program dereference them as exception-handled loads (kernel/bpf/verifier.c
 * check_ptr_to_btf_access, BPF_PROBE_MEM; Linux 5.5+), where BPF_CORE_READ makes a
 * bpf_probe_read_kernel call per pointer step (11 a switch on the path below). CO-RE still
 * relocates each offset, and the load size where the field's differs: self_exec_id is a u32
 * before Linux 5.7 (libbpf bpf_core_patch_insn). */
static __always_inline __u32 ps_btf_task_state(struct task_struct *t) {
  if (bpf_core_field_exists(t->__state)) return t->__state;
  struct task_struct___pre514 *old = (void *)t;
  return (__u32)old->state;
}

static __always_inline __u64 ps_btf_tgid_start_ns(struct task_struct *t) {
  return t->group_leader->start_boottime;
}

static __always_inline __u32 ps_btf_exec_id(struct task_struct *t) {
  return (__u32)t->self_exec_id; /* common.bpf.h ps_exec_id */
}

static __always_inline void ps_add_u64(void *map, void *key, __u64 delta, __u32 full_ctr) {
  __u64 *v = bpf_map_lookup_elem(map, key);
  if (!v) {
    __u64 zero = 0;
    long err = bpf_map_update_elem(map, key, &zero, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count_insert_error(err, full_ctr);
      return;
    }
    v = bpf_map_lookup_elem(map, key);
    if (!v)
      return;
  }
  __sync_fetch_and_add(v, delta);
}

/* Adds an interval (part) of `ns` that counts `weight` times to ps_offcpu<N> under `key`. */
static __always_inline void ps_add_offcpu(void *map, struct ps_offcpu_key *key, __u64 ns,
                                          __u64 weight, const char *comm) {
  struct ps_offcpu_value *v = bpf_map_lookup_elem(map, key);
  if (!v) {
    struct ps_offcpu_value init = {};
    __builtin_memcpy(init.comm, comm, sizeof(init.comm));
    long err = bpf_map_update_elem(map, key, &init, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count_insert_error(err, PS_CTR_OFFCPU_MAP_FULL);
      return;
    }
    v = bpf_map_lookup_elem(map, key);
    if (!v)
      return;
  }
  __sync_fetch_and_add(&v->ns, ns * weight);
  __sync_fetch_and_add(&v->count, weight);
  if (weight > 1) {
    __sync_fetch_and_add(&v->sampled_ns, ns * weight);
    __sync_fetch_and_add(&v->sampled_raw_ns, ns);
  }
}

/* A sampled interval of `ns` (its weight 0 or 2 or more) ends in the window starting at ws,
 * buffer buf: marks the thread's sums for that window (abi.h ps_uncaptured) as known and adds
 * the interval to them when it counts 0 times (`weight`). */
static __always_inline void ps_add_uncaptured(struct ps_thread_state *ts, __u64 ns, __u64 weight,
                                              __u64 ws, __u32 buf) {
  struct ps_uncaptured *u = &ts->uncaptured[buf & 1];
  if (u->ws_ns != ws) { /* the daemon read this slot's last window before the flip to buf */
    u->ns[0] = 0;
    u->ns[1] = 0;
    u->ns[2] = 0;
    u->ws_ns = ws;
  }
  if (weight != 0) return;
  /* Constant indexes: a computed one the verifier cannot bound after clang's rewrite. */
  if (ts->state == PS_STATE_RUNNABLE)
    u->ns[0] += ns;
  else if (ts->state == PS_STATE_SLEEPING)
    u->ns[1] += ns;
  else if (ts->state == PS_STATE_UNINTERRUPTIBLE)
    u->ns[2] += ns;
}

/* Thread `tid`, state `ts` (NULL: none), is switched in at `now`: account the off-CPU interval
 * it is ending. `task` is the thread when it is not running yet (next, in sched_switch), so that
 * an interval whose stacks were not captured and that counts once (long enough: abi.h
 * ps_offcpu_weight) gets its sleeping kernel stack; NULL otherwise. */
static __always_inline void ps_switch_in(struct ps_thread_state *ts, struct task_struct *task,
                                         __u32 tid, __u64 now, __u64 ws, __u32 buf) {
  if (!ts || ts->out_ns == 0)
    return;
  __u64 out = ts->out_ns;
  __u64 start = out;
  /* A preemption (run-queue wait) says nothing of how long the thread waits when it blocks. */
  if (now - out >= PS_BUDGET_EXACT_OFFCPU_NS)
    ts->last_long = 1;
  else if (ts->state != PS_STATE_RUNNABLE)
    ts->last_long = 0;
  /* Times the interval counts (abi.h ps_offcpu_weight): an uncaptured one only when long, once. */
  __u64 weight = now - out >= ps_cfg_min_offcpu_ns
                     ? ps_offcpu_weight(ts->stack_weight, ts->budget_weight, now - out)
                     : 0;
  if (weight > 1) ps_count(PS_CTR_OFFCPU_WEIGHTED); /* stands for the uncaptured intervals too */
  if (weight && (ts->stack_weight == 0 || ts->budget_weight == 0)) {
    if (task && ts->kernel_stack_err == PS_ERR_NOT_CAPTURED) {
      __u32 zero = 0;
      struct ps_stack *st = bpf_map_lookup_elem(&ps_sched_scratch, &zero);
      if (st) {
        st->flags = 0;
        void *stacks = buf == 0 ? (void *)&ps_sched_stacks0 : (void *)&ps_sched_stacks1;
        __s32 err;
        __u64 h = ps_store_stack(stacks, st, bpf_get_task_stack(task, st->ips, sizeof(st->ips), 0),
                                 0, &err);
        if (h) {
          ts->kernel_stack = h;
          ts->kernel_stack_err = 0;
        }
      }
    }
  }
  /* Crossed the window start with its weight already final there (abi.h ps_offcpu_weight_final,
   * so `weight` is the one the daemon uses): the part before it is the daemon's to attribute.
   * Not final there: the daemon left the whole interval to BPF, counted from its start. */
  if (out < ws &&
      ps_offcpu_weight_final(ts->stack_weight, ts->budget_weight, ws - out, ps_cfg_min_offcpu_ns)) {
    ts->carry_out_ns = out;
    ts->carry_user_stack = ts->user_stack;
    ts->carry_kernel_stack = ts->kernel_stack;
    ts->carry_user_stack_err = ts->user_stack_err;
    ts->carry_kernel_stack_err = ts->kernel_stack_err;
    ts->carry_state = ts->state;
    /* Its weight at the boundary, final there: 1. (The full length can be shorter than ws - out
     * when `now` is an estimated switch-in, abi.h, before ws: its weight then says nothing of the
     * part before ws.) */
    ts->carry_weight = (__u32)ps_offcpu_weight(ts->stack_weight, ts->budget_weight, ws - out);
    ps_barrier();
    ts->carry_ws_ns = ws;
    start = ws;
  }
  /* Weight 0 (not captured) or 2 or more: the daemon scales the weighted ones to the exact
   * total (abi.h ps_uncaptured). Only an interval counted whole here: a weight-0 one is final at
   * ws only when closed at an estimated switch-in before ws, and the daemon cut it at ws. */
  if (weight != 1 && start == out && now - out >= ps_cfg_min_offcpu_ns)
    ps_add_uncaptured(ts, now - out, weight, ws, buf);
  if (weight && now > start) {
    struct ps_offcpu_key key = {};
    key.tgid = ts->tgid;
    key.tid = tid;
    key.tgid_start_ns = ts->tgid_start_ns;
    key.exec_id = ts->exec_id;
    key.user_stack = ts->user_stack;
    key.kernel_stack = ts->kernel_stack;
    key.user_stack_err = ts->user_stack_err;
    key.kernel_stack_err = ts->kernel_stack_err;
    key.state = ts->state;
    ps_add_offcpu(buf == 0 ? (void *)&ps_offcpu0 : (void *)&ps_offcpu1, &key, now - start, weight,
                  ts->comm);
  }
  ps_barrier();
  ts->out_ns = 0;
}

/* Off-CPU stack sampling (abi.h, PS_RATE_PERIOD_NS): counts this switch-out in the thread's rate
 * period and returns the weight of its stacks, or 0 when they are not to be captured. */
static __always_inline __u32 ps_stack_sample(struct ps_thread_state *ts, __u64 now) {
  if (ps_cfg_stack_rate == 0)
    return 1;
  __u64 elapsed = now - ts->rate_start_ns;
  if (elapsed >= PS_RATE_PERIOD_NS) {
    /* w = floor(rate / R), rate = switch-outs per second over the period that just ended. */
    /* Divided in two steps: elapsed * R would overflow after a sleep of ~200 days at R=1000. */
    __u64 w = (__u64)ts->rate_count * 1000000000ULL / elapsed / ps_cfg_stack_rate;
    ts->sample_weight = w > PS_MAX_STACK_WEIGHT ? PS_MAX_STACK_WEIGHT : (__u32)w;
    ts->rate_start_ns = now;
    ts->rate_count = 0;
  }
  ts->rate_count++;
  __u32 w = ts->sample_weight;
  if (w <= 1)
    return 1;
  if (bpf_get_prandom_u32() % w != 0) {
    ps_count(PS_CTR_OFFCPU_NOT_CAPTURED);
    return 0;
  }
  return w;
}

/* The CPU's capture budget (abi.h PS_BUDGET_EXACT_OFFCPU_NS) for a switch-out the per-thread
 * stage chose: counts it in the CPU's rate period and returns the weight of its stacks, c, or 0
 * when they are not to be captured. `exempt` (a voluntary switch-out of a thread whose last wait
 * was long): captured with weight 1 within the CPU's allowance for those, else a candidate. */
static __always_inline __u32 ps_budget_sample(struct ps_cpu_state *cs, __u64 now, int exempt) {
  if (ps_cfg_stack_budget == 0 && ps_cfg_stack_cpu_ns == 0) return 1;
  __u64 elapsed = now - cs->budget_start_ns;
  if (elapsed >= PS_RATE_PERIOD_NS) {
    /* c = ceil(rate / B), rate = candidates per second over the period that just ended: at most
     * B captures a second; and at least ceil(rate * m / T): at most T ns of captures a second. */
    __u64 rate = (__u64)cs->budget_count * 1000000000ULL / elapsed;
    __u64 c = ps_cfg_stack_budget ? (rate + ps_cfg_stack_budget - 1) / ps_cfg_stack_budget : 1;
    if (cs->budget_captures) {
      __u64 m = cs->budget_capture_ns / cs->budget_captures;
      cs->budget_cost_ns = m > 0xffffffffULL ? 0xffffffffU : (__u32)m;
    }
    if (ps_cfg_stack_cpu_ns) {
      __u64 ct = (rate * cs->budget_cost_ns + ps_cfg_stack_cpu_ns - 1) / ps_cfg_stack_cpu_ns;
      if (ct > c) c = ct;
    }
    cs->budget_weight = c > PS_MAX_STACK_WEIGHT ? PS_MAX_STACK_WEIGHT : (__u32)c;
    cs->budget_start_ns = now;
    cs->budget_count = 0;
    cs->budget_exempt = 0;
    cs->budget_captures = 0;
    cs->budget_capture_ns = 0;
  }
  /* Exempt: within B a second of its own (B / 10 a period), and T ns a second (T / 10 a
   * period at the last mean cost), not a candidate (c unchanged). */
  const __u64 periods = 1000000000ULL / PS_RATE_PERIOD_NS;
  if (exempt &&
      (ps_cfg_stack_budget == 0 || (__u64)cs->budget_exempt * periods < ps_cfg_stack_budget) &&
      (ps_cfg_stack_cpu_ns == 0 ||
       (__u64)cs->budget_exempt * cs->budget_cost_ns * periods < ps_cfg_stack_cpu_ns)) {
    cs->budget_exempt++;
    return 1;
  }
  cs->budget_count++;
  __u32 c = cs->budget_weight;
  if (c <= 1) return 1;
  if (bpf_get_prandom_u32() % c != 0) {
    ps_count(PS_CTR_OFFCPU_OVER_BUDGET);
    return 0;
  }
  return c;
}

/* prev is switched out at `now` (runs in prev's context: stacks are prev's) in task state `st`
 * (task_struct::__state bits, PS_TASK_*); it came in at in_ns (0: unknown). Returns 1 when it
 * captured stacks (time has passed since `now`), else 0. */
static __always_inline int ps_switch_out(void *ctx, struct ps_cpu_state *cs,
                                         struct task_struct *prev, __u32 tid, __u32 tgid,
                                         int preempt, __u32 st, __u64 now, __u64 in_ns, __u64 ws,
                                         __u32 buf) {
  if (st & PS_TASK_DEAD) {
    if (!ps_cfg_task_storage) bpf_map_delete_elem(&ps_threads, &tid);
    return 0; /* task storage goes with the task */
  }
  struct ps_thread_state *ts = ps_thread_state_of(prev, tid);
  if (!ts && ps_cfg_task_storage) {
    ps_count(PS_CTR_THREAD_MAP_FULL); /* no state (ps_thread_storage) */
    return 0;
  } else if (!ts) {
    long err = bpf_map_update_elem(&ps_threads, &tid, &ps_empty_thread_state, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count_insert_error(err, PS_CTR_THREAD_MAP_FULL);
      return 0;
    }
    ts = bpf_map_lookup_elem(&ps_threads, &tid);
    if (!ts) return 0;
  } else if (ts->out_ns != 0) {
    /* Still marked off-CPU: its switch-in was not reported. Close that interval where prev came
     * in (estimated), instead of losing it. */
    ps_switch_in(ts, NULL, tid, in_ns > ts->out_ns ? in_ns : ts->out_ns, ws, buf);
  }
  __u32 state;
  if (preempt || st == PS_TASK_RUNNING)
    state = PS_STATE_RUNNABLE;
  else if ((st & PS_TASK_UNINTERRUPTIBLE) && !(st & PS_TASK_NOLOAD))
    state = PS_STATE_UNINTERRUPTIBLE;
  else
    state = PS_STATE_SLEEPING; /* interruptible, TASK_IDLE, stopped, traced */
  ts->stack_weight = ps_stack_sample(ts, now);
  ts->budget_weight =
      ts->stack_weight
          ? ps_budget_sample(cs, now, ts->last_long && !preempt && st != PS_TASK_RUNNING)
          : 1;
  __u64 tgid_start_ns = ps_btf_tgid_start_ns(prev);
  __u32 exec_id = ps_btf_exec_id(prev);
  /* Another image than at the last switch-out, sampled or not (ts's identity fields, set at
   * every switch-out below): the memo is of the old one. */
  if (ts->tgid != tgid || ts->tgid_start_ns != tgid_start_ns || ts->exec_id != exec_id)
    ts->memo.n = 0;
  const int capture = ts->stack_weight && ts->budget_weight;
  __u64 capture_start = 0;
  if (capture) {
    capture_start = bpf_ktime_get_ns();
    void *stacks = buf == 0 ? (void *)&ps_sched_stacks0 : (void *)&ps_sched_stacks1;
    ts->kernel_stack = ps_capture_kernel_stack(ctx, &ps_sched_scratch, stacks, &ts->kernel_stack_err);
    /* The user stack: the thread's last walk if it still holds (abi.h ps_user_memo), else a
     * walk, which becomes the memo. The memo is of the image in ts's identity fields (cleared
     * below whenever they change). */
    __u64 memo = ps_user_memo_hit(&ts->memo, ws);
    if (memo) {
      ts->user_stack = memo;
      ts->user_stack_err = 0;
      ps_count(PS_CTR_UNWIND_MEMO_HITS);
    } else {
      ts->user_stack = ps_capture_user_stack(0, stacks, tgid, tgid_start_ns, exec_id,
                                             &ts->user_stack_err, /*use_vma=*/0);
      ps_user_memo_store(&ts->memo, ts->user_stack, ws);
    }
  } else {
    ts->kernel_stack = 0;
    ts->user_stack = 0;
    ts->kernel_stack_err = PS_ERR_NOT_CAPTURED;
    ts->user_stack_err = PS_ERR_NOT_CAPTURED;
  }
  ts->tgid = tgid;
  ts->tgid_start_ns = tgid_start_ns;
  ts->exec_id = exec_id;
  ts->state = state;
  bpf_get_current_comm(ts->comm, sizeof(ts->comm));
  ps_barrier();
  /* The interval starts after the stack walks, which run on prev's CPU time: stamped at `now`,
   * captured intervals would be longer than uncaptured ones by the walk (~5 us here) and their
   * weights would inflate the off-CPU total (measured: +19% at 20k switches/s). Without a walk
   * `now` stands (a clock read is 20-40 ns on a kvm-clock guest). */
  if (!capture) {
    ts->out_ns = now;
    return 0;
  }
  __u64 done = bpf_ktime_get_ns();
  ts->out_ns = done;
  /* The capture's CPU time, for the budget in time (ps_budget_sample) and /metrics. */
  cs->budget_captures++;
  cs->budget_capture_ns += done - capture_start;
  ps_count(PS_CTR_OFFCPU_CAPTURES);
  ps_count_add(PS_CTR_OFFCPU_CAPTURE_NS, done - capture_start);
  return 1;
}

/* Adds prev's on-CPU time [from, now] to buffer buf: to this CPU's pending entry for it while the
 * image and window stay the same, else to ps_runtime<buf> (abi.h ps_runtime_pending). The part
 * before the window start ws
 * is the daemon's when `carry` (the copy in cs says when prev came in), else it is dropped (an
 * estimated switch-in: the daemon already counted that span at the boundary, if at all). */
static __always_inline void ps_add_runtime(struct ps_cpu_state *cs, __u32 tgid,
                                           __u64 tgid_start_ns, __u32 exec_id, __u64 from,
                                           __u64 now, __u64 ws, __u32 buf, int carry) {
  if (from < ws) {
    if (carry) {
      cs->carry_in_ns = from;
      cs->carry_tgid = tgid;
      cs->carry_tgid_start_ns = tgid_start_ns;
      cs->carry_exec_id = exec_id;
      ps_barrier();
      cs->carry_ws_ns = ws;
    }
    from = ws;
  }
  if (now <= from) return;
  /* Pending while the image and window stay (abi.h ps_runtime_pending): plain stores, the entry
   * is this CPU's and only sched_switch writes it. */
  struct ps_runtime_pending *p = buf == 0 ? &cs->pending[0] : &cs->pending[1];
  if (p->ws_ns == ws && p->tgid == tgid && p->tgid_start_ns == tgid_start_ns &&
      p->exec_id == exec_id) {
    p->ns += now - from;
    return;
  }
  if (p->ws_ns == ws && p->ns != 0) { /* another image in this window: the old one to the map */
    struct ps_runtime_key rk = {
        .tgid = p->tgid, .exec_id = p->exec_id, .tgid_start_ns = p->tgid_start_ns};
    ps_add_u64(buf == 0 ? (void *)&ps_runtime0 : (void *)&ps_runtime1, &rk, p->ns,
               PS_CTR_RUNTIME_MAP_FULL);
  }
  p->ws_ns = 0; /* the daemon never pairs a key with another's ns (it reads after the flip) */
  ps_barrier();
  p->tgid = tgid;
  p->tgid_start_ns = tgid_start_ns;
  p->exec_id = exec_id;
  p->ns = now - from;
  ps_barrier();
  p->ws_ns = ws;
}

/* One switch from prev to next. `state_arg`: the tracepoint passed prev's state as prev_state
 * (a constant per program, so each variant compiles to one path); else it is read from prev. */
static __always_inline int ps_on_switch(void *ctx, int preempt, struct task_struct *prev,
                                        struct task_struct *next, int state_arg,
                                        __u32 prev_state) {
  __u32 zero = 0;
  struct ps_control *ctl = ps_get_control();
  struct ps_cpu_state *cs = bpf_map_lookup_elem(&ps_cpu_state, &zero);
  if (!ctl || !cs)
    return 0;
  ps_count(PS_CTR_SWITCHES);
  cs->in_switch = 1;
  ps_barrier();
  /* Control first, then the clock: seeing the new buffer implies now >= its window start. The
   * buffer's own start, not window_start_ns: a consistent pair during a flip (abi.h). */
  __u32 buf = ctl->active_buffer;
  __u64 ws = ctl->buffer_start_ns[buf & 1];
  __u64 now = bpf_ktime_get_ns();
  __u32 prev_tid = prev->pid, prev_tgid = prev->tgid;
  __u32 next_tid = next->pid, next_tgid = next->tgid;
  int prev_tracked = prev_tid != 0 && ps_tgid_tracked(prev_tgid);

  /* prev leaves. On a CPU not seen since attach, prev was never counted or timed. prev_in_ns:
   * when prev came in (0: unknown), to close an off-CPU interval whose end was not reported. */
  __u64 prev_in_ns = 0;
  /* The group this CPU holds a ps_running count in (0: none), returned once next's is known. */
  __u64 held = 0;
  if (!ps_cpu_first_seen(cs, ctl)) {
    held = cs->in_running ? cs->group : 0;
    if (cs->tid == prev_tid) {
      prev_in_ns = cs->in_ns;
      if (cs->counted && prev_tid != 0) {
        ps_add_runtime(cs, cs->tgid, cs->tgid_start_ns, cs->exec_id, cs->in_ns, now, ws, buf, 1);
      }
    } else {
      /* The tracepoint missed switches on this CPU (abi.h): the recorded task left unseen (its
       * count, `held`, is returned or kept below) and prev came in unseen. */
      ps_count(PS_CTR_SWITCH_CHAIN_BREAKS);
      prev_in_ns = ps_unseen_switch_ns(cs, now);
      if (prev_tracked)
        ps_add_runtime(cs, prev_tgid, ps_btf_tgid_start_ns(prev), ps_btf_exec_id(prev), prev_in_ns,
                       now, ws, buf, 0);
    }
  }
  if (ps_cfg_offcpu && prev_tracked) {
    __u32 st = state_arg ? prev_state : ps_btf_task_state(prev);
    if (ps_switch_out(ctx, cs, prev, prev_tid, prev_tgid, preempt, st, now, prev_in_ns, ws, buf))
      now = bpf_ktime_get_ns(); /* next comes in after prev's stack walks */
  }

  /* next enters. A process whose last thread is exiting (signal->live is 0 from do_exit on,
   * kernel/exit.c) makes no new count: its exit hook deleted the count, and a thread preempted
   * between that hook and its final switch-out would otherwise make one nothing deletes. */
  int counted = next_tid != 0 && ps_tgid_tracked(next_tgid);
  const int may_insert = !counted || next->signal->live.counter != 0;
  const __u64 next_group = counted ? ps_group_of(next, next_tgid) : 0;
  /* This CPU's count moves from the held group (prev's, or on a chain break the unseen task's)
   * to next's. Between threads of one group (a pipe ping-pong, a thread pool) it stays: the
   * count is the same after the switch, and two hash map operations are saved (bench/
   * switch_ab.py: -10% a switch in a ping-pong). Else the held count is returned here, after
   * prev's stack walk: another CPU's sample meanwhile still counts prev, which has not left the
   * CPU yet. next_group != 0 implies `counted`, as ps_cpu_record's keep requires. */
  const int keep = held != 0 && next_group == held;
  if (held != 0 && !keep) ps_running_add(held, -1, 0);
  ps_cpu_record(cs, next_tid, next_tgid, next_group, counted ? ps_btf_tgid_start_ns(next) : 0,
                counted ? ps_btf_exec_id(next) : 0, now, counted, may_insert, keep);
  if (counted && ps_cfg_offcpu)
    ps_switch_in(ps_thread_state_of(next, next_tid), next, next_tid, now, ws, buf);
  ps_barrier();
  cs->in_switch = 0;
  return 0;
}

/* sched_switch has passed prev's state as a 4th argument since Linux 5.18 (commit fa2c3254d7cf,
 * "sched/tracing: Don't re-read p->state when emitting sched_switch event"): the state
 * __schedule() acted on. Reading prev->__state in the tracepoint races with a wake-up on another
 * CPU that has already set it to TASK_WAKING, and an uninterruptible wait would then be
 * recorded as an interruptible one. The daemon loads exactly one of the two variants, by the
 * parameters of the kernel's btf_trace_sched_switch (agent/bpf/probe.h TracepointArgCount):
 * this one for 4, ps_sched_switch3 for 3. The choice is made before load: the verifier refuses
 * a program reading an argument its tracepoint does not have. */
SEC("tp_btf/sched_switch")
int BPF_PROG(ps_sched_switch, bool preempt, struct task_struct *prev, struct task_struct *next,
             unsigned int prev_state) {
  ps_enter();
  int rc = ps_on_switch(ctx, preempt, prev, next, 1, prev_state);
  ps_leave();
  return rc;
}

/* The 3-argument tracepoint (kernels before 5.18): prev's state read from the task. */
SEC("tp_btf/sched_switch")
int BPF_PROG(ps_sched_switch3, bool preempt, struct task_struct *prev, struct task_struct *next) {
  ps_enter();
  int rc = ps_on_switch(ctx, preempt, prev, next, 0, 0);
  ps_leave();
  return rc;
}

/* Gives `group` a ps_running entry (count 0) unless it has one: the sampler, which may find the
 * group's threads running before any switch showed them, only adds to existing entries
 * (common.bpf.h, "Maps written from NMI context"). */
static __always_inline void ps_running_seed(__u64 group) {
  if (group == 0 || bpf_map_lookup_elem(&ps_running, &group))
    return;
  __s64 zero = 0;
  long err = bpf_map_update_elem(&ps_running, &group, &zero, BPF_NOEXIST);
  if (!err)
    ps_count(PS_CTR_GROUPS_MADE);
  else if (err != -EEXIST)
    ps_count_insert_error(err, PS_CTR_RUNNING_MAP_FULL);
}

/* Task storage only: run once by the daemon after ps_thread_new and before sched_switch is
 * attached. Gives every tracked thread alive an empty state (ps_thread_storage), so that from
 * its attach on sched_switch records every switch-out (ps_seed_threads then fills the states of
 * the threads that stayed off-CPU). */
SEC("iter/task")
int ps_make_states(struct bpf_iter__task *ctx) {
  struct task_struct *task = ctx->task;
  if (!task || !ps_cfg_task_storage || !ps_cfg_offcpu) return 0;
  if (task->pid == 0 || !ps_tgid_tracked(task->tgid)) return 0;
  if (!bpf_task_storage_get(&ps_thread_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE))
    ps_count(PS_CTR_THREAD_MAP_FULL);
  return 0;
}

/* Run once by the daemon through an iterator fd after sched_switch is attached and before the
 * sampler is. Gives every tracked process a ps_running entry (ps_running_seed). With off-CPU
 * tracking, also gives a state to the threads that are off-CPU at attach, so a thread asleep
 * since before attach is accounted from the attach on (a thread blocked for the whole window
 * contributes the whole window), instead of appearing only after it first wakes; a state made
 * meanwhile by a real switch-out is kept (task storage: a state still empty, see ps_make_states,
 * is filled). The kernel stack comes from bpf_get_task_stack(); a sleeping task's user registers
 * are not reachable from here, so its user stack is marked PS_ERR_ASLEEP_AT_ATTACH. */
SEC("iter/task")
int ps_seed_threads(struct bpf_iter__task *ctx) {
  struct task_struct *task = ctx->task;
  if (!task)
    return 0;
  __u32 tid = task->pid, tgid = task->tgid;
  if (tid == 0 || !ps_tgid_tracked(tgid))
    return 0;
  ps_running_seed(ps_group_of(task, tgid));
  if (!ps_cfg_offcpu) return 0;
  if (task->on_cpu) return 0;
  /* Task storage: every thread has had a state since before sched_switch was attached
   * (ps_make_states), empty (tgid 0) until a switch-out fills it. A thread off-CPU now whose
   * state is still empty has not switched out since attach: it has been off-CPU since before. */
  struct ps_thread_state *held = 0;
  if (ps_cfg_task_storage) {
    held = bpf_task_storage_get(&ps_thread_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    if (!held) {
      ps_count(PS_CTR_THREAD_MAP_FULL);
      return 0;
    }
    if (held->tgid != 0 || held->out_ns != 0) return 0;
  } else if (bpf_map_lookup_elem(&ps_threads, &tid)) {
    return 0; /* made by a switch-out since attach */
  }
  struct ps_control *ctl = ps_get_control();
  __u32 zero = 0;
  struct ps_stack *st = bpf_map_lookup_elem(&ps_sched_scratch, &zero);
  struct ps_thread_state *tsp = bpf_map_lookup_elem(&ps_seed_scratch, &zero);
  if (!ctl || !st || !tsp) return 0;
  __builtin_memset(tsp, 0, sizeof(*tsp));
  __u32 state = ps_task_state(task);
  if (state & PS_TASK_DEAD)
    return 0;
  tsp->state = state == PS_TASK_RUNNING ? PS_STATE_RUNNABLE
               : ((state & PS_TASK_UNINTERRUPTIBLE) && !(state & PS_TASK_NOLOAD))
                   ? PS_STATE_UNINTERRUPTIBLE
                   : PS_STATE_SLEEPING;
  tsp->tgid = tgid;
  tsp->tgid_start_ns = BPF_CORE_READ(task, group_leader, start_boottime);
  tsp->exec_id = ps_exec_id(task);
  BPF_CORE_READ_STR_INTO(&tsp->comm, task, comm);
  tsp->user_stack_err = PS_ERR_ASLEEP_AT_ATTACH;
  tsp->stack_weight = 1;
  tsp->budget_weight = 1;
  st->flags = 0;
  void *stacks = ctl->active_buffer == 0 ? (void *)&ps_sched_stacks0 : (void *)&ps_sched_stacks1;
  tsp->kernel_stack = ps_store_stack(
      stacks, st, bpf_get_task_stack(task, st->ips, sizeof(st->ips), 0), 0, &tsp->kernel_stack_err);
  tsp->out_ns = ctl->window_start_ns;
  if (held) {
    /* Filled in place, out_ns last, if still empty (the stack walk above took time). A thread
     * that woke meanwhile and is running when out_ns lands is closed at its real switch-in by
     * its next switch-out (ps_switch_out's estimated close: [window start, switch-in]); one
     * that also switched out within these few stores may mix the two writes, once. */
    if (held->tgid != 0 || held->out_ns != 0) return 0;
    tsp->out_ns = 0;
    __builtin_memcpy(held, tsp, sizeof(*tsp));
    ps_barrier();
    held->out_ns = ctl->window_start_ns;
    return 0;
  }
  long err = bpf_map_update_elem(&ps_threads, &tid, tsp, BPF_NOEXIST);
  if (err && err != -EEXIST)
    ps_count_insert_error(err, PS_CTR_THREAD_MAP_FULL);
  return 0;
}

/* Task storage only (loaded where ps_cfg_task_storage is 1): a new task's empty state
 * (ps_thread_storage). task_newtask fires in kernel/fork.c copy_process for every new task (fork,
 * clone, kernel threads, create_io_thread, vhost_task_create), after the task is on the task
 * list and before anything can wake it, with no lock held. Made for a thread whose process is
 * tracked or, following forks, whose creator's is (ps_process_fork in oncpu.bpf.c adds a child
 * process to the tree later, at sched_process_fork). */
SEC("tp_btf/task_newtask")
int BPF_PROG(ps_thread_new, struct task_struct *task, __u64 clone_flags) {
  if (!ps_cfg_task_storage || !ps_cfg_offcpu) return 0;
  if (task->pid == 0) /* an idle task (fork_idle) */
    return 0;
  if (!ps_tgid_tracked(task->tgid) &&
      !(ps_cfg_follow_forks && ps_tgid_tracked(bpf_get_current_pid_tgid() >> 32)))
    return 0;
  if (!bpf_task_storage_get(&ps_thread_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE))
    ps_count(PS_CTR_THREAD_MAP_FULL);
  return 0;
}

/* Task storage only: the daemon's read of every thread state (agent/bpf/map_reader.cc
 * VisitThreads), one record per thread that has one: struct ps_thread_record_head (abi.h),
 * then the state. A tracked thread without one gets an empty one here (ps_thread_storage), so
 * a state that could not be made earlier is missing for at most a window. */
SEC("iter/task")
int ps_dump_threads(struct bpf_iter__task *ctx) {
  struct task_struct *task = ctx->task;
  if (!task || !ps_cfg_task_storage) return 0;
  struct ps_thread_state *ts = bpf_task_storage_get(&ps_thread_storage, task, 0, 0);
  if (!ts) {
    if (task->pid != 0 && ps_tgid_tracked(task->tgid))
      bpf_task_storage_get(&ps_thread_storage, task, 0, BPF_LOCAL_STORAGE_GET_F_CREATE);
    return 0; /* nothing to report yet */
  }
  struct ps_thread_record_head head = {.tid = task->pid};
  bpf_seq_write(ctx->meta->seq, &head, sizeof(head));
  bpf_seq_write(ctx->meta->seq, ts, sizeof(*ts));
  return 0;
}

/* Thread `task` (tid) exits: its sums of uncaptured intervals in this window (abi.h
 * ps_uncaptured), which go with its state, become a PS_ERR_UNCAPTURED_SUM record in the window's
 * buffer when they reach PS_EXACT_OFFCPU_NS. Below that the thread keeps its weighted figures: a
 * key for each short-lived process would crowd the buffer out under churn (measured: 12000
 * `/bin/true` in a window dropped 3575 intervals with a key per state and thread). Intervals it
 * ends later (a preemption before its last switch-out) are not added. */
static __always_inline void ps_hand_over_uncaptured(struct task_struct *task, __u32 tid) {
  struct ps_thread_state *ts = ps_thread_state_of(task, tid);
  struct ps_control *ctl = ps_get_control();
  if (!ts || !ctl) return;
  const __u32 buf = ctl->active_buffer;
  struct ps_uncaptured *u = &ts->uncaptured[buf & 1];
  if (u->ws_ns != ctl->buffer_start_ns[buf & 1]) return; /* no sampled interval in this window */
  if (u->ns[0] + u->ns[1] + u->ns[2] < PS_EXACT_OFFCPU_NS) return;
  struct ps_offcpu_key key = {};
  key.tgid = ts->tgid;
  key.tid = tid;
  key.tgid_start_ns = ts->tgid_start_ns;
  key.exec_id = ts->exec_id;
  key.user_stack_err = PS_ERR_UNCAPTURED_SUM;
  key.kernel_stack_err = PS_ERR_UNCAPTURED_SUM;
  struct ps_offcpu_value v = {};
  v.ns = u->ns[0];
  v.count = 1;
  v.sampled_ns = u->ns[1];
  v.sampled_raw_ns = u->ns[2];
  __builtin_memcpy(v.comm, ts->comm, sizeof(v.comm));
  long err =
      bpf_map_update_elem(buf == 0 ? (void *)&ps_offcpu0 : (void *)&ps_offcpu1, &key, &v, BPF_ANY);
  if (err) ps_count_insert_error(err, PS_CTR_OFFCPU_MAP_FULL);
  u->ws_ns = 0;
}

/* Process exit: forget the thread (hash only: task storage goes with the task) and, per process
 * (PS_GROUP_PROCESS), the process's parallelism entry once its last thread exits (signal->live
 * reaches 0 in do_exit before this tracepoint, kernel/exit.c). */
static __always_inline int ps_on_exit(struct task_struct *task) {
  __u32 tid = BPF_CORE_READ(task, pid), tgid = BPF_CORE_READ(task, tgid);
  if (ps_cfg_offcpu) ps_hand_over_uncaptured(task, tid);
  if (!ps_cfg_task_storage) bpf_map_delete_elem(&ps_threads, &tid); /* storage: with the task */
  if (ps_cfg_group == PS_GROUP_PROCESS && BPF_CORE_READ(task, signal, live.counter) == 0) {
    __u64 group = tgid;
    if (bpf_map_delete_elem(&ps_running, &group) == 0)
      ps_count(PS_CTR_GROUPS_RELEASED);
  }
  return 0;
}

SEC("tp_btf/sched_process_exit")
int BPF_PROG(ps_process_exit, struct task_struct *task) {
  ps_enter();
  int rc = ps_on_exit(task);
  ps_leave();
  return rc;
}

/* --latency-group=cgroup: a cgroup's parallelism entry goes when the cgroup is removed. rmdir
 * succeeds only on a cgroup without live tasks (kernel/cgroup/cgroup.c cgroup_destroy_locked:
 * -EBUSY while populated), so no thread is counted in it any more: tp_btf/cgroup_rmdir deletes
 * the entry then. The kernel frees the cgroup itself later, when the last reference goes (a
 * dying memory cgroup can hold it for long: css_release_work_fn, tracepoint cgroup_release);
 * that hook deletes again, for an entry a task still exiting from it made meanwhile. Only
 * cgroups of the default hierarchy are groups; its hierarchy_id is 0 (the "0::" line of
 * /proc/PID/cgroup, cgroup_init_root_id), and v1 hierarchies number their own kernfs ids. */
static __always_inline int ps_cgroup_gone(struct cgroup *cgrp) {
  if (BPF_CORE_READ(cgrp, root, hierarchy_id) != 0)
    return 0;
  __u64 group = BPF_CORE_READ(cgrp, kn, id);
  if (bpf_map_delete_elem(&ps_running, &group) == 0)
    ps_count(PS_CTR_GROUPS_RELEASED);
  return 0;
}

SEC("tp_btf/cgroup_rmdir")
int BPF_PROG(ps_cgroup_rmdir, struct cgroup *cgrp) { /* the second argument, path, unread */
  return ps_cgroup_gone(cgrp);
}

SEC("tp_btf/cgroup_release")
int BPF_PROG(ps_cgroup_release, struct cgroup *cgrp) {
  return ps_cgroup_gone(cgrp);
}
