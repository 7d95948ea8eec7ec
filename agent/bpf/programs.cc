#include "agent/bpf/programs.h"

#include <bpf/bpf.h>
#include <bpf/btf.h>
#include <bpf/libbpf.h>
#include <linux/membarrier.h>
#include <sched.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

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

// Keys of a map with no concurrent writer (a closed buffer), via get_next_key.
template <typename K>
std::vector<K> AllKeys(int fd) {
  std::vector<K> keys;
  K key{}, next{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }
  return keys;
}

template <typename K>
void DeleteAll(int fd, const std::vector<K>& keys) {
  for (const K& k : keys) bpf_map_delete_elem(fd, &k);
}

// Reads and deletes every entry of a hash map nobody writes any more (the drained buffer), calling
// fn(key, value) for each. Uses BPF_MAP_LOOKUP_AND_DELETE_BATCH (Linux 5.6; bpf(2),
// kernel/bpf/hashtab.c __htab_map_lookup_and_delete_batch): one system call per few hundred
// entries instead of three per entry. Where the kernel lacks it, falls back to get_next_key,
// lookup and delete.
template <typename K, typename V, typename Fn>
void DrainMap(int fd, Fn&& fn) {
  uint32_t batch = 256;
  std::vector<K> keys(batch);
  std::vector<V> values(batch);
  uint32_t in_batch = 0, out_batch = 0;
  bool first = true;
  for (;;) {
    uint32_t count = batch;
    int rc = bpf_map_lookup_and_delete_batch(fd, first ? nullptr : &in_batch, &out_batch,
                                             keys.data(), values.data(), &count, nullptr);
    int err = rc < 0 ? errno : 0;
    if (rc < 0 && err == ENOSPC && count == 0 && batch < (1u << 20)) {
      // One hash bucket holds more entries than the buffers: grow and retry the same bucket.
      batch *= 2;
      keys.resize(batch);
      values.resize(batch);
      continue;
    }
    if (rc < 0 && first && count == 0 &&
        (err == EINVAL || err == EOPNOTSUPP || err == ENOTSUP || err == 524 /* ENOTSUPP */)) {
      std::vector<K> all = AllKeys<K>(fd);
      V v;
      for (const K& k : all) {
        if (bpf_map_lookup_elem(fd, &k, &v) == 0) fn(k, v);
      }
      DeleteAll(fd, all);
      return;
    }
    for (uint32_t i = 0; i < count; ++i) fn(keys[i], values[i]);
    if (rc < 0) {
      if (err != ENOENT) {
        static RateLimitedLog log;
        log.Log(LogLevel::kWarning, "draining a BPF map: %s", std::strerror(err));
      }
      return;
    }
    in_batch = out_batch;
    first = false;
  }
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
  self->min_offcpu_ns_ = options.min_offcpu_ns;
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
  skel->rodata->ps_cfg_filter_tgid = options.tgids.empty() ? 0 : 1;
  skel->rodata->ps_cfg_parallelism = options.sched ? 1 : 0;
  if (int rc = oncpu_bpf::load(skel); rc) return LibbpfError(rc, "loading oncpu.bpf.o");

  void* ctl = mmap(nullptr, sysconf(_SC_PAGESIZE), PROT_READ | PROT_WRITE, MAP_SHARED,
                   bpf_map__fd(skel->maps.ps_control), 0);
  if (ctl == MAP_FAILED) return ErrnoStatus(errno, "mmap ps_control");
  self->control_ = static_cast<ps_control*>(ctl);

  uint8_t one = 1;
  for (uint32_t tgid : options.tgids) {
    if (bpf_map__update_elem(skel->maps.ps_pid_filter, &tgid, sizeof(tgid), &one, sizeof(one),
                             BPF_ANY)) {
      return ErrnoStatus(errno, "filling the pid filter map");
    }
  }
  if (options.sched) PS_RETURN_IF_ERROR(self->LoadSched(options));
  PS_RETURN_IF_ERROR(self->StartUnwinder(options));

  // The first window starts now; CPUs are unknown until a switch or a sample shows their task.
  self->window_start_ns_ = MonotonicNowNs();
  self->control_->unknown_cpus = static_cast<int64_t>(self->events_.cpus.size());
  self->control_->window_start_ns = self->window_start_ns_;
  self->control_->active_buffer = 0;
  std::atomic_thread_fence(std::memory_order_seq_cst);

  if (self->sched_ != nullptr) {
    for (bpf_program* p : {self->sched_->progs.ps_sched_switch,
                           self->sched_->progs.ps_sched_switch3,
                           self->sched_->progs.ps_process_exit}) {
      if (!bpf_program__autoload(p)) continue;  // the sched_switch variant not chosen
      bpf_link* link = bpf_program__attach(p);
      if (link == nullptr) {
        return LibbpfError(-errno, absl::StrCat("attaching ", bpf_program__name(p)));
      }
      self->links_.push_back(link);
    }
  }
  {
    bpf_program* p = skel->progs.ps_process_exec;
    bpf_link* link = bpf_program__attach(p);
    if (link == nullptr) {
      return LibbpfError(-errno, absl::StrCat("attaching ", bpf_program__name(p)));
    }
    self->links_.push_back(link);
  }
  if (self->sched_ != nullptr) self->SeedSleepingThreads();
  for (size_t i = 0; i < self->events_.fds.size(); ++i) {
    bpf_link* link =
        bpf_program__attach_perf_event(skel->progs.ps_on_cpu_sample, self->events_.fds[i].get());
    if (link == nullptr) {
      return LibbpfError(-errno, absl::StrCat("attaching to ", self->events_.name, " on CPU ",
                                              self->events_.cpus[i]));
    }
    self->links_.push_back(link);
  }
  return self;
}

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
                   Shared{sched_->maps.ps_unwind_procs, oncpu_->maps.ps_unwind_procs},
                   Shared{sched_->maps.ps_unwind_maps, oncpu_->maps.ps_unwind_maps},
                   Shared{sched_->maps.ps_unwind_rows, oncpu_->maps.ps_unwind_rows},
                   Shared{sched_->maps.ps_unwind_events, oncpu_->maps.ps_unwind_events},
                   Shared{sched_->maps.ps_unwind_notify_state,
                          oncpu_->maps.ps_unwind_notify_state}}) {
    if (int rc = bpf_map__reuse_fd(s.mine, bpf_map__fd(s.theirs)); rc) {
      return LibbpfError(rc, absl::StrCat("sharing map ", bpf_map__name(s.mine)));
    }
  }
  // ps_threads is preallocated (bpf/sched.bpf.c: ~208 bytes per entry, 13 MiB at
  // PS_THREAD_MAP_ENTRIES): twice the threads alive now, so the host can grow before the map is
  // full (then switch-outs are counted, PS_CTR_THREAD_MAP_FULL, and lost), at least 8192 (1.6
  // MiB). Without off-CPU tracking nothing is stored in it: one entry.
  const uint64_t threads = HostThreads();
  const uint32_t thread_entries =
      options.offcpu ? std::clamp<uint32_t>(NextPow2(2 * threads), 8192, PS_THREAD_MAP_ENTRIES) : 1;
  if (int rc = bpf_map__set_max_entries(sched_->maps.ps_threads, thread_entries); rc) {
    return LibbpfError(rc, "sizing the thread state map");
  }
  Log(LogLevel::kDebug, "ps_threads: %d entries (%d threads on the host), about %d KiB",
      thread_entries, threads, uint64_t{thread_entries} * 208 / 1024);
  // Off-CPU stacks (switch-out, and switch-in for long uncaptured intervals): their own maps, so
  // that the NMI sampler never waits on a lock sched_switch holds (bpf/common.bpf.h). About 1 KiB
  // per entry, 8 MiB per buffer; unused without off-CPU tracking.
  for (bpf_map* m : {sched_->maps.ps_sched_stacks0, sched_->maps.ps_sched_stacks1}) {
    if (int rc = bpf_map__set_max_entries(m, options.offcpu ? PS_SCHED_STACK_MAP_ENTRIES : 1);
        rc) {
      return LibbpfError(rc, "sizing the off-CPU stack maps");
    }
  }
  sched_->rodata->ps_cfg_filter_tgid = options.tgids.empty() ? 0 : 1;
  sched_->rodata->ps_cfg_offcpu = options.offcpu ? 1 : 0;
  sched_->rodata->ps_cfg_min_offcpu_ns = options.min_offcpu_ns;
  sched_->rodata->ps_cfg_stack_rate = options.offcpu_stack_rate;
  // tp_btf only: every kernel at the 5.10 floor has it (5.5+), and the raw_tp form cannot pass
  // the verifier (its task pointers are plain scalars there, which bpf_get_task_stack refuses).
  sched_kind_ = "tp_btf";
  // The sched_switch variant by the tracepoint's arguments in the kernel's BTF, not by version:
  // 4 (prev_state, Linux 5.18+) -> ps_sched_switch, 3 -> ps_sched_switch3 (bpf/sched.bpf.c).
  int args = options.sched_switch_args;
  if (args == 0) {
    btf* vmlinux = btf__load_vmlinux_btf();
    if (vmlinux == nullptr) return LibbpfError(-errno, "loading the kernel's BTF");
    args = TracepointArgCount(vmlinux, "sched_switch");
    btf__free(vmlinux);
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

namespace {

// The unwind maps of bpf/unwind.bpf.h, written with BPF_MAP_UPDATE_BATCH (Linux 5.6; bpf(2),
// kernel/bpf/syscall.c generic_map_update_batch): one system call per few thousand rows. The
// arrays are not mmap'ed: a mapping of a BPF array is populated whole (remap_vmalloc_range),
// which would count the entire row budget in the agent's RSS. The process hash is updated last,
// so the walker never reaches rows or mappings before they are written.
class BpfUnwindMaps : public unwind::UnwindMaps {
 public:
  BpfUnwindMaps(int procs_fd, int rows_fd, uint32_t rows_cap, int maps_fd, uint32_t maps_cap)
      : procs_fd_(procs_fd),
        rows_fd_(rows_fd),
        rows_cap_(rows_cap),
        maps_fd_(maps_fd),
        maps_cap_(maps_cap) {}
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
  auto maps = std::make_unique<BpfUnwindMaps>(
      bpf_map__fd(oncpu_->maps.ps_unwind_procs), bpf_map__fd(oncpu_->maps.ps_unwind_rows),
      bpf_map__max_entries(oncpu_->maps.ps_unwind_rows), bpf_map__fd(oncpu_->maps.ps_unwind_maps),
      bpf_map__max_entries(oncpu_->maps.ps_unwind_maps));
  unwinder_ = std::make_unique<unwind::UnwindService>(
      std::move(maps),
      [rb, slot](int timeout_ms, const std::function<void(const ps_unwind_event&)>& handler) {
        *slot = &handler;
        int rc = ring_buffer__poll(rb, timeout_ms);
        *slot = nullptr;
        return rc;
      },
      "/proc", options.processes);
  const int64_t t0 = MonotonicNowNs();
  unwinder_->Start(options.tgids);
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

void BpfPrograms::SeedSleepingThreads() {
  // Best effort: without it, threads running at attach count in parallelism from their next
  // switch-in, and threads asleep since before attach appear from their first wake-up.
  bpf_link* link = bpf_program__attach_iter(sched_->progs.ps_seed_threads, nullptr);
  if (link == nullptr) {
    Log(LogLevel::kWarning, "cannot seed running processes and sleeping threads (iter/task): %s",
        std::strerror(errno));
    return;
  }
  int fd = bpf_iter_create(bpf_link__fd(link));
  if (fd >= 0) {
    char buf[64];
    while (read(fd, buf, sizeof(buf)) > 0) {
    }
    close(fd);
  } else {
    Log(LogLevel::kWarning, "cannot run the thread seeding iterator: %s", std::strerror(errno));
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
  if (control_ != nullptr) munmap(control_, sysconf(_SC_PAGESIZE));
  if (sched_ != nullptr) sched_bpf::destroy(sched_);
  if (oncpu_ != nullptr) oncpu_bpf::destroy(oncpu_);
}

absl::Status BpfPrograms::WaitForCpus() {
  cpu_set_t saved;
  if (sched_getaffinity(0, sizeof(saved), &saved) != 0) {
    return ErrnoStatus(errno, "sched_getaffinity");
  }
  for (int cpu : events_.cpus) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    // Returns after the kernel migrated this thread to `cpu` (kernel/sched/core.c
    // __set_cpus_allowed_ptr -> affine_move_task waits for the stopper). EINVAL: CPU went
    // offline, and an offline CPU runs no program.
    if (sched_setaffinity(0, sizeof(one), &one) != 0 && errno != EINVAL) {
      int err = errno;
      sched_setaffinity(0, sizeof(saved), &saved);
      return ErrnoStatus(err, absl::StrCat("sched_setaffinity(cpu ", cpu, ")"));
    }
  }
  sched_setaffinity(0, sizeof(saved), &saved);
  return absl::OkStatus();
}

absl::StatusOr<WindowData> BpfPrograms::Drain(bool final) {
  if (final) Detach();
  int64_t ws = MonotonicNowNs();
  uint32_t closed = active_;
  if (!final) {
    // Window start before buffer: a program that sees the new buffer also sees the new start.
    control_->window_start_ns = ws;
    std::atomic_thread_fence(std::memory_order_seq_cst);
    active_ ^= 1;
    control_->active_buffer = active_;
    std::atomic_thread_fence(std::memory_order_seq_cst);
  }
  PS_RETURN_IF_ERROR(WaitForCpus());

  WindowData out;
  out.start_mono_ns = window_start_ns_;
  out.end_mono_ns = ws;
  ++window_index_;
  DrainBuffer(closed, &out);
  if (final) DrainBuffer(closed ^ 1, &out);
  if (sched_ != nullptr) {
    absl::flat_hash_map<uint32_t, uint64_t> on_cpu;
    ScanCpus(window_start_ns_, ws, &on_cpu, &out);
    ScanThreads(window_start_ns_, ws, on_cpu, &out);
  }
  window_start_ns_ = ws;

  // Keep stacks used in this or the previous window; bound the cache.
  for (auto it = stack_cache_.begin(); it != stack_cache_.end();) {
    if (it->second.last_used_window + 2 <= window_index_) {
      stack_cache_.erase(it++);
    } else {
      ++it;
    }
  }
  if (stack_cache_.size() > kMaxCachedStacks) {
    std::vector<std::pair<uint64_t, uint64_t>> by_age;
    for (const auto& [h, c] : stack_cache_) by_age.emplace_back(c.last_used_window, h);
    std::sort(by_age.begin(), by_age.end());
    for (size_t i = 0; i < by_age.size() - kMaxCachedStacks; ++i) {
      stack_cache_.erase(by_age[i].second);
      ++map_stats_.stack_cache_evicted;
    }
  }
  map_stats_.stack_cache = stack_cache_.size();
  return out;
}

void BpfPrograms::ResolveStacks(uint64_t kernel_stack, int32_t kernel_err, uint64_t user_stack,
                                int32_t user_err, StackPair* pair) {
  auto one = [&](uint64_t hash, int32_t err, std::vector<uint64_t>* ips, int32_t* err_out,
                 uint32_t* flags) {
    *err_out = err;
    if (hash == 0) return;
    auto it = stack_cache_.find(hash);
    if (it == stack_cache_.end()) {
      ++map_stats_.stacks_missing;
      *err_out = -ENOENT;
      return;
    }
    it->second.last_used_window = window_index_;
    *ips = it->second.ips;
    *flags = it->second.flags;
  };
  uint32_t kernel_flags = 0;
  one(kernel_stack, kernel_err, &pair->kernel_ips, &pair->kernel_stack_err, &kernel_flags);
  one(user_stack, user_err, &pair->user_ips, &pair->user_stack_err, &pair->user_unwind);
}

void BpfPrograms::DrainBuffer(uint32_t index, WindowData* out) {
  // Stacks first: records of this buffer and intervals ending later refer to them.
  int stacks_fd = bpf_map__fd(index == 0 ? oncpu_->maps.ps_stacks0 : oncpu_->maps.ps_stacks1);
  auto cache_stack = [&](uint64_t h, const ps_stack& st) {
    CachedStack& c = stack_cache_[h];
    c.ips.assign(st.ips, st.ips + std::min<uint32_t>(st.len, PS_MAX_STACK_DEPTH));
    c.flags = st.flags;
    c.last_used_window = window_index_;
  };
  DrainMap<uint64_t, ps_stack>(stacks_fd, cache_stack);
  if (sched_ != nullptr) {
    // sched_switch's own stacks (bpf/common.bpf.h): one cache, one hash per stack either way.
    DrainMap<uint64_t, ps_stack>(
        bpf_map__fd(index == 0 ? sched_->maps.ps_sched_stacks0 : sched_->maps.ps_sched_stacks1),
        cache_stack);
  }

  int agg_fd = bpf_map__fd(index == 0 ? oncpu_->maps.ps_oncpu0 : oncpu_->maps.ps_oncpu1);
  DrainMap<ps_oncpu_key, ps_oncpu_value>(agg_fd, [&](const ps_oncpu_key& k,
                                                     const ps_oncpu_value& v) {
    OnCpuRecord r;
    r.process = proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id};
    r.tid = k.tid;
    r.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
    ResolveStacks(k.kernel_stack, k.kernel_stack_err, k.user_stack, k.user_stack_err, &r.stacks);
    r.parallelism = std::max<uint32_t>(k.parallelism, 1);
    r.parallelism_unknown = (k.flags & PS_SAMPLE_PARALLELISM_UNKNOWN) != 0;
    r.count = v.count;
    r.period_sum = v.period_sum;
    out->oncpu.push_back(std::move(r));
  });
  if (sched_ == nullptr) return;

  int off_fd = bpf_map__fd(index == 0 ? sched_->maps.ps_offcpu0 : sched_->maps.ps_offcpu1);
  DrainMap<ps_offcpu_key, ps_offcpu_value>(off_fd, [&](const ps_offcpu_key& k,
                                                       const ps_offcpu_value& v) {
    OffCpuRecord r;
    r.process = proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id};
    r.tid = k.tid;
    r.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
    ResolveStacks(k.kernel_stack, k.kernel_stack_err, k.user_stack, k.user_stack_err, &r.stacks);
    r.state = k.state;
    r.ns = v.ns;
    r.count = v.count;
    out->offcpu.push_back(std::move(r));
  });

  int rt_fd = bpf_map__fd(index == 0 ? sched_->maps.ps_runtime0 : sched_->maps.ps_runtime1);
  DrainMap<ps_runtime_key, uint64_t>(rt_fd, [&](const ps_runtime_key& k, uint64_t ns) {
    out->runtime.push_back({proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id}, ns});
  });
}

void BpfPrograms::ScanThreads(int64_t prev_ws, int64_t ws,
                              const absl::flat_hash_map<uint32_t, uint64_t>& on_cpu,
                              WindowData* out) {
  int fd = bpf_map__fd(sched_->maps.ps_threads);
  const uint64_t cur = static_cast<uint64_t>(ws), prev = static_cast<uint64_t>(prev_ws);
  auto emit = [&](uint32_t tid, const ps_thread_state& ts, uint64_t from, uint64_t kstack,
                  int32_t kerr, uint64_t ustack, int32_t uerr, uint32_t state) {
    from = std::max(from, prev);
    uint64_t to = cur;
    // Marked off-CPU at out_ns but seen running on a CPU since a later time: it came in by an
    // unreported switch (bpf/abi.h), so it was off-CPU only until then. A CPU record older than
    // out_ns is stale (the thread left that CPU unseen) and says nothing.
    if (auto it = on_cpu.find(tid); it != on_cpu.end() && it->second >= ts.out_ns) {
      to = std::min(to, it->second);
    }
    if (to <= from) return;
    OffCpuRecord r;
    r.process = proc::ProcessKey{ts.tgid, ts.tgid_start_ns, ts.exec_id};
    r.tid = tid;
    r.thread_name.assign(ts.comm, strnlen(ts.comm, sizeof(ts.comm)));
    ResolveStacks(kstack, kerr, ustack, uerr, &r.stacks);
    r.state = state;
    r.ns = to - from;
    r.count = 1;
    out->offcpu.push_back(std::move(r));
  };
  // Batch lookups walk the hash by bucket, so concurrent inserts and deletes (threads starting
  // and exiting) neither restart the walk nor visit an entry twice, unlike get_next_key.
  constexpr uint32_t kBatch = 256;
  std::vector<uint32_t> keys(kBatch);
  std::vector<ps_thread_state> values(kBatch);
  uint32_t in_batch = 0, out_batch = 0;
  bool first = true;
  uint64_t entries = 0;
  for (;;) {
    uint32_t count = kBatch;
    int rc = bpf_map_lookup_batch(fd, first ? nullptr : &in_batch, &out_batch, keys.data(),
                                  values.data(), &count, nullptr);
    int err = rc < 0 ? errno : 0;
    for (uint32_t i = 0; i < count; ++i) {
      const ps_thread_state& ts = values[i];
      ++entries;
      if (ts.carry_ws_ns == cur) {
        if (ts.carry_min_ok) {
          emit(keys[i], ts, ts.carry_out_ns, ts.carry_kernel_stack, ts.carry_kernel_stack_err,
               ts.carry_user_stack, ts.carry_user_stack_err, ts.carry_state);
        }
      } else if (ts.out_ns != 0 && ts.out_ns < cur) {
        // An interval whose stacks were not captured counts only once it is long (abi.h).
        if (cur - ts.out_ns >= min_offcpu_ns_ &&
            (ts.stack_weight != 0 || cur - ts.out_ns >= PS_EXACT_OFFCPU_NS)) {
          emit(keys[i], ts, ts.out_ns, ts.kernel_stack, ts.kernel_stack_err, ts.user_stack,
               ts.user_stack_err, ts.state);
        }
      }
      // Keep the stacks of threads still off-CPU: their intervals end in a later window.
      if (ts.out_ns != 0) {
        for (uint64_t h : {ts.kernel_stack, ts.user_stack}) {
          auto it = stack_cache_.find(h);
          if (it != stack_cache_.end()) it->second.last_used_window = window_index_;
        }
      }
    }
    if (rc < 0 && err != ENOENT) {
      static RateLimitedLog log;
      log.Log(LogLevel::kWarning, "reading ps_threads: %s", std::strerror(err));
    }
    if (rc < 0) break;
    in_batch = out_batch;
    first = false;
  }
  map_stats_.thread_states = entries;
  map_stats_.thread_states_max = std::max(map_stats_.thread_states_max, entries);
}

void BpfPrograms::ScanCpus(int64_t prev_ws, int64_t ws,
                           absl::flat_hash_map<uint32_t, uint64_t>* on_cpu, WindowData* out) {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return;
  std::vector<ps_cpu_state> cpus(ncpu);
  uint32_t zero = 0;
  if (bpf_map_lookup_elem(bpf_map__fd(oncpu_->maps.ps_cpu_state), &zero, cpus.data()) != 0) return;
  const uint64_t cur = static_cast<uint64_t>(ws), prev = static_cast<uint64_t>(prev_ws);
  for (const ps_cpu_state& c : cpus) {
    if (c.known && c.counted && c.tid != 0) {
      // A tid on two CPUs: one record is stale (it left unseen); the later switch-in is current.
      uint64_t& since = (*on_cpu)[c.tid];
      since = std::max<uint64_t>(since, c.in_ns);
    }
    uint64_t from;
    proc::ProcessKey key;
    if (c.carry_ws_ns == cur) {
      from = c.carry_in_ns;
      key = {c.carry_tgid, c.carry_tgid_start_ns, c.carry_exec_id};
    } else if (c.known && c.counted && c.tid != 0 && c.in_ns < cur) {
      from = c.in_ns;
      key = {c.tgid, c.tgid_start_ns, c.exec_id};
    } else {
      continue;
    }
    from = std::max(from, prev);
    if (cur > from) out->runtime.push_back({key, cur - from});
  }
}

void BpfPrograms::StopTracking(uint32_t tgid) {
  bpf_map__delete_elem(oncpu_->maps.ps_pid_filter, &tgid, sizeof(tgid), 0);
}

std::vector<BpfPrograms::ProgramStats> BpfPrograms::ProgramRunTimes() const {
  std::vector<ProgramStats> out;
  std::vector<const bpf_program*> progs = {oncpu_->progs.ps_on_cpu_sample,
                                           oncpu_->progs.ps_process_exec};
  if (sched_ != nullptr) {
    progs.insert(progs.end(), {sched_->progs.ps_sched_switch, sched_->progs.ps_sched_switch3,
                               sched_->progs.ps_process_exit});
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
