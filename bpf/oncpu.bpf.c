// SPDX-License-Identifier: GPL-2.0
/* On-CPU stack sampling: a perf_event program attached on every online CPU (cycles, or
 * cpu-clock where there is no PMU) records (tgid, tid, user stack, kernel stack, parallelism)
 * -> (count, period) in a double-buffered in-kernel aggregate. The daemon flips
 * ps_control.active_buffer at each window boundary, waits until every CPU has left the program
 * (agent/bpf/programs.cc), then drains the inactive buffer; samples taken meanwhile go to the
 * other buffer, so none are lost. */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "abi.h"
#include "common.bpf.h"
#include "unwind.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set before load: 1 when sched.bpf.o maintains ps_running, so samples carry parallelism. */
const volatile __u32 ps_cfg_parallelism = 0;

/* A sample repairs its CPU's record only when the record is older than this (ns): between the
 * sched_switch tracepoint and the end of the switch, `current` is still prev (kernel/sched/core.c
 * __schedule -> context_switch), which an NMI-driven sample can observe. */
#define PS_REPAIR_MIN_AGE_NS 100000ULL

struct ps_oncpu_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_ONCPU_MAP_ENTRIES); /* resized by the daemon before load */
  __type(key, struct ps_oncpu_key);
  __type(value, struct ps_oncpu_value);
};
struct ps_oncpu_map ps_oncpu0 SEC(".maps");
struct ps_oncpu_map ps_oncpu1 SEC(".maps");

/* The sampler's own stacks (sched_switch has ps_sched_stacks<N>: common.bpf.h, "Maps written from
 * NMI context"). */
/* The exec hook's scratch for a new ps_vma_cache entry (beyond the 512-byte BPF stack). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_vma_cache);
} ps_vma_cache_scratch SEC(".maps");

struct ps_stack_map ps_stacks0 SEC(".maps");
struct ps_stack_map ps_stacks1 SEC(".maps");

/* Per-CPU scratch for one stack (1 KiB is beyond the 512-byte BPF stack); the sampler's own, as
 * it may interrupt sched_switch (NMI) on the same CPU. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_stack);
} ps_oncpu_scratch SEC(".maps");

/* Records one sample into one buffer's maps. */
static __always_inline void ps_record(struct bpf_perf_event_data *ctx, void *stacks, void *oncpu,
                                      struct ps_oncpu_key *key, __u64 period,
                                      const int use_vma) {
  /* A stack that was walked but not stored is counted by ps_store_stack, not as a fault. */
  key->kernel_stack =
      ps_capture_kernel_stack(ctx, &ps_oncpu_scratch, stacks, &key->kernel_stack_err);
  if (key->kernel_stack_err && !ps_stack_store_failed(key->kernel_stack_err))
    ps_count(PS_CTR_KERNEL_STACK_FAULT);
  key->user_stack = ps_capture_user_stack((struct pt_regs *)&ctx->regs, stacks, key->tgid,
                                          key->tgid_start_ns, key->exec_id,
                                          &key->user_stack_err, use_vma);
  if (key->user_stack_err && !ps_stack_store_failed(key->user_stack_err))
    ps_count(PS_CTR_USER_STACK_FAULT);

  struct ps_oncpu_value *val = bpf_map_lookup_elem(oncpu, key);
  if (!val) {
    struct ps_oncpu_value init = {};
    bpf_get_current_comm(init.comm, sizeof(init.comm));
    /* BPF_NOEXIST: another CPU may have inserted the same key meanwhile; then add to it. */
    long err = bpf_map_update_elem(oncpu, key, &init, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count_insert_error(err, PS_CTR_AGG_MAP_FULL);
      return;
    }
    val = bpf_map_lookup_elem(oncpu, key);
    if (!val) {
      ps_count(PS_CTR_AGG_MAP_FULL);
      return;
    }
  }
  __sync_fetch_and_add(&val->count, 1);
  __sync_fetch_and_add(&val->period_sum, period);
}

static __always_inline int ps_sample(struct bpf_perf_event_data *ctx, const int use_vma) {
  struct ps_control *ctl = ps_get_control();
  __u32 zero = 0;
  struct ps_cpu_state *cs = bpf_map_lookup_elem(&ps_cpu_state, &zero);
  if (!ctl || !cs)
    return 0;
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32, tid = (__u32)pid_tgid;
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  int tracked = tid != 0 && ps_tgid_tracked(tgid);
  __u64 group = tracked ? ps_group_of(task, tgid) : 0;

  if (ps_cfg_parallelism) {
    __u64 now = bpf_ktime_get_ns();
    if (ps_cpu_first_seen(cs, ctl)) {
      /* First sight of this CPU since attach: the interrupted task has been running since
       * before attach and no switch counted it yet. */
      ps_cpu_record(cs, tid, tgid, group, BPF_CORE_READ(task, group_leader, start_boottime),
                    ps_exec_id(task), now, tracked, /*may_insert=*/0, /*keep=*/0);
    } else if (cs->tid != tid && !cs->in_switch && now - cs->in_ns > PS_REPAIR_MIN_AGE_NS) {
      /* The interrupted task came in by a switch the tracepoint did not report (abi.h, "Switches
       * the sched_switch tracepoint did not report"). The age guard skips the instants between
       * sched_switch and the switch itself, where an NMI sample still sees prev running. */
      ps_count(PS_CTR_SAMPLE_REPAIRS);
      if (cs->in_running)
        ps_running_add(cs->group, -1, 0);
      ps_cpu_record(cs, tid, tgid, group, BPF_CORE_READ(task, group_leader, start_boottime),
                    ps_exec_id(task), ps_unseen_switch_ns(cs, now), tracked, /*may_insert=*/0,
                    /*keep=*/0);
    }
    cs->sample_ns = now;
  }
  if (tid == 0) {
    ps_count(PS_CTR_SAMPLES_IDLE);
    return 0;
  }
  if (!tracked) {
    ps_count(PS_CTR_SAMPLES_FILTERED);
    return 0;
  }
  ps_count(PS_CTR_SAMPLES);

  struct ps_oncpu_key key = {};
  key.tgid = tgid;
  key.tid = tid;
  key.tgid_start_ns = BPF_CORE_READ(task, group_leader, start_boottime);
  key.exec_id = ps_exec_id(task);
  key.parallelism = 1;
  key.group = group;
  if (ps_cfg_parallelism) {
    /* The count of the group this CPU's record counts the task in (a task moved to another
     * cgroup while running is counted in its old one until it switches out). */
    __u64 counted_in = cs->tid == tid && cs->in_running ? cs->group : group;
    key.group = counted_in;
    __s64 *n = bpf_map_lookup_elem(&ps_running, &counted_in);
    if (n && *n > 1)
      key.parallelism = *n > 0xffffffffLL ? 0xffffffffU : (__u32)*n;
    if (ctl->unknown_cpus > 0) {
      key.flags |= PS_SAMPLE_PARALLELISM_UNKNOWN;
      ps_count(PS_CTR_SAMPLES_PARALLELISM_UNKNOWN);
    }
  }
  if (ctl->active_buffer == 0)
    ps_record(ctx, &ps_stacks0, &ps_oncpu0, &key, ctx->sample_period, use_vma);
  else
    ps_record(ctx, &ps_stacks1, &ps_oncpu1, &key, ctx->sample_period, use_vma);
  return 0;
}

SEC("perf_event")
int ps_on_cpu_sample(struct bpf_perf_event_data *ctx) {
  ps_enter();
  int rc = ps_sample(ctx, /*use_vma=*/0);
  ps_leave();
  return rc;
}

/* The sampler for Linux 5.17+: a pc outside the process's known mappings (a library ld.so mapped
 * a moment ago, a process the daemon has not read yet) is unwound through its vma's file table
 * (bpf_find_vma). One of the two is loaded (agent/bpf/programs.cc). */
SEC("perf_event")
int ps_on_cpu_sample_vma(struct bpf_perf_event_data *ctx) {
  ps_enter();
  int rc = ps_sample(ctx, /*use_vma=*/1);
  ps_leave();
  return rc;
}

/* exec replaces a process's image but keeps its tgid and start time, so its unwind entry (the
 * old image's mappings) is dropped here and the daemon asked to load the new one at once: the
 * new executable and ld.so have tables before the process runs; libraries ld.so maps next are
 * requested at their first pc. Runs in the exec'ing task (include/trace/events/sched.h). */
static __always_inline int ps_on_exec(const int use_vma) {
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  bpf_map_delete_elem(&ps_unwind_procs, &tgid);
  /* The exact on-CPU time from here on is the new image's: this CPU's record of its task takes
   * the new exec id (ps_cpu_state is written only on its own CPU). */
  __u32 zero = 0;
  struct ps_cpu_state *cs = bpf_map_lookup_elem(&ps_cpu_state, &zero);
  if (cs && cs->tid == (__u32)pid_tgid)
    cs->exec_id = ps_exec_id(task);
  if (!ps_tgid_tracked(tgid))
    return 0;
  __u64 start_ns = BPF_CORE_READ(task, group_leader, start_boottime);
  __u32 exec_id = ps_exec_id(task);
  ps_unwind_notify(tgid, start_ns, exec_id, PS_UNWIND_EVENT_EXEC);
  if (use_vma) {
    /* A new vma cache entry for the new image, holding the executable's text if the daemon has
     * its table (a program run before): the image's first walks, before the daemon has read its
     * maps, then reach libc through their one bpf_find_vma. mm->start_code is the lowest
     * address of the executable's PF_X segments (fs/binfmt_elf.c load_elf_binary). Here, unlike
     * in a sample, interrupts are on and the helper takes and drops the mmap lock itself. */
    struct ps_vma_cache *c = bpf_map_lookup_elem(&ps_vma_cache_scratch, &zero);
    if (!c)
      return 0;
    __builtin_memset(c, 0, sizeof(*c));
    c->tgid_start_ns = start_ns;
    c->exec_id = exec_id;
    struct ps_vma_lookup v = {};
    struct task_struct *btf_task = bpf_get_current_task_btf(); /* bpf_find_vma wants BTF's */
    __u64 start_code = BPF_CORE_READ(btf_task, mm, start_code);
    if (start_code && bpf_find_vma(btf_task, start_code, ps_vma_file_table, &v, 0) == 0 &&
        v.found)
      ps_vma_cache_put(c, &v);
    long err = bpf_map_update_elem(&ps_vma_cache, &tgid, c, BPF_ANY);
    if (err)
      ps_count_insert_error(err, PS_CTR_UNWIND_VMA_CACHE_FULL);
  }
  return 0;
}

SEC("tp_btf/sched_process_exec")
int BPF_PROG(ps_process_exec) {
  ps_enter();
  int rc = ps_on_exec(0);
  ps_leave();
  return rc;
}

/* The exec hook for Linux 5.17+ (with ps_on_cpu_sample_vma): also makes the image's vma cache
 * entry. One of the two is loaded (agent/bpf/programs.cc). */
SEC("tp_btf/sched_process_exec")
int BPF_PROG(ps_process_exec_vma) {
  ps_enter();
  int rc = ps_on_exec(1);
  ps_leave();
  return rc;
}

/* Process exit (with ps_on_cpu_sample_vma): the process's vma cache entry goes with its last
 * thread (signal->live reaches 0 in do_exit before this tracepoint, kernel/exit.c). */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(ps_process_exit_vma, struct task_struct *task) {
  if (BPF_CORE_READ(task, signal, live.counter) == 0) {
    __u32 tgid = BPF_CORE_READ(task, tgid);
    bpf_map_delete_elem(&ps_vma_cache, &tgid);
  }
  return 0;
}

/* Command mode (ps_cfg_follow_forks): a new process forked by a tracked one is tracked too, in its
 * parent's tree (abi.h PS_GROUP_TREE). The tracepoint runs in the parent after copy_process()
 * and before wake_up_new_task() (kernel/fork.c kernel_clone), so the child's first instant is
 * already tracked. A new thread (same tgid) changes nothing. */
SEC("tp_btf/sched_process_fork")
int BPF_PROG(ps_process_fork, struct task_struct *parent, struct task_struct *child) {
  __u32 parent_tgid = BPF_CORE_READ(parent, tgid), child_tgid = BPF_CORE_READ(child, tgid);
  if (child_tgid == parent_tgid || BPF_CORE_READ(child, pid) != child_tgid)
    return 0;
  __u64 *root = bpf_map_lookup_elem(&ps_pid_filter, &parent_tgid);
  if (!root)
    return 0;
  __u64 r = *root;
  long err = bpf_map_update_elem(&ps_pid_filter, &child_tgid, &r, BPF_NOEXIST);
  if (!err)
    ps_count(PS_CTR_TREE_JOINED);
  else if (err != -EEXIST)
    ps_count_insert_error(err, PS_CTR_TREE_FULL);
  return 0;
}

/* Command mode: a tree member leaves the tree with its last thread (signal->live reaches 0 in
 * do_exit before this tracepoint, kernel/exit.c), so the filter holds live processes only and a
 * later process that gets the pid is not tracked. */
SEC("tp_btf/sched_process_exit")
int BPF_PROG(ps_process_exit_tree, struct task_struct *task) {
  if (BPF_CORE_READ(task, signal, live.counter) == 0) {
    __u32 tgid = BPF_CORE_READ(task, tgid);
    if (bpf_map_delete_elem(&ps_pid_filter, &tgid) == 0)
      ps_count(PS_CTR_TREE_LEFT);
  }
  return 0;
}
