// The BPF side of parascope: bpf/oncpu.bpf.c (perf_event sampler on every online CPU) and,
// when off-CPU, wall or latency profiles are wanted, bpf/sched.bpf.c (sched_switch), sharing
// their maps; and the per-window drain of their double-buffered aggregates.
#pragma once

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/bpf/perf_event.h"
#include "agent/collect/records.h"
#include "agent/unwind/unwind_tables.h"
#include "bpf/abi.h"

struct oncpu_bpf;
struct sched_bpf;
struct bpf_link;
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

// Gauges of the BPF maps (entries), read at each drain.
struct BpfMapStats {
  uint64_t thread_states = 0;      // ps_threads entries after the last drain
  uint64_t thread_states_max = 0;  // maximum over drains
  uint64_t stack_cache = 0;        // stacks kept by the daemon across windows
  uint64_t stack_cache_evicted = 0;
  uint64_t stacks_missing = 0;     // referenced stacks found nowhere ([unknown] frames)
};

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
    // Arguments of the sched_switch tracepoint to build for: 0 reads them from the kernel's BTF
    // (agent/bpf/probe.h TracepointArgCount): 4 since Linux 5.18, which pass prev_state, else 3.
    // 3 forces the fallback that reads prev's state from its task_struct (tests use it where
    // the 4-argument form exists); 4 where the tracepoint has 3 fails to load.
    int sched_switch_args = 0;
    // Bytes of BPF array memory for unwind table rows (bpf/abi.h struct ps_unwind_row, 16
    // bytes each); allocated at load, charged to the agent's memory cgroup.
    uint64_t unwind_table_bytes = uint64_t{PS_UNWIND_ROW_ENTRIES} * sizeof(ps_unwind_row);
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
  const BpfMapStats& map_stats() const { return map_stats_; }
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

  const std::string& event_name() const { return events_.name; }
  bool period_is_ns() const { return events_.period_is_ns; }
  size_t num_cpus() const { return events_.cpus.size(); }
  // CLOCK_MONOTONIC ns at which the first window started (attach).
  int64_t start_mono_ns() const { return window_start_ns_; }
  // How sched_switch is attached: "tp_btf" ("" without sched).
  const std::string& sched_attach_kind() const { return sched_kind_; }

 private:
  BpfPrograms() = default;
  absl::Status LoadSched(const Options& options);
  // Returns once every CPU in events_.cpus has run the calling thread, i.e. once every BPF
  // program invocation that started before the call has finished (they run with preemption
  // disabled: perf_event programs in IRQ/NMI context, tracepoints under the runqueue lock).
  absl::Status WaitForCpus();
  void Detach();
  // Runs ps_seed_threads (iter/task) once, before the sampler is attached: every tracked process
  // gets a parallelism entry (the sampler only adds to existing ones, bpf/common.bpf.h) and, with
  // off-CPU tracking, threads off-CPU at attach get a thread state.
  void SeedSleepingThreads();
  // Reads and empties buffer `index` (no program may be writing it) into *out.
  void DrainBuffer(uint32_t index, WindowData* out);
  // Attributes the parts of intervals crossing [prev_ws, ws) that BPF left to the daemon.
  // `on_cpu`: tid -> since when ScanCpus saw it on a CPU (ktime ns), for threads whose switch-in
  // the tracepoint did not report (their state still says off-CPU; bpf/abi.h).
  void ScanThreads(int64_t prev_ws, int64_t ws, const absl::flat_hash_map<uint32_t, uint64_t>& on_cpu,
                   WindowData* out);
  // Adds the on-CPU time of the tasks running at the boundary; fills *on_cpu.
  void ScanCpus(int64_t prev_ws, int64_t ws, absl::flat_hash_map<uint32_t, uint64_t>* on_cpu,
                WindowData* out);
  // Fills *pair from the stack cache; marks the stacks used in this window.
  void ResolveStacks(uint64_t kernel_stack, int32_t kernel_err, uint64_t user_stack,
                     int32_t user_err, StackPair* pair);

  // Loads the unwind tables of the processes to profile and starts the
  // table service (before the sampler is attached, so their first samples unwind).
  absl::Status StartUnwinder(const Options& options);

  std::unique_ptr<unwind::UnwindService> unwinder_;
  struct ring_buffer* unwind_events_ = nullptr;
  std::unique_ptr<const std::function<void(const ps_unwind_event&)>*> unwind_events_slot_;
  oncpu_bpf* oncpu_ = nullptr;
  sched_bpf* sched_ = nullptr;
  std::string sched_kind_;
  SamplingEvents events_;
  std::vector<bpf_link*> links_;
  ps_control* control_ = nullptr;  // mmap'ed ps_control
  uint32_t active_ = 0;
  int64_t window_start_ns_ = 0;
  uint64_t min_offcpu_ns_ = 0;
  uint64_t window_index_ = 0;
  // Stacks by hash, kept across windows: an off-CPU interval can end windows after the stack
  // captured at its start was drained. Entries unused for two windows are dropped; at most
  // kMaxCachedStacks.
  struct CachedStack {
    std::vector<uint64_t> ips;
    uint32_t flags = 0;  // ps_stack.flags (user stacks: PS_UNWIND_*)
    uint64_t last_used_window = 0;
  };
  absl::flat_hash_map<uint64_t, CachedStack> stack_cache_;
  BpfMapStats map_stats_;
  static constexpr size_t kMaxCachedStacks = 65536;
};

}  // namespace parascope
