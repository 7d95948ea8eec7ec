#include "agent/bpf/programs.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/bpf/probe.h"
#include "agent/collect/window_clock.h"
#include "agent/proc/read_file.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "oncpu.skel.h"
#include "sched.skel.h"

namespace parascope {
namespace {

// libbpf 1.x returns -errno from most calls (and sets errno).
absl::Status LibbpfError(int rc, absl::string_view what) {
  return ErrnoStatus(rc < 0 ? -rc : errno, absl::StrCat("libbpf: ", what));
}

uint32_t NextPow2(uint64_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 30)) p <<= 1;
  return p;
}

// Kernel scheduling entities (threads) that exist now: the number after the slash in the fourth
// field of /proc/loadavg (proc(5); fs/proc/loadavg.c prints nr_threads). 0 when unreadable.
uint64_t HostThreads() {
  absl::StatusOr<std::string> text = proc::ReadFileToString("/proc/loadavg");
  if (!text.ok()) return 0;
  std::vector<absl::string_view> fields = absl::StrSplit(*text, ' ', absl::SkipEmpty());
  if (fields.size() < 4) return 0;
  size_t slash = fields[3].find('/');
  uint64_t n = 0;
  if (slash == absl::string_view::npos || !absl::SimpleAtoi(fields[3].substr(slash + 1), &n)) {
    return 0;
  }
  return n;
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpfPrograms>> BpfPrograms::Create(const Options& options) {
  std::unique_ptr<BpfPrograms> self(new BpfPrograms());
  PS_ASSIGN_OR_RETURN(self->events_, OpenSamplingEvents(options.frequency_hz));

  self->oncpu_ = oncpu_bpf::open();
  if (self->oncpu_ == nullptr) return LibbpfError(-errno, "opening oncpu.bpf.o");
  oncpu_bpf* skel = self->oncpu_;

  // Map sizes from the samples one window can hold: CPUs * Hz * seconds, twice for separate
  // user and kernel stacks (off-CPU stacks have maps of their own, sized in LoadSched). Distinct
  // stacks are usually far fewer; a full map is counted (PS_CTR_*_MAP_FULL), never silent. 16384
  // entries cap the preallocated stack memory at 16 MiB per buffer.
  double per_window = static_cast<double>(self->events_.cpus.size()) * options.frequency_hz *
                      absl::ToDoubleSeconds(options.collect_interval);
  uint32_t stack_entries =
      std::clamp<uint32_t>(NextPow2(static_cast<uint64_t>(2 * per_window)), 1024, 16384);
  uint32_t agg_entries =
      std::clamp<uint32_t>(NextPow2(static_cast<uint64_t>(per_window)), 1024, 16384);
  for (bpf_map* m : {skel->maps.ps_stacks0, skel->maps.ps_stacks1}) {
    if (int rc = bpf_map__set_max_entries(m, stack_entries); rc) {
      return LibbpfError(rc, "sizing stack maps");
    }
  }
  for (bpf_map* m : {skel->maps.ps_oncpu0, skel->maps.ps_oncpu1}) {
    if (int rc = bpf_map__set_max_entries(m, agg_entries); rc) {
      return LibbpfError(rc, "sizing aggregation maps");
    }
  }
  const uint64_t rows = std::clamp<uint64_t>(options.unwind_table_bytes / sizeof(ps_unwind_row),
                                             1024, uint64_t{1} << 30);
  if (int rc = bpf_map__set_max_entries(skel->maps.ps_unwind_rows, static_cast<uint32_t>(rows));
      rc) {
    return LibbpfError(rc, "sizing the unwind table map");
  }
  const bool follow_forks = options.tree_root != 0;
  const bool filter = !options.tgids.empty() || follow_forks;
  skel->rodata->ps_cfg_filter_tgid = filter ? 1 : 0;
  skel->rodata->ps_cfg_parallelism = options.sched ? 1 : 0;
  skel->rodata->ps_cfg_group = options.latency_group;
  skel->rodata->ps_cfg_follow_forks = follow_forks ? 1 : 0;
  // The fork and exit hooks of command mode's tree (bpf/oncpu.bpf.c), and the filter sized for
  // the tree's live processes (16 bytes each).
  bpf_program__set_autoload(skel->progs.ps_process_fork, follow_forks);
  bpf_program__set_autoload(skel->progs.ps_process_exit_tree, follow_forks);
  if (follow_forks) {
    if (int rc = bpf_map__set_max_entries(skel->maps.ps_pid_filter, PS_TREE_ENTRIES); rc) {
      return LibbpfError(rc, "sizing the pid filter map");
    }
  }
  // The sampler variant: with bpf_find_vma (Linux 5.17+) a pc outside its process's known
  // mappings is unwound through its file's table (bpf/unwind.bpf.h), so the first samples after
  // ld.so maps a library, or of a process the daemon has not read yet, are whole.
  const bool find_vma =
      libbpf_probe_bpf_helper(BPF_PROG_TYPE_PERF_EVENT, BPF_FUNC_find_vma, nullptr) == 1 &&
      libbpf_probe_bpf_helper(BPF_PROG_TYPE_PERF_EVENT, BPF_FUNC_get_current_task_btf,
                              nullptr) == 1;
  self->sampler_ = find_vma ? skel->progs.ps_on_cpu_sample_vma : skel->progs.ps_on_cpu_sample;
  bpf_program__set_autoload(skel->progs.ps_on_cpu_sample, !find_vma);
  bpf_program__set_autoload(skel->progs.ps_on_cpu_sample_vma, find_vma);
  // The exec hook that also makes a process's vma cache entry, and the exit hook that deletes it.
  bpf_program__set_autoload(skel->progs.ps_process_exec, !find_vma);
  bpf_program__set_autoload(skel->progs.ps_process_exec_vma, find_vma);
  bpf_program__set_autoload(skel->progs.ps_process_exit_vma, find_vma);
  if (!find_vma) {
    // Unread without bpf_find_vma: one entry instead of PS_UNWIND_FILE_ENTRIES preallocated.
    if (int rc = bpf_map__set_max_entries(skel->maps.ps_unwind_files, 1); rc) {
      return LibbpfError(rc, "sizing the unwind file map");
    }
    if (int rc = bpf_map__set_max_entries(skel->maps.ps_vma_cache, 1); rc) {
      return LibbpfError(rc, "sizing the vma cache map");
    }
  }
  Log(LogLevel::kDebug, "bpf_find_vma in perf_event programs (Linux 5.17+): %s",
      find_vma ? "yes, pcs outside known mappings are looked up by their file"
               : "no, such pcs wait for the daemon to read the process's maps");
  if (int rc = oncpu_bpf::load(skel); rc) return LibbpfError(rc, "loading oncpu.bpf.o");

  void* ctl = mmap(nullptr, sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED,
                   bpf_map__fd(skel->maps.ps_control), 0);
  if (ctl == MAP_FAILED) return ErrnoStatus(errno, "mmap ps_control");
  self->control_ = static_cast<ps_control*>(ctl);

  self->tree_root_ = options.tree_root;
  if (follow_forks) {
    const uint64_t root = options.tree_root;
    if (bpf_map__update_elem(skel->maps.ps_pid_filter, &options.tree_root,
                             sizeof(options.tree_root), &root, sizeof(root), BPF_ANY)) {
      return ErrnoStatus(errno, "adding the command to the pid filter map");
    }
  }
  uint64_t one = 1;  // the value is read only in command mode (the tree's root)
  for (uint32_t tgid : options.tgids) {
    if (bpf_map__update_elem(skel->maps.ps_pid_filter, &tgid, sizeof(tgid), &one, sizeof(one),
                             BPF_ANY)) {
      return ErrnoStatus(errno, "filling the pid filter map");
    }
  }
  if (options.sched) PS_RETURN_IF_ERROR(self->LoadSched(options));
  PS_RETURN_IF_ERROR(self->CreateCollector(options));
  PS_RETURN_IF_ERROR(self->StartUnwinder(options));

  // The first window starts now; CPUs are unknown until a switch or a sample shows their task.
  self->window_start_ns_ = MonotonicNowNs();
  self->control_->unknown_cpus = static_cast<int64_t>(self->events_.cpus.size());
  self->control_->window_start_ns = self->window_start_ns_;
  self->control_->buffer_start_ns[0] = static_cast<uint64_t>(self->window_start_ns_);
  self->control_->active_buffer = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);

  if (self->sched_ != nullptr) {
    // Task storage: every thread has its state before sched_switch looks for it, new ones from
    // their creation (ps_thread_new), those alive now from ps_make_states (bpf/sched.bpf.c).
    for (bpf_program* p :
         {self->sched_->progs.ps_thread_new, self->sched_->progs.ps_sched_switch,
          self->sched_->progs.ps_sched_switch3, self->sched_->progs.ps_process_exit,
          self->sched_->progs.ps_cgroup_release, self->sched_->progs.ps_cgroup_rmdir}) {
      if (!bpf_program__autoload(p)) continue;  // the sched_switch variant not chosen
      bpf_link* link = bpf_program__attach(p);
      if (link == nullptr) {
        return LibbpfError(-errno, absl::StrCat("attaching ", bpf_program__name(p)));
      }
      self->links_.push_back(link);
      if (p == self->sched_->progs.ps_thread_new) {
        self->RunIterator(self->sched_->progs.ps_make_states, "giving the threads alive a state");
      }
    }
  }
  // The exit hook before the exec hook: an entry made by an exec is always deleted at the exit.
  for (bpf_program* p : {skel->progs.ps_process_exit_vma, skel->progs.ps_process_exec,
                         skel->progs.ps_process_exec_vma, skel->progs.ps_process_fork,
                         skel->progs.ps_process_exit_tree}) {
    if (!bpf_program__autoload(p)) continue;  // the variant not chosen
    bpf_link* link = bpf_program__attach(p);
    if (link == nullptr) {
      return LibbpfError(-errno, absl::StrCat("attaching ", bpf_program__name(p)));
    }
    self->links_.push_back(link);
  }
  // Best effort: without it, threads running at attach count in parallelism from their next
  // switch-in, and threads asleep since before attach appear from their first wake-up.
  if (self->sched_ != nullptr) {
    self->RunIterator(self->sched_->progs.ps_seed_threads,
                      "seeding running processes and sleeping threads");
  }
  for (size_t i = 0; i < self->events_.fds.size(); ++i) {
    bpf_link* link =
        bpf_program__attach_perf_event(self->sampler_, self->events_.fds[i].get());
    if (link == nullptr) {
      return LibbpfError(-errno, absl::StrCat("attaching to ", self->events_.name, " on CPU ",
                                              self->events_.cpus[i]));
    }
    self->links_.push_back(link);
  }
  return self;
}

namespace {
// True when the kernel's hash maps take their elements from bpf_mem_alloc (Linux 6.1: struct
// bpf_htab in kernel/bpf/hashtab.c gained `struct bpf_mem_alloc ma`), read from its BTF rather
// than its version, so a backport counts and a kernel with the allocator but not the conversion
// does not.
bool HashMapsAllocateFromBpfMemAlloc(const btf* vmlinux) {
  const int htab = btf__find_by_name_kind(vmlinux, "bpf_htab", BTF_KIND_STRUCT);
  if (htab < 0) return false;
  const btf_type* t = btf__type_by_id(vmlinux, htab);
  const btf_member* m = btf_members(t);
  for (int i = 0; i < btf_vlen(t); ++i, ++m) {
    if (std::strcmp(btf__name_by_offset(vmlinux, m->name_off), "ma") != 0) continue;
    const btf_type* mt = btf__type_by_id(vmlinux, m->type);
    return mt != nullptr && btf_is_struct(mt) &&
           std::strcmp(btf__name_by_offset(vmlinux, mt->name_off), "bpf_mem_alloc") == 0;
  }
  return false;
}

}  // namespace

absl::Status BpfPrograms::LoadSched(const Options& options) {
  sched_ = sched_bpf::open();
  if (sched_ == nullptr) return LibbpfError(-errno, "opening sched.bpf.o");
  // Share the maps both objects define (common.bpf.h): one instance each.
  struct Shared {
    bpf_map* mine;
    bpf_map* theirs;
  };
  for (Shared s : {Shared{sched_->maps.ps_counters, oncpu_->maps.ps_counters},
                   Shared{sched_->maps.ps_control, oncpu_->maps.ps_control},
                   Shared{sched_->maps.ps_pid_filter, oncpu_->maps.ps_pid_filter},
                   Shared{sched_->maps.ps_running, oncpu_->maps.ps_running},
                   Shared{sched_->maps.ps_cpu_state, oncpu_->maps.ps_cpu_state},
                   Shared{sched_->maps.ps_progress, oncpu_->maps.ps_progress},
                   Shared{sched_->maps.ps_unwind_procs, oncpu_->maps.ps_unwind_procs},
                   Shared{sched_->maps.ps_unwind_maps, oncpu_->maps.ps_unwind_maps},
                   Shared{sched_->maps.ps_unwind_rows, oncpu_->maps.ps_unwind_rows},
                   Shared{sched_->maps.ps_unwind_files, oncpu_->maps.ps_unwind_files},
                   Shared{sched_->maps.ps_vma_cache, oncpu_->maps.ps_vma_cache},
                   Shared{sched_->maps.ps_unwind_events, oncpu_->maps.ps_unwind_events},
                   Shared{sched_->maps.ps_unwind_notify_state,
                          oncpu_->maps.ps_unwind_notify_state}}) {
    if (int rc = bpf_map__reuse_fd(s.mine, bpf_map__fd(s.theirs)); rc) {
      return LibbpfError(rc, absl::StrCat("sharing map ", bpf_map__name(s.mine)));
    }
  }
  btf* vmlinux = btf__load_vmlinux_btf();
  if (vmlinux == nullptr) return LibbpfError(-errno, "loading the kernel's BTF");
  absl::Cleanup free_vmlinux = [vmlinux] { btf__free(vmlinux); };
  // Thread states (bpf/sched.bpf.c): in task storage where tracing programs can use it. It costs
  // nothing at load and follows the threads that exist (one element per tracked thread, made
  // when the task is created and freed with it), so it has no ceiling. It is not a faster lookup:
  // one more dependent cache miss than the hash, measured +100 ns a switch with 500 threads and
  // equal in a ping-pong (bench/switch_ab.py, Linux 6.18). Else in the ps_threads hash,
  // preallocated (kThreadEntryBytes below, 23 MiB at PS_THREAD_MAP_ENTRIES): twice the threads
  // alive now, so the host can grow before the map is full (then switch-outs are counted,
  // PS_CTR_THREAD_MAP_FULL, and lost), at least 8192 (2.9 MiB). Without off-CPU tracking nothing is
  // stored: one hash entry. Tracing programs can use task storage where task_struct has the
  // bpf_storage member that commit a10787e6d58c ("bpf: Enable task local storage for tracing
  // programs", Linux 5.13) added for them.
  const bool task_storage = options.offcpu && !options.thread_state_hash &&
                            StructHasMember(vmlinux, "task_struct", "bpf_storage");
  thread_store_ = !options.offcpu ? "" : task_storage ? "task_storage" : "hash";
  sched_->rodata->ps_cfg_task_storage = task_storage ? 1 : 0;
  bpf_program__set_autoload(sched_->progs.ps_thread_new, task_storage);
  bpf_program__set_autoload(sched_->progs.ps_dump_threads, task_storage);
  bpf_program__set_autoload(sched_->progs.ps_make_states, task_storage);
  const uint64_t threads = HostThreads();
  const uint32_t thread_entries =
      options.offcpu && !task_storage
          ? std::clamp<uint32_t>(NextPow2(2 * threads), 8192, PS_THREAD_MAP_ENTRIES)
          : 1;
  if (int rc = bpf_map__set_max_entries(sched_->maps.ps_threads, thread_entries); rc) {
    return LibbpfError(rc, "sizing the thread state map");
  }
  if (task_storage) {
    Log(LogLevel::kDebug, "thread states: task storage (%d threads on the host)", threads);
  } else {
    // A kernel without task storage cannot create the map: a 1-entry hash stands in, which the
    // programs never touch (their task-storage branches are dead code there).
    bpf_map* storage = sched_->maps.ps_thread_storage;
    if (int rc = bpf_map__set_type(storage, BPF_MAP_TYPE_HASH); rc) {
      return LibbpfError(rc, "replacing the thread storage map");
    }
    if (int rc = bpf_map__set_map_flags(storage, 0); rc) {
      return LibbpfError(rc, "replacing the thread storage map");
    }
    if (int rc = bpf_map__set_max_entries(storage, 1); rc) {
      return LibbpfError(rc, "replacing the thread storage map");
    }
    // Kernel memory per entry (kernel/bpf/hashtab.c htab_map_alloc): a struct htab_elem (48
    // bytes on x86-64), the key and the value rounded up to 8 bytes, and a 16-byte bucket.
    constexpr uint64_t kThreadEntryBytes = 48 + 8 + (sizeof(ps_thread_state) + 7) / 8 * 8 + 16;
    Log(LogLevel::kDebug,
        "thread states: ps_threads, %d entries (%d threads on the host), about "
        "%d KiB",
        thread_entries, threads, uint64_t{thread_entries} * kThreadEntryBytes / 1024);
  }
  // Off-CPU stacks (switch-out, and switch-in for long uncaptured intervals): their own maps, so
  // that the NMI sampler never waits on a lock sched_switch holds (bpf/common.bpf.h). About 1 KiB
  // per entry, 8 MiB per buffer; unused without off-CPU tracking.
  for (bpf_map* m : {sched_->maps.ps_sched_stacks0, sched_->maps.ps_sched_stacks1}) {
    if (int rc = bpf_map__set_max_entries(m, options.offcpu ? PS_SCHED_STACK_MAP_ENTRIES : 1);
        rc) {
      return LibbpfError(rc, "sizing the off-CPU stack maps");
    }
  }
  // The per-window maps keyed by process image (ps_runtime<N>: exact on-CPU time) and by thread
  // and stack (ps_offcpu<N>: off-CPU intervals) take a key for each process that ran or waited
  // in the window, so under process churn (each fork and each exec is a new image: `sh -c
  // 'while :; do /bin/true; done'` makes about 2,000 a second here) preallocated buffers filled
  // within seconds and the rest was counted as dropped: the exact on-CPU time and the off-CPU
  // intervals of the processes past 8192 and 16384 keys. Where hash maps allocate elements from
  // bpf_mem_alloc (kernel/bpf/memalloc.c, Linux 6.1, "bpf: Convert hash map to bpf_mem_alloc",
  // found by HashMapsAllocateFromBpfMemAlloc; its per-CPU free lists are refilled from irq_work, so
  // sched_switch never enters the slab allocator under the run-queue lock), these maps are not
  // preallocated: kernel memory follows the keys used, 96 bytes a runtime key and 192 an off-CPU
  // key (struct htab_elem, key, value and bpf_mem_alloc's 8-byte header, rounded up to its size
  // classes), plus 16 bytes of bucket per possible key at load. At most 7 MiB a runtime buffer
  // (65536 keys) and 6.5 MiB an off-CPU one (32768), 27 MiB for the four; idle, about 3 MiB of
  // buckets, against about 6 MiB for the four preallocated maps. Below 6.1 the element would come
  // from kmalloc(GFP_ATOMIC) (kernel/bpf/hashtab.c alloc_htab_elem), which may wake kswapd and so
  // take a run-queue lock (the ps_threads comment in bpf/sched.bpf.c): the maps stay preallocated
  // there. Without off-CPU tracking nothing is stored in ps_offcpu<N>: one key.
  const bool on_use = HashMapsAllocateFromBpfMemAlloc(vmlinux);
  struct PerWindow {
    bpf_map* buffers[PS_NUM_BUFFERS];
    uint32_t entries;
    uint32_t* sized;
    const char* name;
  };
  for (const PerWindow& w : {PerWindow{{sched_->maps.ps_runtime0, sched_->maps.ps_runtime1},
                                       on_use ? uint32_t{PS_RUNTIME_MAP_ENTRIES_ON_USE}
                                              : uint32_t{PS_RUNTIME_MAP_ENTRIES},
                                       &runtime_map_entries_,
                                       "ps_runtime<N>"},
                             PerWindow{{sched_->maps.ps_offcpu0, sched_->maps.ps_offcpu1},
                                       !options.offcpu ? uint32_t{1}
                                       : on_use        ? uint32_t{PS_OFFCPU_MAP_ENTRIES_ON_USE}
                                                       : uint32_t{PS_OFFCPU_MAP_ENTRIES},
                                       &offcpu_map_entries_,
                                       "ps_offcpu<N>"}}) {
    *w.sized = w.entries;
    for (bpf_map* m : w.buffers) {
      if (int rc = bpf_map__set_max_entries(m, w.entries); rc) {
        return LibbpfError(rc, absl::StrCat("sizing ", w.name));
      }
      if (!on_use) continue;
      if (int rc = bpf_map__set_map_flags(m, bpf_map__map_flags(m) | BPF_F_NO_PREALLOC); rc) {
        return LibbpfError(rc, absl::StrCat("making ", w.name, " allocate on use"));
      }
    }
    Log(LogLevel::kDebug, "%s: %d keys a buffer, %s", w.name, w.entries,
        on_use ? "allocated on use" : "preallocated");
  }
  const bool follow_forks = options.tree_root != 0;
  sched_->rodata->ps_cfg_filter_tgid = !options.tgids.empty() || follow_forks ? 1 : 0;
  sched_->rodata->ps_cfg_group = options.latency_group;
  sched_->rodata->ps_cfg_follow_forks = follow_forks ? 1 : 0;
  // The cgroup release hook only where cgroups are the groups.
  bpf_program__set_autoload(sched_->progs.ps_cgroup_release,
                            options.latency_group == PS_GROUP_CGROUP);
  bpf_program__set_autoload(sched_->progs.ps_cgroup_rmdir,
                            options.latency_group == PS_GROUP_CGROUP);
  sched_->rodata->ps_cfg_offcpu = options.offcpu ? 1 : 0;
  sched_->rodata->ps_cfg_min_offcpu_ns = options.min_offcpu_ns;
  sched_->rodata->ps_cfg_stack_rate = options.offcpu_stack_rate;
  sched_->rodata->ps_cfg_stack_budget = options.offcpu_stack_budget;
  sched_->rodata->ps_cfg_stack_cpu_ns = options.offcpu_stack_cpu_ns;
  // tp_btf only: every kernel at the 5.10 floor has it (5.5+), and the raw_tp form cannot pass
  // the verifier (its task pointers are plain scalars there, which bpf_get_task_stack refuses).
  sched_kind_ = "tp_btf";
  // The sched_switch variant by the tracepoint's arguments in the kernel's BTF, not by version:
  // 4 (prev_state, Linux 5.18+) -> ps_sched_switch, 3 -> ps_sched_switch3 (bpf/sched.bpf.c).
  int args = options.sched_switch_args;
  if (args == 0) {
    args = TracepointArgCount(vmlinux, "sched_switch");
    if (args < 3) {
      std::string why = args < 0 ? std::strerror(-args) : absl::StrCat(args, " arguments");
      return absl::FailedPreconditionError(absl::StrCat(
          "the kernel's BTF has no usable sched_switch tracepoint (btf_trace_sched_switch: ", why,
          ")"));
    }
  }
  const bool with_state = args >= 4;
  bpf_program__set_autoload(sched_->progs.ps_sched_switch, with_state);
  bpf_program__set_autoload(sched_->progs.ps_sched_switch3, !with_state);
  Log(LogLevel::kDebug, "sched_switch: %d-argument tracepoint, loading %s", args,
      with_state ? "ps_sched_switch (prev's state from the prev_state argument)"
                 : "ps_sched_switch3 (prev's state read from its task_struct)");
  if (int rc = sched_bpf::load(sched_); rc) return LibbpfError(rc, "loading sched.bpf.o");
  return absl::OkStatus();
}

absl::Status BpfPrograms::CreateCollector(const Options& options) {
  BpfMapReader::Fds fds;
  fds.stacks = {bpf_map__fd(oncpu_->maps.ps_stacks0), bpf_map__fd(oncpu_->maps.ps_stacks1)};
  fds.oncpu = {bpf_map__fd(oncpu_->maps.ps_oncpu0), bpf_map__fd(oncpu_->maps.ps_oncpu1)};
  fds.cpu_state = bpf_map__fd(oncpu_->maps.ps_cpu_state);
  if (sched_ != nullptr) {
    fds.offcpu = {bpf_map__fd(sched_->maps.ps_offcpu0), bpf_map__fd(sched_->maps.ps_offcpu1)};
    fds.runtime = {bpf_map__fd(sched_->maps.ps_runtime0), bpf_map__fd(sched_->maps.ps_runtime1)};
    if (bpf_program__autoload(sched_->progs.ps_dump_threads)) {
      thread_dump_link_ = bpf_program__attach_iter(sched_->progs.ps_dump_threads, nullptr);
      if (thread_dump_link_ == nullptr) {
        return LibbpfError(-errno, "attaching the thread state iterator (iter/task)");
      }
      fds.thread_dump_link = bpf_link__fd(thread_dump_link_);
    } else {
      fds.threads = bpf_map__fd(sched_->maps.ps_threads);
    }
    fds.sched_stacks = {bpf_map__fd(sched_->maps.ps_sched_stacks0),
                        bpf_map__fd(sched_->maps.ps_sched_stacks1)};
  }
  map_reader_ = std::make_unique<BpfMapReader>(fds);
  collect::Collector::Options copts;
  copts.sched = sched_ != nullptr;
  copts.min_offcpu_ns = options.min_offcpu_ns;
  collector_ = std::make_unique<collect::Collector>(map_reader_.get(), copts);
  return absl::OkStatus();
}

namespace {

// The unwind maps of bpf/unwind.bpf.h, written with BPF_MAP_UPDATE_BATCH (Linux 5.6; bpf(2),
// kernel/bpf/syscall.c generic_map_update_batch): one system call per few thousand rows. The
// arrays are not mmap'ed: a mapping of a BPF array is populated whole (remap_vmalloc_range),
// which would count the entire row budget in the agent's RSS. The process hash is updated last,
// so the walker never reaches rows or mappings before they are written.
class BpfUnwindMaps : public unwind::UnwindMaps {
 public:
  // files_fd, vma_cache_fd: ps_unwind_files and ps_vma_cache, or -1 when the loaded walker
  // does not read them (no bpf_find_vma).
  BpfUnwindMaps(int procs_fd, int rows_fd, uint32_t rows_cap, int maps_fd, uint32_t maps_cap,
                int files_fd, int vma_cache_fd)
      : procs_fd_(procs_fd),
        rows_fd_(rows_fd),
        rows_cap_(rows_cap),
        maps_fd_(maps_fd),
        maps_cap_(maps_cap),
        files_fd_(files_fd),
        vma_cache_fd_(vma_cache_fd) {}
  uint32_t row_capacity() const override { return rows_cap_; }
  uint32_t mapping_capacity() const override { return maps_cap_; }
  void WriteRows(uint32_t first, absl::Span<const ps_unwind_row> rows) override {
    Write(rows_fd_, first, rows.data(), sizeof(ps_unwind_row), rows.size());
  }
  void WriteMappings(uint32_t first, absl::Span<const ps_unwind_mapping> maps) override {
    Write(maps_fd_, first, maps.data(), sizeof(ps_unwind_mapping), maps.size());
  }
  absl::Status SetProcess(uint32_t tgid, const ps_unwind_proc& proc) override {
    if (bpf_map_update_elem(procs_fd_, &tgid, &proc, BPF_ANY) != 0) {
      return ErrnoStatus(errno, "updating ps_unwind_procs");
    }
    return absl::OkStatus();
  }
  void DeleteProcess(uint32_t tgid) override { bpf_map_delete_elem(procs_fd_, &tgid); }
  absl::Status SetFile(const ps_unwind_file_key& key, const ps_unwind_file& file) override {
    if (files_fd_ < 0) return absl::OkStatus();
    if (bpf_map_update_elem(files_fd_, &key, &file, BPF_ANY) != 0) {
      return ErrnoStatus(errno, "updating ps_unwind_files");
    }
    return absl::OkStatus();
  }
  bool has_files() const override { return files_fd_ >= 0; }
  // The sampler only looks ps_vma_cache up: deleting from here takes a bucket lock no NMI
  // program takes (bpf/common.bpf.h, "Maps written from NMI context").
  void DeleteVmaCache(uint32_t tgid) override {
    if (vma_cache_fd_ >= 0) bpf_map_delete_elem(vma_cache_fd_, &tgid);
  }
  void DeleteFile(const ps_unwind_file_key& key) override {
    if (files_fd_ >= 0) bpf_map_delete_elem(files_fd_, &key);
  }
  // BPF programs run under rcu_read_lock (kernel/events/core.c bpf_overflow_handler,
  // kernel/trace/bpf_trace.c __bpf_trace_run), so an RCU grace period waits them out:
  // membarrier(MEMBARRIER_CMD_GLOBAL) is synchronize_rcu() (kernel/sched/membarrier.c;
  // man 2 membarrier). It fails on nohz_full kernels: then sleep past any program's run.
  void Synchronize() override {
    if (syscall(__NR_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) != 0) {
      usleep(100000);
    }
  }

 private:
  // Writes n elements of `size` bytes at index first.., in batches; element by element where
  // the kernel lacks batch updates.
  static void Write(int fd, uint32_t first, const void* data, size_t size, size_t n) {
    constexpr size_t kBatch = 4096;
    std::vector<uint32_t> keys;
    const auto* bytes = static_cast<const uint8_t*>(data);
    for (size_t done = 0; done < n;) {
      uint32_t count = static_cast<uint32_t>(std::min(kBatch, n - done));
      keys.resize(count);
      for (uint32_t i = 0; i < count; ++i) keys[i] = first + static_cast<uint32_t>(done) + i;
      uint32_t written = count;
      if (bpf_map_update_batch(fd, keys.data(), bytes + done * size, &written, nullptr) != 0) {
        for (uint32_t i = 0; i < count; ++i) {
          bpf_map_update_elem(fd, &keys[i], bytes + (done + i) * size, BPF_ANY);
        }
      }
      done += count;
    }
  }

  int procs_fd_;
  int rows_fd_;
  uint32_t rows_cap_;
  int maps_fd_;
  uint32_t maps_cap_;
  int files_fd_;
  int vma_cache_fd_;
};



int OnUnwindEvent(void* ctx, void* data, size_t size) {
  if (size >= sizeof(ps_unwind_event)) {
    ps_unwind_event e;
    std::memcpy(&e, data, sizeof(e));
    (*static_cast<const std::function<void(const ps_unwind_event&)>**>(ctx))[0](e);
  }
  return 0;
}

}  // namespace

absl::Status BpfPrograms::StartUnwinder(const Options& options) {
  // The ring buffer's callback reaches the current handler through this slot.
  auto* slot = new const std::function<void(const ps_unwind_event&)>*(nullptr);
  unwind_events_slot_.reset(slot);
  unwind_events_ = ring_buffer__new(bpf_map__fd(oncpu_->maps.ps_unwind_events), OnUnwindEvent,
                                    slot, nullptr);
  if (unwind_events_ == nullptr) return LibbpfError(-errno, "opening the unwind ring buffer");
  ring_buffer* rb = unwind_events_;
  // The poll thread sleeps until an event or Stop (an eventfd beside the ring buffer's epoll fd
  // in an epoll set of our own: libbpf's ring_buffer__poll sizes its event array to its rings,
  // so another fd cannot join its set), not on a timer: measured, the 100 ms tick it had woke
  // an idle agent 10 times a second.
  unwind_wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (unwind_wake_fd_ < 0) return ErrnoStatus(errno, "creating the unwinder's eventfd");
  unwind_epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
  if (unwind_epoll_fd_ < 0) return ErrnoStatus(errno, "creating the unwinder's epoll set");
  for (int fd : {ring_buffer__epoll_fd(rb), unwind_wake_fd_}) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (epoll_ctl(unwind_epoll_fd_, EPOLL_CTL_ADD, fd, &ev) != 0) {
      return ErrnoStatus(errno, "adding to the unwinder's epoll set");
    }
  }
  const int epoll_fd = unwind_epoll_fd_, wake_fd = unwind_wake_fd_;
  auto maps = std::make_unique<BpfUnwindMaps>(
      bpf_map__fd(oncpu_->maps.ps_unwind_procs), bpf_map__fd(oncpu_->maps.ps_unwind_rows),
      bpf_map__max_entries(oncpu_->maps.ps_unwind_rows), bpf_map__fd(oncpu_->maps.ps_unwind_maps),
      bpf_map__max_entries(oncpu_->maps.ps_unwind_maps),
      sampler_ == oncpu_->progs.ps_on_cpu_sample_vma ? bpf_map__fd(oncpu_->maps.ps_unwind_files)
                                                     : -1,
      sampler_ == oncpu_->progs.ps_on_cpu_sample_vma ? bpf_map__fd(oncpu_->maps.ps_vma_cache)
                                                     : -1);
  unwinder_ = std::make_unique<unwind::UnwindService>(
      std::move(maps),
      [rb, slot, epoll_fd, wake_fd](int timeout_ms,
                                    const std::function<void(const ps_unwind_event&)>& handler) {
        epoll_event ev[2];
        const int n = epoll_wait(epoll_fd, ev, 2, timeout_ms);
        if (n < 0) return -errno;
        for (int i = 0; i < n; ++i) {
          uint64_t wakes;
          if (ev[i].data.fd == wake_fd) (void)!read(wake_fd, &wakes, sizeof(wakes));
        }
        *slot = &handler;
        int rc = ring_buffer__consume(rb);
        *slot = nullptr;
        return rc;
      },
      "/proc", options.processes,
      [wake_fd] {
        const uint64_t one = 1;
        (void)!write(wake_fd, &one, sizeof(one));
      });
  const int64_t t0 = MonotonicNowNs();
  // Command mode: nothing yet (the command's process is still the agent's fork; its exec asks
  // for CMD's tables, bpf/oncpu.bpf.c ps_on_exec).
  unwinder_->Start(options.tgids, /*preload=*/options.tree_root == 0);
  unwind::UnwindTableStats st = unwinder_->stats();
  Log(LogLevel::kInfo,
      "unwind tables: %d processes, %d files, %d KiB of %d KiB, built in %.0f ms (%.0f ms in all)",
      st.processes, st.tables, st.table_bytes / 1024, st.table_budget_bytes / 1024,
      st.build_ns / 1e6, (MonotonicNowNs() - t0) / 1e6);
  return absl::OkStatus();
}

unwind::UnwindTableStats BpfPrograms::unwind_stats() const {
  return unwinder_ != nullptr ? unwinder_->stats() : unwind::UnwindTableStats{};
}

void BpfPrograms::RunIterator(bpf_program* prog, const char* what) {
  bpf_link* link = bpf_program__attach_iter(prog, nullptr);
  if (link == nullptr) {
    Log(LogLevel::kWarning, "%s (iter/task): cannot attach: %s", what, std::strerror(errno));
    return;
  }
  int fd = bpf_iter_create(bpf_link__fd(link));
  if (fd >= 0) {
    char buf[64];
    ssize_t n;
    while ((n = read(fd, buf, sizeof(buf))) > 0 || (n < 0 && errno == EINTR)) {
    }
    if (n < 0) Log(LogLevel::kWarning, "%s (iter/task): %s", what, std::strerror(errno));
    close(fd);
  } else {
    Log(LogLevel::kWarning, "%s (iter/task): cannot run: %s", what, std::strerror(errno));
  }
  bpf_link__destroy(link);
}

void BpfPrograms::Detach() {
  for (bpf_link* l : links_) bpf_link__destroy(l);
  links_.clear();
}

BpfPrograms::~BpfPrograms() {
  Detach();
  if (unwinder_ != nullptr) unwinder_->Stop();
  unwinder_.reset();
  if (unwind_events_ != nullptr) ring_buffer__free(unwind_events_);
  if (unwind_epoll_fd_ >= 0) close(unwind_epoll_fd_);
  if (unwind_wake_fd_ >= 0) close(unwind_wake_fd_);
  if (control_ != nullptr) munmap(control_, sysconf(_SC_PAGESIZE));
  if (thread_dump_link_ != nullptr) bpf_link__destroy(thread_dump_link_);
  if (sched_ != nullptr) sched_bpf::destroy(sched_);
  if (oncpu_ != nullptr) oncpu_bpf::destroy(oncpu_);
}

absl::Status BpfPrograms::WaitForPrograms() {
  const int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return LibbpfError(ncpu, "counting possible CPUs");
  // Per-CPU array values, one per possible CPU (bpf(2) BPF_MAP_LOOKUP_ELEM on a per-CPU map).
  std::vector<ps_progress> progress(ncpu);
  const int fd = bpf_map__fd(oncpu_->maps.ps_progress);
  const uint32_t zero = 0;
  // The caller's write of the new buffer is ordered before this read (its seq_cst fence, then
  // the system call).
  // Each CPU's depth is one aligned 8-byte word, copied whole (kernel/bpf/arraymap.c
  // bpf_percpu_array_copy, bpf_long_memcpy).
  if (bpf_map_lookup_elem(fd, &zero, progress.data()) != 0) {
    return ErrnoStatus(errno, "reading ps_progress");
  }
  std::vector<int> busy;
  for (int c = 0; c < ncpu; ++c) {
    if (progress[c].depth != 0) busy.push_back(c);
  }
  const int64_t deadline = MonotonicNowNs() + 1000000000;
  while (!busy.empty()) {
    // A program in flight has microseconds left: yield, then look again.
    std::this_thread::sleep_for(std::chrono::microseconds(20));
    if (bpf_map_lookup_elem(fd, &zero, progress.data()) != 0) {
      return ErrnoStatus(errno, "reading ps_progress");
    }
    // Seen at depth 0 once: whatever ran at the first read has returned.
    busy.erase(std::remove_if(busy.begin(), busy.end(),
                              [&](int c) { return progress[c].depth == 0; }),
               busy.end());
    if (!busy.empty() && MonotonicNowNs() > deadline) {
      ++flip_wait_timeouts_;
      static RateLimitedLog log;
      log.Log(LogLevel::kWarning,
              "window flip: BPF programs on %zu CPU(s) (first: CPU %d) did not finish within 1 s;"
              " draining anyway",
              busy.size(), busy.front());
      break;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<WindowData> BpfPrograms::Drain(bool final) {
  if (final) Detach();
  int64_t ws = MonotonicNowNs();
  uint32_t closed = active_;
  if (!final) {
    // Window start before buffer: a program that sees the new buffer also sees the new start
    // (bpf/abi.h ps_control.buffer_start_ns).
    control_->buffer_start_ns[active_ ^ 1] = static_cast<uint64_t>(ws);
    control_->window_start_ns = ws;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    active_ ^= 1;
    control_->active_buffer = active_;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  PS_RETURN_IF_ERROR(WaitForPrograms());

  WindowData out = collector_->Collect(window_start_ns_, ws, closed, final);
  window_start_ns_ = ws;
  return out;
}

void BpfPrograms::StopTracking(uint32_t tgid) {
  bpf_map__delete_elem(oncpu_->maps.ps_pid_filter, &tgid, sizeof(tgid), 0);
}



std::vector<BpfPrograms::ProgramStats> BpfPrograms::ProgramRunTimes() const {
  std::vector<ProgramStats> out;
  std::vector<const bpf_program*> progs = {oncpu_->progs.ps_on_cpu_sample,
                                           oncpu_->progs.ps_on_cpu_sample_vma,
                                           oncpu_->progs.ps_process_exec,
                                           oncpu_->progs.ps_process_exec_vma,
                                           oncpu_->progs.ps_process_fork};
  if (sched_ != nullptr) {
    progs.insert(progs.end(), {sched_->progs.ps_sched_switch, sched_->progs.ps_sched_switch3,
                               sched_->progs.ps_process_exit, sched_->progs.ps_thread_new,
                               sched_->progs.ps_dump_threads});
  }
  for (const bpf_program* p : progs) {
    int fd = bpf_program__fd(p);
    if (fd < 0) continue;  // not loaded (the sched_switch variant not chosen)
    bpf_prog_info info{};
    uint32_t len = sizeof(info);
    if (bpf_obj_get_info_by_fd(fd, &info, &len) != 0) continue;
    out.push_back({bpf_program__name(p), info.run_time_ns, info.run_cnt});
  }
  return out;
}

BpfCounters BpfPrograms::Counters() const {
  BpfCounters total{};
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return total;
  std::vector<uint64_t> per_cpu(ncpu);
  int fd = bpf_map__fd(oncpu_->maps.ps_counters);
  for (uint32_t i = 0; i < PS_CTR_NUM; ++i) {
    if (bpf_map_lookup_elem(fd, &i, per_cpu.data()) != 0) continue;
    for (uint64_t c : per_cpu) total[i] += c;
  }
  return total;
}

}  // namespace parascope
