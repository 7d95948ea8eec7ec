// The BPF side of parascope: bpf/oncpu.bpf.c (perf_event sampler on every online CPU) and,
// when off-CPU, wall or latency profiles are wanted, bpf/sched.bpf.c (sched_switch), sharing
// their maps; and the per-window drain of their double-buffered aggregates.
#pragma once

#include <array>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/bpf/map_reader.h"
#include "agent/bpf/perf_event.h"
#include "agent/collect/collector.h"
#include "agent/collect/records.h"
#include "agent/unwind/unwind_tables.h"
#include "bpf/abi.h"

struct oncpu_bpf;
struct sched_bpf;
struct bpf_link;
struct bpf_program;
struct ring_buffer;

namespace parascope {

// Counters from the ps_counters per-CPU array (abi.h PS_CTR_*), summed over CPUs.
using BpfCounters = std::array<uint64_t, PS_CTR_NUM>;

// The kernel boundary of collection, so window logic can be tested with a fake.
class WindowSource {
 public:
  virtual ~WindowSource() = default;
  // Closes the current window at now and returns what it recorded: the programs are switched
  // to the other buffer, every CPU is waited on so no program still writes the closed one, the
  // closed buffer is read and emptied, and the parts of off-CPU intervals and on-CPU runs that
  // cross the boundary are attributed up to it. With `final`, sampling and tracing stop first
  // and everything still recorded is returned.
  virtual absl::StatusOr<WindowData> Drain(bool final) = 0;
  virtual BpfCounters Counters() const = 0;
};

// Gauges of the BPF maps (entries), read at each drain (agent/collect/collector.h).
using BpfMapStats = collect::MapStats;

class BpfPrograms : public WindowSource {
 public:
  struct Options {
    int frequency_hz = 19;
    std::vector<uint32_t> tgids;  // empty: all processes
    absl::Duration collect_interval = absl::Seconds(15);  // sizes the maps
    bool sched = true;    // load sched.bpf.o: parallelism (latency) and exact on-CPU time
    bool offcpu = true;   // also track off-CPU intervals (off_cpu, wall); needs sched
    uint64_t min_offcpu_ns = 0;
    // Off-CPU stack captures per second per thread before stacks are sampled (bpf/abi.h,
    // PS_RATE_PERIOD_NS); 0 captures every switch-out.
    uint32_t offcpu_stack_rate = 0;
    // Off-CPU stack captures per second per CPU, over all its threads, before they are sampled
    // (bpf/abi.h, PS_BUDGET_EXACT_OFFCPU_NS); 0: no budget.
    uint32_t offcpu_stack_budget = 0;
    // CPU time its off-CPU stack captures may take per second per CPU, ns, before they are
    // sampled (bpf/abi.h, the budget in CPU time); 0: no limit in time.
    uint64_t offcpu_stack_cpu_ns = 0;
    // Arguments of the sched_switch tracepoint to build for: 0 reads them from the kernel's BTF
    // (agent/bpf/probe.h TracepointArgCount): 4 since Linux 5.18, which pass prev_state, else 3.
    // 3 forces the fallback that reads prev's state from its task_struct (tests use it where
    // the 4-argument form exists); 4 where the tracepoint has 3 fails to load.
    int sched_switch_args = 0;
    // Where sched_switch keeps per-thread off-CPU state (bpf/sched.bpf.c): false uses task
    // storage where the kernel's BTF shows tracing programs can (task_struct::bpf_storage,
    // Linux 5.13+), else the ps_threads hash; true forces the hash (tests cover both paths).
    bool thread_state_hash = false;
    // Bytes of BPF array memory for unwind table rows (bpf/abi.h struct ps_unwind_row, 16
    // bytes each); allocated at load, charged to the agent's memory cgroup.
    uint64_t unwind_table_bytes = uint64_t{PS_UNWIND_ROW_ENTRIES} * sizeof(ps_unwind_row);
    // --latency-group: what shares one parallelism count (bpf/abi.h PS_GROUP_*).
    uint32_t latency_group = PS_GROUP_PROCESS;
    // Command mode (non-zero): only the process tree_root and its descendants are recorded, as
    // one tree (parallelism group PS_GROUP_TREE keyed by tree_root): a process a tracked one
    // forks joins the tree (bpf/oncpu.bpf.c ps_process_fork). `tgids` must be empty.
    uint32_t tree_root = 0;
    // Snapshotted by the unwinder's thread at each process image's first event (borrowed, must
    // outlive the BpfPrograms; may be null).
    proc::ProcessTable* processes = nullptr;
  };

  // Opens both skeletons, sizes their maps, loads them (CO-RE; tracepoints as tp_btf), fills the
  // pid filter and attaches: sched_switch first, then the sampler on every online CPU. Errors
  // carry libbpf's errno and what failed.
  static absl::StatusOr<std::unique_ptr<BpfPrograms>> Create(const Options& options);
  ~BpfPrograms() override;

  absl::StatusOr<WindowData> Drain(bool final) override;
  BpfCounters Counters() const override;
  // Removes tgid from the --pid filter (ps_pid_filter): after a target exits, a process that gets
  // its pid is not sampled.
  void StopTracking(uint32_t tgid);
  const BpfMapStats& map_stats() const { return collector_->map_stats(); }
  // Window flips whose wait for in-flight programs timed out (WaitForPrograms).
  uint64_t flip_wait_timeouts() const { return flip_wait_timeouts_.load(); }
  // Unwind tables (agent/unwind/): thread-safe.
  unwind::UnwindTableStats unwind_stats() const;

  // Cumulative run time and invocations of each loaded program (bpf_prog_info run_time_ns and
  // run_cnt; both stay 0 unless sysctl kernel.bpf_stats_enabled=1). Thread-safe (syscalls only).
  struct ProgramStats {
    std::string name;
    uint64_t run_time_ns = 0;
    uint64_t run_cnt = 0;
  };
  std::vector<ProgramStats> ProgramRunTimes() const;

  // Command mode's tree root (Options::tree_root), 0 otherwise.
  uint32_t tree_root() const { return tree_root_; }
  const std::string& event_name() const { return events_.name; }
  bool period_is_ns() const { return events_.period_is_ns; }
  size_t num_cpus() const { return events_.cpus.size(); }
  // CLOCK_MONOTONIC ns at which the first window started (attach).
  int64_t start_mono_ns() const { return window_start_ns_; }
  // How sched_switch is attached: "tp_btf" ("" without sched).
  const std::string& sched_attach_kind() const { return sched_kind_; }
  // Keys each buffer of ps_runtime<N> (exact on-CPU time per process image and window) and of
  // ps_offcpu<N> (off-CPU intervals per thread and stack) holds: PS_RUNTIME_MAP_ENTRIES and
  // PS_OFFCPU_MAP_ENTRIES preallocated, or PS_RUNTIME_MAP_ENTRIES_ON_USE and
  // PS_OFFCPU_MAP_ENTRIES_ON_USE allocated on use where the kernel allows it (Linux 6.1+,
  // LoadSched); 0 without sched.bpf.o, and 1 off-CPU key without off-CPU tracking.
  uint32_t runtime_map_entries() const { return runtime_map_entries_; }
  uint32_t offcpu_map_entries() const { return offcpu_map_entries_; }
  // Where sched_switch keeps thread states: "task_storage", "hash" ("" without off-CPU
  // tracking or sched.bpf.o).
  const std::string& thread_state_store() const { return thread_store_; }

 private:
  BpfPrograms() = default;
  absl::Status LoadSched(const Options& options);
  // Returns once every BPF program invocation that was running on any CPU when it was called
  // has finished (bpf/abi.h struct ps_progress: per-CPU depth of running programs), so nothing
  // still writes a buffer the flip just closed. Nothing migrates: CPUs outside the agent's
  // cpuset, isolated and hotplugged ones are covered alike. Programs run for microseconds; after
  // 1 s of waiting it gives up on the stragglers, counts it (flip_wait_timeouts) and logs.
  // Errors: reading ps_progress failed (bpf(2) errno).
  absl::Status WaitForPrograms();
  void Detach();
  // Runs the iter/task program `prog` once, to its end (bpf/sched.bpf.c): ps_make_states before
  // sched_switch is attached (task storage: every tracked thread alive gets an empty state), and
  // ps_seed_threads before the sampler is (every tracked process gets a parallelism entry, the
  // sampler only adds to existing ones, bpf/common.bpf.h; with off-CPU tracking, threads
  // off-CPU since before attach get a seeded state). Failures are logged as `what` and survived:
  // the threads concerned are then accounted from their next switch (hash), or from the next
  // window's read of the states (task storage, ps_dump_threads), their switch-outs until then
  // counted as dropped.
  void RunIterator(bpf_program* prog, const char* what);
  // The map reader and collector over the loaded maps (after LoadSched, when sched).
  // Errors: attaching the thread state iterator failed (libbpf errno).
  absl::Status CreateCollector(const Options& options);

  // Loads the unwind tables of the processes to profile and starts the
  // table service (before the sampler is attached, so their first samples unwind).
  absl::Status StartUnwinder(const Options& options);

  std::unique_ptr<unwind::UnwindService> unwinder_;
  struct ring_buffer* unwind_events_ = nullptr;
  int unwind_wake_fd_ = -1;   // eventfd: wakes the unwinder's poll thread (Stop)
  int unwind_epoll_fd_ = -1;  // the ring buffer's epoll fd and unwind_wake_fd_
  std::unique_ptr<const std::function<void(const ps_unwind_event&)>*> unwind_events_slot_;
  oncpu_bpf* oncpu_ = nullptr;
  bpf_program* sampler_ = nullptr;  // the perf_event program loaded: ps_on_cpu_sample[_vma]
  sched_bpf* sched_ = nullptr;
  std::string sched_kind_;
  std::string thread_store_;
  bpf_link* thread_dump_link_ = nullptr;  // ps_dump_threads (task storage), read per drain
  uint32_t runtime_map_entries_ = 0;
  uint32_t offcpu_map_entries_ = 0;
  uint32_t tree_root_ = 0;
  SamplingEvents events_;
  std::vector<bpf_link*> links_;
  ps_control* control_ = nullptr;  // mmap'ed ps_control
  uint32_t active_ = 0;
  int64_t window_start_ns_ = 0;
  // Drain and window-boundary attribution (agent/collect/); the collector reads through
  // map_reader_, which borrows the skeletons' map fds.
  std::unique_ptr<BpfMapReader> map_reader_;
  std::unique_ptr<collect::Collector> collector_;
  std::atomic<uint64_t> flip_wait_timeouts_{0};  // read by /metrics on the HTTP thread
};

}  // namespace parascope
