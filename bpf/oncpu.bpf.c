// SPDX-License-Identifier: GPL-2.0
/* On-CPU stack sampling: a perf_event program attached on every online CPU (cycles, or
 * cpu-clock where there is no PMU) records (tgid, tid, user stack, kernel stack) -> (count,
 * period) in a double-buffered in-kernel aggregate. The daemon flips ps_active_buffer at each
 * window boundary, waits until every CPU has left the program (agent/collect), then drains the
 * inactive buffer; samples taken meanwhile go to the other buffer, so none are lost. */
#include "vmlinux.h"

#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

#include "abi.h"
#include "common.bpf.h"

char LICENSE[] SEC("license") = "GPL";

/* Set by the daemon before load (rodata): 1 to record only tgids present in ps_pid_filter. */
const volatile __u32 ps_cfg_filter_tgid = 0;

/* Written by the daemon through the mmap'ed .bss at each window boundary: the buffer the
 * program fills, 0 or 1. */
volatile __u32 ps_active_buffer = 0;

struct ps_stack_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_STACK_MAP_ENTRIES); /* resized by the daemon before load */
  __type(key, __u64);                        /* ps_stack_hash() */
  __type(value, struct ps_stack);
};

struct ps_oncpu_map {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_ONCPU_MAP_ENTRIES); /* resized by the daemon before load */
  __type(key, struct ps_oncpu_key);
  __type(value, struct ps_oncpu_value);
};

struct ps_stack_map ps_stacks0 SEC(".maps");
struct ps_stack_map ps_stacks1 SEC(".maps");
struct ps_oncpu_map ps_oncpu0 SEC(".maps");
struct ps_oncpu_map ps_oncpu1 SEC(".maps");
_Static_assert(PS_NUM_BUFFERS == 2, "one map pair per buffer");

struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_PID_FILTER_ENTRIES);
  __type(key, __u32);   /* tgid */
  __type(value, __u8);  /* unused */
} ps_pid_filter SEC(".maps");

/* Per-CPU scratch for one stack (1 KiB is beyond the 512-byte BPF stack). */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_stack);
} ps_oncpu_scratch SEC(".maps");

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

/* Copies the current user (flags = BPF_F_USER_STACK) or kernel (flags = 0) stack into `stacks`.
 * Returns its hash, or 0 with *err = -errno (or 0 when the stack is legitimately empty). */
static __always_inline __u64 ps_capture_stack(void *ctx, void *stacks, __u64 flags, __s32 *err) {
  __u32 zero = 0;
  struct ps_stack *st = bpf_map_lookup_elem(&ps_oncpu_scratch, &zero);
  *err = 0;
  if (!st)
    return 0;
  long n = bpf_get_stack(ctx, st->ips, sizeof(st->ips), flags);
  if (n <= 0) {
    *err = (__s32)n;
    return 0;
  }
  st->len = (__u32)n / sizeof(__u64);
  __u64 h = ps_stack_hash(st, flags);
  long rc = bpf_map_update_elem(stacks, &h, st, BPF_NOEXIST);
  if (rc && rc != -EEXIST) {
    ps_count(PS_CTR_STACK_MAP_FULL);
    *err = (__s32)rc;
    return 0;
  }
  return h;
}

/* Records one sample into one buffer's maps. */
static __always_inline void ps_record(void *ctx, void *stacks, void *oncpu, __u64 period,
                                      struct task_struct *task, __u64 pid_tgid) {
  struct ps_oncpu_key key = {};
  key.tgid = pid_tgid >> 32;
  key.tid = (__u32)pid_tgid;
  key.tgid_start_ns = BPF_CORE_READ(task, group_leader, start_boottime);

  key.kernel_stack = ps_capture_stack(ctx, stacks, 0, &key.kernel_stack_err);
  if (key.kernel_stack_err && key.kernel_stack_err != -ENOMEM)
    ps_count(PS_CTR_KERNEL_STACK_FAULT);
  key.user_stack = ps_capture_stack(ctx, stacks, BPF_F_USER_STACK, &key.user_stack_err);
  if (key.user_stack_err && key.user_stack_err != -ENOMEM)
    ps_count(PS_CTR_USER_STACK_FAULT);

  struct ps_oncpu_value *val = bpf_map_lookup_elem(oncpu, &key);
  if (!val) {
    struct ps_oncpu_value init = {};
    bpf_get_current_comm(init.comm, sizeof(init.comm));
    /* BPF_NOEXIST: another CPU may have inserted the same key meanwhile; then add to it. */
    long err = bpf_map_update_elem(oncpu, &key, &init, BPF_NOEXIST);
    if (err && err != -EEXIST) {
      ps_count(PS_CTR_AGG_MAP_FULL);
      return;
    }
    val = bpf_map_lookup_elem(oncpu, &key);
    if (!val) {
      ps_count(PS_CTR_AGG_MAP_FULL);
      return;
    }
  }
  __sync_fetch_and_add(&val->count, 1);
  __sync_fetch_and_add(&val->period_sum, period);
}

SEC("perf_event")
int ps_on_cpu_sample(struct bpf_perf_event_data *ctx) {
  __u64 pid_tgid = bpf_get_current_pid_tgid();
  __u32 tgid = pid_tgid >> 32;
  if ((__u32)pid_tgid == 0) {
    ps_count(PS_CTR_SAMPLES_IDLE);
    return 0;
  }
  if (ps_cfg_filter_tgid && !bpf_map_lookup_elem(&ps_pid_filter, &tgid)) {
    ps_count(PS_CTR_SAMPLES_FILTERED);
    return 0;
  }
  ps_count(PS_CTR_SAMPLES);

  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  __u64 period = ctx->sample_period;
  if (ps_active_buffer == 0)
    ps_record(ctx, &ps_stacks0, &ps_oncpu0, period, task, pid_tgid);
  else
    ps_record(ctx, &ps_stacks1, &ps_oncpu1, period, task, pid_tgid);
  return 0;
}
