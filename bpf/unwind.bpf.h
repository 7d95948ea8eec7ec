/* User-stack unwinding from the daemon's CFI tables (bpf/abi.h, "User-stack unwinding"), for
 * the on-CPU sampler and the off-CPU switch-out capture alike: the same walker runs in both.
 *
 * Per frame: find the pc's mapping in the process's run of ps_unwind_maps (binary search), then
 * the last table row at or below the pc's ELF address (binary search in ps_unwind_rows), compute
 * the CFA, read the return address and, when saved, the caller's frame pointer from the user
 * stack. A pc without a table (no process entry yet, JIT code, no CFI for the address) takes the
 * frame-pointer step instead (CFA = FP + 16, RA at FP + 8, caller's FP at FP), counted. Every
 * loop is bounded by a constant from abi.h; no helper newer than 5.8 (ring buffer) is needed,
 * bpf_task_pt_regs (5.15) is used where the kernel has it, and the sampler's _vma variant
 * (5.17+: bpf_find_vma) finds the table of a pc outside the process's list by its vma's file. */
#ifndef PARASCOPE_BPF_UNWIND_BPF_H_
#define PARASCOPE_BPF_UNWIND_BPF_H_

#include "abi.h"
#include "common.bpf.h"

/* ---- architecture: where the user registers are, and what a user address is ---- */
#if defined(__TARGET_ARCH_x86)
/* x86-64: THREAD_SIZE = PAGE_SIZE << (2 + KASAN_STACK_ORDER) (arch/x86/include/asm/
 * page_64_types.h; KASAN off in distribution kernels), TOP_OF_KERNEL_STACK_PADDING 0, so the
 * user registers saved at kernel entry are the last struct pt_regs below stack + THREAD_SIZE
 * (task_pt_regs, arch/x86/include/asm/processor.h). */
#define PS_THREAD_SIZE 16384UL
/* TASK_SIZE_MAX with 4-level paging, minus the guard page (arch/x86/include/asm/page_64.h);
 * 5-level paging raises it, user pcs above are then rejected as impossible frames. */
#define PS_USER_ADDR_MAX 0x00007ffffffff000ULL
/* No code lives in the first page: vm.mmap_min_addr is at least 4096 (mm/Kconfig
 * DEFAULT_MMAP_MIN_ADDR; 65536 on Debian and most distributions). */
#define PS_USER_ADDR_MIN 0x1000ULL
/* A sample interrupted user mode when its pc is a user address (kernel text is in the upper
 * half); this avoids reading pt_regs::cs, whose type changed (FRED, 6.9). */
static __always_inline int ps_regs_user_mode(struct pt_regs *regs) {
  return PT_REGS_IP(regs) <= PS_USER_ADDR_MAX;
}
#else
#error "user-stack unwinding: only x86-64 is implemented (an arm64 port needs the lines above)"
#endif

/* ---- maps (shared by both objects: agent/bpf/programs.cc reuses oncpu's fds) ---- */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_UNWIND_PROC_ENTRIES);
  __type(key, __u32); /* tgid */
  __type(value, struct ps_unwind_proc);
} ps_unwind_procs SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, PS_UNWIND_MAP_ENTRIES);
  __type(key, __u32);
  __type(value, struct ps_unwind_mapping);
} ps_unwind_maps SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_ARRAY);
  __uint(max_entries, PS_UNWIND_ROW_ENTRIES); /* resized by the daemon: --unwind-table-bytes */
  __type(key, __u32);
  __type(value, struct ps_unwind_row);
} ps_unwind_rows SEC(".maps");

/* Tables by file identity, for pcs outside the process's list (abi.h ps_unwind_file; written by
 * the daemon as it builds tables, read only by the find_vma walker variant). */
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_UNWIND_FILE_ENTRIES);
  __type(key, struct ps_unwind_file_key);
  __type(value, struct ps_unwind_file);
} ps_unwind_files SEC(".maps");

/* Per process, from its exec until the daemon first loads its mapping list: the vmas its walks
 * found tables for through bpf_find_vma (and the executable's text, found by the exec hook), so
 * that a later walk needs no lookup for them. A sample may call bpf_find_vma once (see
 * ps_unwind_state.vma_tried): without this cache, a walk through two files the process's list
 * lacks (the program and libc in a child's first milliseconds) stops at the second.
 *  - A slot names a vma and its file (dev, ino), not table rows: a hit looks the file up in
 *    ps_unwind_files again, so a table the daemon evicted (and whose rows it reuses after a
 *    grace period, unwind_tables.cc) is never read through a stale slot.
 *  - The daemon deletes the entry when it loads the process's list (UnwindTables::LoadProcess):
 *    a slot is never consulted long enough for its range to be unmapped and reused by another
 *    file, and long-lived processes hold no entry.
 *  - Eight slots (ps_vma_cache_put); a slot is written without a lock by the sampler of any CPU,
 *    so it carries a check word over its fields, and a torn slot is a miss.
 *  - Entries are made only by the exec hook (tracepoint context: the sampler inserts into no
 *    hash, common.bpf.h "Maps written from NMI context") and deleted at process exit
 *    (oncpu.bpf.c) or by the daemon. Preallocated, as perf_event programs require before Linux
 *    6.1: an element freed is reused at once, but it is replaced only by its own process's exec
 *    (whose other threads are gone) and deleted only at its last thread's exit or once it has a
 *    list, so no sampler of that process is reading it then except through an identity check. */
#define PS_VMA_CACHE_SLOTS 8
struct ps_vma_cache_slot {
  __u64 start, end, bias;
  __u64 dev, ino; /* ps_unwind_file_key of the vma's file */
  __u64 check;    /* ps_vma_slot_check() of the fields above; 0: empty */
};
struct ps_vma_cache {
  __u64 tgid_start_ns; /* identity: the entry is this image's */
  __u32 exec_id;
  __u32 pad;
  struct ps_vma_cache_slot slots[PS_VMA_CACHE_SLOTS];
};
struct {
  __uint(type, BPF_MAP_TYPE_HASH);
  __uint(max_entries, PS_UNWIND_PROC_ENTRIES); /* 1 without bpf_find_vma (agent/bpf/programs.cc) */
  __type(key, __u32); /* tgid */
  __type(value, struct ps_vma_cache);
} ps_vma_cache SEC(".maps");

struct {
  __uint(type, BPF_MAP_TYPE_RINGBUF);
  __uint(max_entries, 64 * 1024);
} ps_unwind_events SEC(".maps");

/* Per-CPU de-duplication of table requests: the last one sent from this CPU. */
struct ps_unwind_notified {
  __u32 tgid;
  __u32 kind;
  __u64 ns;
  __u32 exec_id; /* a new image of the same process is a new request */
  __u32 pad;
};
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_unwind_notified);
} ps_unwind_notify_state SEC(".maps");

/* A request is repeated for the same process and kind at most this often per CPU (ns). */
#define PS_UNWIND_NOTIFY_INTERVAL_NS 100000000ULL

static __always_inline void ps_unwind_notify(__u32 tgid, __u64 tgid_start_ns, __u32 exec_id,
                                             __u32 kind) {
  __u32 zero = 0;
  struct ps_unwind_notified *last = bpf_map_lookup_elem(&ps_unwind_notify_state, &zero);
  if (!last)
    return;
  __u64 now = bpf_ktime_get_ns();
  if (last->tgid == tgid && last->kind == kind && last->exec_id == exec_id &&
      now - last->ns < PS_UNWIND_NOTIFY_INTERVAL_NS)
    return;
  last->tgid = tgid;
  last->kind = kind;
  last->exec_id = exec_id;
  last->ns = now;
  struct ps_unwind_event *e = bpf_ringbuf_reserve(&ps_unwind_events, sizeof(*e), 0);
  if (!e) {
    ps_count(PS_CTR_UNWIND_EVENTS_LOST);
    return;
  }
  e->tgid = tgid;
  e->kind = kind;
  e->tgid_start_ns = tgid_start_ns;
  e->exec_id = exec_id;
  e->pad = 0;
  bpf_ringbuf_submit(e, 0);
}

/* The registers a walk starts from. */
struct ps_unwind_regs {
  __u64 pc;
  __u64 sp;
  __u64 fp;
};

/* The current task's user registers: the interrupted ones when a sample hit user mode (`regs`
 * from the perf_event context, or NULL), else those saved at kernel entry (task_pt_regs).
 * Returns 0 for a task without user memory (kernel threads, an exiting task). */
static __always_inline int ps_user_regs(struct pt_regs *regs, struct ps_unwind_regs *out) {
  if (regs && ps_regs_user_mode(regs)) {
    out->pc = PT_REGS_IP(regs);
    out->sp = PT_REGS_SP(regs);
    out->fp = PT_REGS_FP(regs);
    return 1;
  }
  struct task_struct *task = (struct task_struct *)bpf_get_current_task();
  if (!BPF_CORE_READ(task, mm))
    return 0;
  struct pt_regs *uregs;
  if (bpf_core_enum_value_exists(enum bpf_func_id, BPF_FUNC_task_pt_regs)) {
    uregs = (struct pt_regs *)bpf_task_pt_regs(bpf_get_current_task_btf());
  } else {
    void *stack = BPF_CORE_READ(task, stack);
    if (!stack)
      return 0;
    uregs = (struct pt_regs *)(stack + PS_THREAD_SIZE) - 1;
  }
  out->pc = PT_REGS_IP_CORE(uregs);
  out->sp = PT_REGS_SP_CORE(uregs);
  out->fp = PT_REGS_FP_CORE(uregs);
  return out->pc != 0;
}

/* Index in ps_unwind_maps of the mapping of `pc` among [first, first + count), or -1. Global
 * functions (here and below) are verified once, on their own (Linux 5.6), so a caller's loop
 * costs the verifier one call per iteration, not the search's branches. */
__attribute__((noinline)) int ps_find_mapping_index(__u32 first, __u32 count, __u64 pc) {
  /* count <= PS_UNWIND_MAX_MAPPINGS (the daemon's invariant), so the steps suffice. No clamp
   * here: its constant branch would make every later value exact for the verifier, defeating
   * its state pruning (2^steps paths). */
  __u32 left = 0, right = count; /* ends as the first index whose start > pc */
  for (int i = 0; i < PS_UNWIND_MAP_SEARCH_STEPS; i++) {
    if (left >= right)
      break;
    __u32 mid = (left + right) / 2;
    __u32 idx = first + mid;
    struct ps_unwind_mapping *m = bpf_map_lookup_elem(&ps_unwind_maps, &idx);
    if (!m)
      return -1;
    if (m->start <= pc)
      left = mid + 1;
    else
      right = mid;
  }
  if (left == 0)
    return -1;
  __u32 idx = first + left - 1;
  struct ps_unwind_mapping *m = bpf_map_lookup_elem(&ps_unwind_maps, &idx);
  if (!m || pc >= m->end)
    return -1;
  return (int)idx;
}

/* Index in ps_unwind_rows of the last row of [first, first + count) whose pc is <= rel, or -1. */
__attribute__((noinline)) int ps_find_row_index(__u32 first, __u32 count, __u64 rel) {
  __u32 left = 0, right = count; /* count <= PS_UNWIND_MAX_TABLE_ROWS (daemon's invariant) */
  for (int i = 0; i < PS_UNWIND_ROW_SEARCH_STEPS; i++) {
    if (left >= right)
      break;
    __u32 mid = (left + right) / 2;
    __u32 idx = first + mid;
    struct ps_unwind_row *r = bpf_map_lookup_elem(&ps_unwind_rows, &idx);
    if (!r)
      return -1;
    if (r->pc <= rel)
      left = mid + 1;
    else
      right = mid;
  }
  if (left == 0)
    return -1;
  return (int)(first + left - 1);
}

static __always_inline int ps_read_user_u64(__u64 addr, __u64 *out) {
  return bpf_probe_read_user(out, sizeof(*out), (const void *)addr);
}

/* One step of the ps_user_memo hash: the word `v` read at offset `off` from the starting sp. */
static __always_inline __u64 ps_memo_mix(__u64 h, __u32 off, __u64 v) {
  h ^= v;
  h *= 0x100000001b3ULL;
  h ^= (__u64)off << 32 | (h >> 29);
  return h;
}

/* ---- a pc's table through its vma (Linux 5.17+: bpf_find_vma) ---- */

#define PS_VM_EXEC 0x00000004UL /* include/linux/mm.h */
#define PS_PAGE_SHIFT 12        /* vm_pgoff counts PAGE_SIZE units; x86-64 pages are 4 KiB */

/* bpf_find_vma's callback context: the pc looked up in, its table and bias out. */
struct ps_vma_lookup {
  __u64 start, end; /* the vma */
  __u64 bias;
  __u64 dev, ino;   /* its file (ps_unwind_file_key) */
  __u32 first;
  __u32 count;
  __u32 found;
  __u32 pad;
};

/* Called by bpf_find_vma with the vma holding the pc (kernel/bpf/task_iter.c, under the mmap
 * lock taken by trylock): the table of its file, if the daemon entered one (ps_unwind_files). */
static long ps_vma_file_table(struct task_struct *task, struct vm_area_struct *vma,
                              struct ps_vma_lookup *out) {
  unsigned long vm_flags = 0; /* not BPF_CORE_READ: the field is const in a union since 6.3 */
  bpf_core_read(&vm_flags, sizeof(vm_flags), &vma->vm_flags);
  if (!(vm_flags & PS_VM_EXEC))
    return 0;
  struct inode *inode = BPF_CORE_READ(vma, vm_file, f_inode);
  if (!inode)
    return 0;
  struct ps_unwind_file_key key = {};
  key.dev = BPF_CORE_READ(inode, i_sb, s_dev);
  key.ino = BPF_CORE_READ(inode, i_ino);
  struct ps_unwind_file *f = bpf_map_lookup_elem(&ps_unwind_files, &key);
  if (!f || f->size != (__u64)BPF_CORE_READ(inode, i_size))
    return 0;
  __u64 start = BPF_CORE_READ(vma, vm_start), end = BPF_CORE_READ(vma, vm_end);
  __u64 offset = BPF_CORE_READ(vma, vm_pgoff) << PS_PAGE_SHIFT;
  /* The mapping must show the executable segment's bytes. */
  if (offset >= f->seg_offset + f->seg_filesz || offset + (end - start) <= f->seg_offset)
    return 0;
  out->start = start;
  out->end = end;
  out->bias = start - offset + f->seg_offset - f->seg_vaddr;
  out->dev = key.dev;
  out->ino = key.ino;
  out->first = f->first;
  out->count = f->count;
  out->found = 1;
  return 0;
}

static __always_inline __u32 ps_vma_slot_index(__u64 start) {
  return (__u32)((start >> 12) ^ (start >> 21)) & (PS_VMA_CACHE_SLOTS - 1);
}

static __always_inline __u64 ps_vma_slot_check(__u64 start, __u64 end, __u64 bias, __u64 dev,
                                               __u64 ino) {
  __u64 h = (start * 0x9e3779b97f4a7c15ULL) ^ (end * 0xc2b2ae3d27d4eb4fULL) ^ bias ^
            (dev * 0x165667b19e3779f9ULL) ^ ino;
  return h ? h : 1;
}

/* Records a found vma in the process's cache entry `c`: in the first free slot (or the one
 * that holds this vma already), else in the slot its start hashes to. */
static __always_inline void ps_vma_cache_put(struct ps_vma_cache *c,
                                             const struct ps_vma_lookup *v) {
  __u32 j = ps_vma_slot_index(v->start);
  for (__u32 k = 0; k < PS_VMA_CACHE_SLOTS; k++) {
    if (c->slots[k].check == 0 || c->slots[k].start == v->start) {
      j = k;
      break;
    }
  }
  j &= PS_VMA_CACHE_SLOTS - 1;
  struct ps_vma_cache_slot *sl = &c->slots[j];
  sl->check = 0;
  ps_barrier();
  sl->start = v->start;
  sl->end = v->end;
  sl->bias = v->bias;
  sl->dev = v->dev;
  sl->ino = v->ino;
  ps_barrier();
  sl->check = ps_vma_slot_check(v->start, v->end, v->bias, v->dev, v->ino);
}

/* The cached vma holding `pc` in `c`, with its file's table as ps_unwind_files has it now, into
 * *out; 1 when found (a file whose table the daemon has dropped since is a miss). */
static __always_inline int ps_vma_cache_get(const struct ps_vma_cache *c, __u64 pc,
                                            struct ps_vma_lookup *out) {
  for (__u32 j = 0; j < PS_VMA_CACHE_SLOTS; j++) {
    const struct ps_vma_cache_slot *sl = &c->slots[j];
    __u64 check = sl->check;
    if (!check)
      continue;
    ps_barrier();
    __u64 start = sl->start, end = sl->end, bias = sl->bias;
    struct ps_unwind_file_key key = {};
    key.dev = sl->dev;
    key.ino = sl->ino;
    if (pc < start || pc >= end || ps_vma_slot_check(start, end, bias, key.dev, key.ino) != check)
      continue;
    struct ps_unwind_file *f = bpf_map_lookup_elem(&ps_unwind_files, &key);
    if (!f)
      return 0;
    out->start = start;
    out->end = end;
    out->bias = bias;
    out->dev = key.dev;
    out->ino = key.ino;
    out->first = f->first;
    out->count = f->count;
    out->found = 1;
    return 1;
  }
  return 0;
}

/* One walk in progress, per CPU and per object (each object's programs have their own copy: a
 * sample may interrupt sched_switch on its CPU only with a hardware PMU NMI, and then runs the
 * other object's walker). */
struct ps_unwind_state {
  __u64 pc, sp, fp;
  __u64 tgid_start_ns;
  __u32 tgid;
  __u32 exec_id;
  __u32 exact;    /* pc is exact (leaf, or after a signal frame), not a return address */
  __u32 outcome;  /* PS_UNWIND_* once done */
  __u32 has_proc;
  /* The vma bpf_find_vma found in this walk, reused for the walk's other pcs in it: with
   * interrupts off (a sample) the helper defers its mmap unlock to an irq_work and refuses a
   * second call until that ran (-EBUSY; kernel/bpf/mmap_unlock_work.h), so one lookup per
   * walk is all there is; the vmas found go to the process's ps_vma_cache entry for its next
   * walks. */
  __u32 vma_tried;
  struct ps_vma_lookup vma;
  struct ps_unwind_proc proc;
  /* What the walk depended on, for ps_user_memo (abi.h): the words it read (offsets from the
   * starting sp, hashed with their values) while they fit; memo_ok 0 once one did not. */
  __u64 sp0, fp0; /* the registers the walk started from (pc: st.ips[0]) */
  __u64 memo_hash;
  __u32 memo_ok;
  __u32 memo_n;
  __u32 fp_live;  /* fp is still the starting register, not one restored from the stack */
  __u32 fp_used;  /* a rule used the starting fp */
  __u16 memo_off[PS_MEMO_READS];
  struct ps_stack st;
  __u64 guard; /* st.ips[PS_MAX_STACK_DEPTH]: lets the index be masked for the verifier */
};
PS_STATIC_ASSERT(PS_MAX_STACK_DEPTH + 1 == 128, "frame index mask 127");
struct {
  __uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
  __uint(max_entries, 1);
  __type(key, __u32);
  __type(value, struct ps_unwind_state);
} ps_unwind_state_map SEC(".maps");

/* Reads the user word at `addr` for the walk, noting it for ps_user_memo. Returns 0 or -errno. */
static __always_inline int ps_walk_read(struct ps_unwind_state *w, __u64 addr, __u64 *out) {
  int rc = ps_read_user_u64(addr, out);
  if (rc || !w->memo_ok)
    return rc;
  __u64 off = addr - w->sp0;
  __u32 n = w->memo_n;
  if (addr < w->sp0 || off > 0xffff || n >= PS_MEMO_READS) {
    w->memo_ok = 0;
    return 0;
  }
  w->memo_off[n & (PS_MEMO_READS - 1)] = (__u16)off;
  w->memo_n = n + 1;
  w->memo_hash = ps_memo_mix(w->memo_hash, (__u32)off, *out);
  return 0;
}

/* Unwinds frame `i` of the walk in ps_unwind_state_map: records its pc and steps to its
 * caller. Returns 1 to go on, 0 when the walk ended (outcome set). use_vma: a pc in no mapping
 * of the process's list is looked up through its vma (bpf_find_vma, Linux 5.17+). */
static __always_inline int ps_unwind_frame_body(__u32 i, const int use_vma) {
  __u32 zero = 0;
  struct ps_unwind_state *w = bpf_map_lookup_elem(&ps_unwind_state_map, &zero);
  if (!w)
    return 0;
  if (i >= PS_MAX_STACK_DEPTH) {
    w->outcome = PS_UNWIND_TRUNCATED;
    return 0;
  }
  __u64 pc = w->pc, sp = w->sp, fp = w->fp;
  if (pc == 0) {
    w->outcome = PS_UNWIND_COMPLETE;
    return 0;
  }
  if (pc > PS_USER_ADDR_MAX) {
    w->outcome = PS_UNWIND_BAD_FRAME;
    return 0;
  }
  /* i < PS_MAX_STACK_DEPTH already; the mask in asm is what the verifier sees (the compiler
   * would drop a C mask it knows to be redundant and check a copy of i). */
  __u64 idx = i;
  asm volatile("%[idx] &= 127" : [idx] "+r"(idx));
  w->st.ips[idx] = pc;
  w->st.len = i + 1;
  __u64 lookup = w->exact ? pc : pc - 1;

  struct ps_unwind_row *row = 0;
  __u32 no_table = PS_UNWIND_NO_TABLE_YET; /* the process has no entry yet */
  int listed = 0;                          /* the pc is in a mapping of the process's list */
  if (w->has_proc) {
    int mi = ps_find_mapping_index(w->proc.first, w->proc.count, lookup);
    __u32 key = mi < 0 ? 0 : (__u32)mi;
    struct ps_unwind_mapping *m = mi < 0 ? 0 : bpf_map_lookup_elem(&ps_unwind_maps, &key);
    if (!m) {
      /* Mapped since the daemon read the process's maps (dlopen), or junk. */
      ps_unwind_notify(w->tgid, w->tgid_start_ns, w->exec_id, PS_UNWIND_EVENT_UNKNOWN_PC);
      no_table = PS_UNWIND_NO_TABLE_PC;
    } else if (m->state == PS_TABLE_READY) {
      listed = 1;
      int ri = ps_find_row_index(m->first, m->count, lookup - m->bias);
      key = ri < 0 ? 0 : (__u32)ri;
      row = ri < 0 ? 0 : bpf_map_lookup_elem(&ps_unwind_rows, &key);
      no_table = PS_UNWIND_NO_TABLE_PC;
    } else {
      listed = 1;
      no_table = PS_UNWIND_NO_TABLE_PC; /* PS_TABLE_NONE */
    }
  }
  if (use_vma && !listed) {
    /* Not in the process's list (or no list yet): the table of the file its vma maps, which the
     * daemon usually has (libc, a program run before): the vma this walk found, else one the
     * process's earlier walks or its exec found (ps_vma_cache), else bpf_find_vma once per walk
     * (-EBUSY when the mmap lock is held). */
    struct ps_vma_lookup v = w->vma;
    if (!v.found || lookup < v.start || lookup >= v.end) {
      v.found = 0;
      struct ps_vma_cache *c = bpf_map_lookup_elem(&ps_vma_cache, &w->tgid);
      if (c && (c->tgid_start_ns != w->tgid_start_ns || c->exec_id != w->exec_id))
        c = 0;
      if (!(c && ps_vma_cache_get(c, lookup, &v)) && !w->vma_tried) {
        struct ps_vma_lookup found = {};
        long rc = bpf_find_vma(bpf_get_current_task_btf(), lookup, ps_vma_file_table, &found, 0);
        w->vma_tried = 1;
        if (rc == 0 && found.found) {
          w->vma = found;
          v = found;
          if (c)
            ps_vma_cache_put(c, &found);
        }
      }
    }
    if (v.found && lookup >= v.start && lookup < v.end) {
      int ri = ps_find_row_index(v.first, v.count, lookup - v.bias);
      __u32 key = ri < 0 ? 0 : (__u32)ri;
      row = ri < 0 ? 0 : bpf_map_lookup_elem(&ps_unwind_rows, &key);
      if (row && row->cfa_rule != PS_CFA_NONE)
        ps_count(PS_CTR_UNWIND_VMA_FRAMES);
    }
  }

  __u64 cfa, ra, next_fp = fp;
  /* ps_user_memo: whether this frame used fp, and whether fp is still the starting register. */
  int uses_fp = 0, fp_restored = 0;
  if (row && row->cfa_rule != PS_CFA_NONE) {
    __u8 rule = row->cfa_rule;
    if (rule == PS_CFA_END) {
      w->outcome = PS_UNWIND_COMPLETE;
      return 0;
    }
    if (rule == PS_CFA_SP) {
      cfa = sp + row->cfa_offset;
    } else if (rule == PS_CFA_FP) {
      uses_fp = 1;
      cfa = fp + row->cfa_offset;
    } else if (rule == PS_CFA_PLT) {
      cfa = sp + row->cfa_offset + ((pc & 15) >= (row->flags >> PS_ROW_PLT_SHIFT) ? 8 : 0);
    } else if (rule == PS_CFA_DEREF_SP || rule == PS_CFA_DEREF_FP) {
      uses_fp = rule == PS_CFA_DEREF_FP;
      __u64 base = rule == PS_CFA_DEREF_SP ? sp : fp;
      if (ps_walk_read(w, base + row->cfa_offset, &cfa)) {
        w->outcome = PS_UNWIND_READ_FAULT;
        return 0;
      }
    } else {
      w->outcome = PS_UNWIND_BAD_FRAME;
      return 0;
    }
    __u64 ra_addr = row->ra_rule == PS_RA_AT_SP ? sp + row->ra_offset : cfa + row->ra_offset;
    if (ps_walk_read(w, ra_addr, &ra)) {
      w->outcome = PS_UNWIND_READ_FAULT;
      return 0;
    }
    __u8 fp_rule = row->fp_rule;
    if (fp_rule == PS_FP_AT_CFA || fp_rule == PS_FP_AT_SP || fp_rule == PS_FP_AT_FP) {
      uses_fp |= fp_rule == PS_FP_AT_FP;
      __u64 fp_base = fp_rule == PS_FP_AT_SP ? sp : fp_rule == PS_FP_AT_FP ? fp : cfa;
      __u64 fp_addr = fp_base + row->fp_offset;
      if (ps_walk_read(w, fp_addr, &next_fp)) {
        w->outcome = PS_UNWIND_READ_FAULT;
        return 0;
      }
      fp_restored = 1;
    } else if (fp_rule == PS_FP_UNDEFINED) {
      next_fp = 0;
      fp_restored = 1;
    }
    if (ra != 0 && ra < PS_USER_ADDR_MIN) {
      w->outcome = PS_UNWIND_BAD_FRAME;
      return 0;
    }
    __u32 signal = row->flags & PS_ROW_SIGNAL;
    /* The caller's frame lies above this one, except across a signal (sigaltstack). */
    if (!signal && cfa <= sp) {
      w->outcome = PS_UNWIND_BAD_FRAME;
      return 0;
    }
    w->exact = signal;
  } else {
    /* Frame-pointer step: push %rbp; mov %rsp,%rbp (System V psABI 3.4.1, optional). FP 0 ends
     * a frame-pointer chain (_start clears it), but code without frame pointers leaves anything
     * there: a walk that ends here ended without a table, whatever it found. */
    uses_fp = 1;
    fp_restored = 1;
    if (w->fp_live)
      w->fp_used = 1;
    /* No ps_user_memo for a walk with a frame found without a table: the table may come (the
     * UNKNOWN_PC request this frame made), and a memo would keep the guess and its requests
     * from ever being replaced. */
    w->memo_ok = 0;
    if (fp == 0 || fp < sp || (fp & 7)) {
      w->outcome = no_table;
      return 0;
    }
    if (ps_walk_read(w, fp + 8, &ra) || ps_walk_read(w, fp, &next_fp)) {
      w->outcome = no_table;
      return 0;
    }
    /* Junk instead of a frame (code without frame pointers): a return address at page zero
     * (below vm.mmap_min_addr, never code) or outside user space ends the walk here instead of
     * becoming a frame such as 0x0 or 0x3. */
    if (ra < PS_USER_ADDR_MIN || ra > PS_USER_ADDR_MAX) {
      w->outcome = no_table;
      return 0;
    }
    cfa = fp + 16;
    w->exact = 0;
    ps_count(PS_CTR_UNWIND_FP_FRAMES);
  }
  if (uses_fp && w->fp_live)
    w->fp_used = 1;
  if (fp_restored)
    w->fp_live = 0;
  w->pc = ra;
  w->sp = cfa;
  w->fp = next_fp;
  if (ra == 0) {
    w->outcome = PS_UNWIND_COMPLETE; /* a zero return address ends the chain (glibc's clone) */
    return 0;
  }
  return 1;
}

/* Frame i of the walk (ps_unwind_frame_body). Global functions: the verifier checks each once
 * instead of once per frame of every caller's loop (Linux 5.6 "bpf: Introduce
 * function-by-function verification"), which keeps a 127-frame walk far below the
 * 1M-instruction limit on kernels without bpf_loop (5.17). */
__attribute__((noinline)) int ps_unwind_frame(__u32 i) { return ps_unwind_frame_body(i, 0); }
/* The same, looking up pcs outside the process's list through their vma (Linux 5.17+); only
 * the program variant that calls it is loaded there (agent/bpf/programs.cc). */
__attribute__((noinline)) int ps_unwind_frame_vma(__u32 i) { return ps_unwind_frame_body(i, 1); }

/* Walks the current task's user stack into the per-CPU walk state. Returns the walk's stack
 * (leaf first, outcome in flags) or NULL for a task without user memory. tgid/tgid_start_ns
 * identify the process (ps_unwind_procs). */
static __always_inline struct ps_stack *ps_unwind_user(struct pt_regs *ctx_regs, __u32 tgid,
                                                       __u64 tgid_start_ns, __u32 exec_id,
                                                       const int use_vma) {
  __u32 zero = 0;
  struct ps_unwind_state *w = bpf_map_lookup_elem(&ps_unwind_state_map, &zero);
  if (!w)
    return 0;
  struct ps_unwind_regs r = {};
  if (!ps_user_regs(ctx_regs, &r))
    return 0;
  w->pc = r.pc;
  w->sp = r.sp;
  w->fp = r.fp;
  w->tgid = tgid;
  w->tgid_start_ns = tgid_start_ns;
  w->exec_id = exec_id;
  w->exact = 1;
  w->outcome = PS_UNWIND_TRUNCATED;
  w->st.len = 0;
  w->st.flags = 0;
  w->has_proc = 0;
  w->vma_tried = 0;
  w->vma.found = 0;
  w->sp0 = r.sp;
  w->fp0 = r.fp;
  w->memo_hash = 0;
  w->memo_ok = 1;
  w->memo_n = 0;
  w->fp_live = 1;
  w->fp_used = 0;
  struct ps_unwind_proc *proc = bpf_map_lookup_elem(&ps_unwind_procs, &tgid);
  if (proc && proc->tgid_start_ticks == tgid_start_ns / PS_NS_PER_TICK &&
      (proc->exec_id == exec_id || proc->exec_id == PS_EXEC_ID_UNKNOWN)) {
    if (proc->exec_id == PS_EXEC_ID_UNKNOWN) {
      /* Loaded from /proc (at start, or a refresh), which does not show the exec id: claim the
       * entry for the running image and tell the daemon the process's full identity, so that it
       * snapshots the process for symbolization while it lives. */
      proc->exec_id = exec_id;
      ps_unwind_notify(tgid, tgid_start_ns, exec_id, PS_UNWIND_EVENT_CLAIM);
    }
    w->proc = *proc;
    w->has_proc = 1;
  } else {
    /* Unknown, or a reused pid whose entry is the old process's, or an image whose entry the
     * exec hook has not deleted yet. */
    ps_unwind_notify(tgid, tgid_start_ns, exec_id, PS_UNWIND_EVENT_NEW_PROCESS);
  }
  for (__u32 i = 0; i <= PS_MAX_STACK_DEPTH; i++) {
    if (!(use_vma ? ps_unwind_frame_vma(i) : ps_unwind_frame(i)))
      break;
  }
  w->st.flags = w->outcome;
  return &w->st;
}

/* Counts the walk's outcome in ps_counters. */
static __always_inline void ps_count_unwind(__u32 outcome) {
  switch (outcome) {
  case PS_UNWIND_COMPLETE: ps_count(PS_CTR_UNWIND_COMPLETE); break;
  case PS_UNWIND_TRUNCATED: ps_count(PS_CTR_UNWIND_TRUNCATED); break;
  case PS_UNWIND_NO_TABLE_YET: ps_count(PS_CTR_UNWIND_NO_TABLE_YET); break;
  case PS_UNWIND_NO_TABLE_PC: ps_count(PS_CTR_UNWIND_NO_TABLE_PC); break;
  case PS_UNWIND_READ_FAULT: ps_count(PS_CTR_UNWIND_READ_FAULT); break;
  default: ps_count(PS_CTR_UNWIND_BAD_FRAME); break;
  }
}

/* Unwinds the current task's user stack into `stacks`. Returns its hash, or 0 with *err (0: no
 * user stack, as for a kernel thread). */
static __always_inline __u64 ps_capture_user_stack(struct pt_regs *ctx_regs, void *stacks,
                                                   __u32 tgid, __u64 tgid_start_ns,
                                                   __u32 exec_id, __s32 *err,
                                                   const int use_vma) {
  *err = 0;
  struct ps_stack *st = ps_unwind_user(ctx_regs, tgid, tgid_start_ns, exec_id, use_vma);
  if (!st)
    return 0;
  long n = (long)st->len * sizeof(__u64);
  if (n > 0)
    ps_count_unwind(st->flags);
  return ps_store_stack(stacks, st, n, BPF_F_USER_STACK, err);
}

/* The current task's user stack key from its memo `m` (abi.h ps_user_memo) when a walk now
 * would repeat it: same window (ws), same starting registers, and every stack word the walk
 * read unchanged (re-read here, one bpf_probe_read_user each). 0 when not; the caller has
 * checked that the task runs the image the memo was made in. */
static __always_inline __u64 ps_user_memo_hit(const struct ps_user_memo *m, __u64 ws) {
  __u32 n = m->n;
  if (n == 0 || m->ws_ns != ws)
    return 0;
  struct ps_unwind_regs r = {};
  if (!ps_user_regs(0, &r))
    return 0;
  if (r.pc != m->pc || r.sp != m->sp || (m->fp_used && r.fp != m->fp))
    return 0;
  __u64 h = 0;
  for (__u32 i = 0; i < PS_MEMO_READS; i++) {
    if (i >= n)
      break;
    __u32 off = m->off[i];
    __u64 v;
    if (ps_read_user_u64(r.sp + off, &v))
      return 0;
    h = ps_memo_mix(h, off, v);
  }
  return h == m->hash ? m->stack : 0;
}

/* Makes the walk just done on this CPU (its stored key `stack`, 0 if none) the memo `m` of the
 * current task for window ws, if it can be one (reached the outermost frame, read at most
 * PS_MEMO_READS words, all within 64 KiB above sp); else clears `m`. */
static __always_inline void ps_user_memo_store(struct ps_user_memo *m, __u64 stack, __u64 ws) {
  __u32 zero = 0;
  m->n = 0;
  struct ps_unwind_state *w = bpf_map_lookup_elem(&ps_unwind_state_map, &zero);
  if (!w || stack == 0 || w->outcome != PS_UNWIND_COMPLETE || !w->memo_ok || w->memo_n == 0 ||
      w->memo_n > PS_MEMO_READS || w->st.len == 0)
    return;
  m->pc = w->st.ips[0];
  m->sp = w->sp0;
  m->fp = w->fp0;
  m->hash = w->memo_hash;
  m->stack = stack;
  m->ws_ns = ws;
  m->fp_used = w->fp_used;
  __builtin_memcpy(m->off, w->memo_off, sizeof(m->off));
  m->n = w->memo_n;
}

#endif /* PARASCOPE_BPF_UNWIND_BPF_H_ */
