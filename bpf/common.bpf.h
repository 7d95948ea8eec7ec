/* BPF-only helpers shared by the parascope programs. */
#ifndef PARASCOPE_BPF_COMMON_BPF_H_
#define PARASCOPE_BPF_COMMON_BPF_H_

#include "abi.h"

/* errno values (include/uapi/asm-generic/errno-base.h, errno.h); vmlinux.h has no macros. */
#define EFAULT 14
#define EEXIST 17
#define ENOMEM 12

/* Per-CPU failure/activity counters indexed by PS_CTR_* (abi.h); summed by the daemon. */
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, PS_CTR_NUM);
  __type(key, __u32);
  __type(value, __u64);
} ps_counters SEC(".maps");

static __always_inline void ps_count(__u32 idx) {
  __u64 *c = bpf_map_lookup_elem(&ps_counters, &idx);
  if (c)
    __sync_fetch_and_add(c, 1); /* atomic: an NMI-driven sample may nest in another program */
}

#endif /* PARASCOPE_BPF_COMMON_BPF_H_ */
