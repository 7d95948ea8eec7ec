#include "agent/agent.h"

#include <malloc.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/bpf/libbpf_log.h"
#include "agent/bpf/probe.h"
#include "agent/bpf/programs.h"
#include "agent/collect/window_clock.h"
#include "agent/export/file_exporter.h"
#include "agent/export/labels.h"
#include "agent/export/pyroscope_exporter.h"
#include "agent/k8s/metadata.h"
#include "agent/k8s/pod_watcher.h"
#include "agent/k8s/pods.h"
#include "agent/proc/command.h"
#include "agent/proc/process_table.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/proc/targets.h"
#include "agent/profile/pprof_builder.h"
#include "agent/profile/profile_set.h"
#include "agent/profile/summary.h"
#include "agent/server/http_server.h"
#include "agent/server/metric_names.h"
#include "agent/server/metrics.h"
#include "agent/symbolize/debuginfod.h"
#include "agent/symbolize/elf_cache.h"
#include "agent/symbolize/kallsyms.h"
#include "agent/symbolize/stack_symbolizer.h"
#include "agent/util/capabilities.h"
#include "agent/util/log.h"
#include "agent/util/sd_notify.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

enum class Wake { kDeadline, kSignal, kTargetsExited };

// Waits until the monotonic deadline, a stop signal (HandledSignals(), read from `signal_fd`, a
// signalfd(2); SIGHUP is logged and waited past), or the exit of the last --pid target (its pidfd becomes readable).
// Exited targets are removed from the BPF pid filter as they are seen.
Wake WaitForWake(int64_t deadline_ns, int signal_fd, proc::TargetProcesses* targets,
                 BpfPrograms* bpf, signalfd_siginfo* got) {
  for (;;) {
    if (!targets->empty()) {
      for (uint32_t tgid : targets->ReapExited()) {
        bpf->StopTracking(tgid);
        Log(LogLevel::kInfo, "target %d exited", tgid);
      }
      if (targets->all_exited()) {
        Log(LogLevel::kInfo, "every target exited: flushing the current window");
        return Wake::kTargetsExited;
      }
    }
    int64_t left = deadline_ns - MonotonicNowNs();
    if (left <= 0) return Wake::kDeadline;
    std::vector<pollfd> fds{{signal_fd, POLLIN, 0}};
    for (int fd : targets->live_fds()) fds.push_back({fd, POLLIN, 0});
    const int timeout_ms = static_cast<int>(std::min<int64_t>((left + 999999) / 1000000, 1 << 30));
    int n = poll(fds.data(), fds.size(), timeout_ms);
    if (n <= 0) continue;  // timeout or EINTR: re-check the deadline
    if (fds[0].revents & POLLIN) {
      signalfd_siginfo si{};
      if (read(signal_fd, &si, sizeof(si)) == sizeof(si)) {
        if (si.ssi_signo == SIGHUP) {
          Log(LogLevel::kInfo,
              "received SIGHUP: ignored (the configuration is read only at start; restart the "
              "agent to apply a changed --config)");
          continue;
        }
        Log(LogLevel::kInfo, "received %s: flushing the current window",
            strsignal(static_cast<int>(si.ssi_signo)));
        (void)SdNotify("STOPPING=1");
        *got = si;
        return Wake::kSignal;
      }
    }
  }
}

std::string EnabledProfiles(const ProfileTypes& t) {
  std::vector<std::string> names;
  for (int i = 0; i < kNumProfileTypes; ++i) {
    if (t.enabled[i]) names.push_back(ProfileTypeName(static_cast<ProfileType>(i)));
  }
  return absl::StrJoin(names, ",");
}

// CPU time of the calling thread (ns), CLOCK_THREAD_CPUTIME_ID (clock_gettime(2)).
int64_t ThreadCpuNs() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}

// Reports the BPF counters, map gauges and program run times at scrape time, and the per-window
// figures of the (single-threaded) pipeline through counters advanced once per window.
class AgentMetrics {
 public:
  AgentMetrics(server::MetricsRegistry* registry, const BpfPrograms* bpf)
      : registry_(registry), bpf_(bpf) {
    namespace mn = server::metric_names;
    using server::CallbackSample;
    using server::MetricType;
    AddBpfCounter("parascope_bpf_samples_taken_total",
                  "On-CPU samples the BPF program recorded (non-idle, not filtered out).",
                  PS_CTR_SAMPLES);
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, mn::kSamplesLost,
        "On-CPU samples lost or degraded in the kernel, by reason.", {"reason"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"map_full"}, static_cast<double>(c[PS_CTR_AGG_MAP_FULL])},
              {{"stack_map_full"}, static_cast<double>(c[PS_CTR_STACK_MAP_FULL])},
              {{"stack_fault"}, static_cast<double>(c[PS_CTR_USER_STACK_FAULT] +
                                                    c[PS_CTR_KERNEL_STACK_FAULT])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_bpf_events_dropped_total",
        "Scheduler events whose accounting was dropped because a BPF map was full (or, for a "
        "map allocated on use, no element could be allocated), by map; for threads in task "
        "storage, switch-outs of a thread that had no state yet (made when a task is created, at "
        "attach, and for any thread still without one at the next window).",
        {"map"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"threads"}, static_cast<double>(c[PS_CTR_THREAD_MAP_FULL])},
              {{"offcpu"}, static_cast<double>(c[PS_CTR_OFFCPU_MAP_FULL])},
              {{"running"}, static_cast<double>(c[PS_CTR_RUNNING_MAP_FULL])},
              {{"runtime"}, static_cast<double>(c[PS_CTR_RUNTIME_MAP_FULL])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kGauge, "parascope_bpf_map_max_entries",
        "Keys a buffer of a per-window BPF map holds before its inserts are dropped "
        "(parascope_bpf_events_dropped_total), by map: allocated on use where the kernel allows "
        "it (Linux 6.1+), else preallocated and smaller.",
        {"map"}, [this] {
          std::vector<CallbackSample> out;  // none without sched.bpf.o
          if (bpf_->runtime_map_entries() != 0) {
            out.push_back({{"offcpu"}, static_cast<double>(bpf_->offcpu_map_entries())});
            out.push_back({{"runtime"}, static_cast<double>(bpf_->runtime_map_entries())});
          }
          return out;
        }));
    AddBpfCounter(
        "parascope_bpf_map_busy_total",
        "BPF map inserts that found the map's bucket lock held on their CPU (-EBUSY, Linux "
        "5.11+): the sample, interval or stack is lost as with a full map, but the map is not "
        "full (bpf/common.bpf.h).",
        PS_CTR_MAP_BUSY);
    AddBpfCounter(
        "parascope_parallelism_uncounted_total",
        "Tasks not counted in parallelism: found by an on-CPU sample switched in unseen while "
        "their process had no parallelism entry (the sampler creates none: it may run in NMI "
        "context; the task counts from its next switch-in), or switched in while their "
        "process was exiting.",
        PS_CTR_RUNNING_UNCOUNTED);
    regs_.push_back(registry->AddCallback(
        MetricType::kGauge, "parascope_parallelism_groups",
        "Parallelism counts the kernel holds (--latency-group: one per live process, live "
        "cgroup or command tree; bpf/abi.h PS_GROUP_*).",
        {}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{}, static_cast<double>(c[PS_CTR_GROUPS_MADE]) -
                       static_cast<double>(c[PS_CTR_GROUPS_RELEASED])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_parallelism_group_events_total",
        "Parallelism counts the kernel made (a group's first switch-in) and released (its "
        "process's last thread exited, its cgroup was removed).",
        {"event"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"made"}, static_cast<double>(c[PS_CTR_GROUPS_MADE])},
              {{"released"}, static_cast<double>(c[PS_CTR_GROUPS_RELEASED])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kGauge, "parascope_tree_processes",
        "Command mode: live processes of the command's tree (the command and its descendants) "
        "the kernel tracks; 0 otherwise.",
        {}, [this] {
          BpfCounters c = bpf_->Counters();
          double n = bpf_->tree_root() != 0 ? 1.0 + static_cast<double>(c[PS_CTR_TREE_JOINED]) -
                                                  static_cast<double>(c[PS_CTR_TREE_LEFT])
                                            : 0.0;
          return std::vector<CallbackSample>{{{}, n}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_tree_forks_total",
        "Command mode: processes forked in the command's tree, by outcome: followed (joined the "
        "tree) or lost (the tree's map of PS_TREE_ENTRIES live processes was full: not "
        "profiled).",
        {"outcome"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"followed"}, static_cast<double>(c[PS_CTR_TREE_JOINED])},
              {{"lost"}, static_cast<double>(c[PS_CTR_TREE_FULL])}};
        }));
    AddBpfCounter("parascope_sched_switches_total", "sched_switch events traced.", PS_CTR_SWITCHES);
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_sched_switches_unseen_total",
        "Context switches the sched_switch tracepoint did not report, by how they were found: "
        "chain (a switch's prev was not the task the CPU's previous switch brought in) or "
        "sample (a sample's task was never switched in). Parallelism is repaired at detection; "
        "on-CPU and off-CPU times around such a switch are estimated (bpf/abi.h).",
        {"detected_by"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"chain"}, static_cast<double>(c[PS_CTR_SWITCH_CHAIN_BREAKS])},
              {{"sample"}, static_cast<double>(c[PS_CTR_SAMPLE_REPAIRS])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_offcpu_stack_sampling_total",
        "Off-CPU stack sampling: switch-outs whose stacks were not captured for the thread's "
        "rate (not_captured, --off-cpu-stack-rate) or for the CPU's budget (over_budget, "
        "--off-cpu-stack-budget and --off-cpu-stack-cpu-budget), and captured intervals counted "
        "more than once to stand for "
        "them (weighted).",
        {"event"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"not_captured"}, static_cast<double>(c[PS_CTR_OFFCPU_NOT_CAPTURED])},
              {{"over_budget"}, static_cast<double>(c[PS_CTR_OFFCPU_OVER_BUDGET])},
              {{"weighted"}, static_cast<double>(c[PS_CTR_OFFCPU_WEIGHTED])}};
        }));
    AddBpfCounter(
        "parascope_offcpu_stack_captures_total",
        "Switch-outs whose off-CPU stacks sched_switch captured (a kernel stack and a user walk "
        "or memo hit each).",
        PS_CTR_OFFCPU_CAPTURES);
    AddBpfCounter(
        "parascope_offcpu_stack_capture_seconds_total",
        "CPU time of those captures, all CPUs (the clock read before and after each, in the "
        "switching thread's context); --off-cpu-stack-cpu-budget bounds it per CPU.",
        PS_CTR_OFFCPU_CAPTURE_NS, 1e-9);
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_unwind_stacks_total",
        "User stacks walked by the BPF unwinder, by outcome: complete (reached the outermost "
        "frame), truncated (127 frames and more remained), or stopped early: no_table_yet (the "
        "process or file had no table loaded yet; frame pointers used), no_table_for_pc (JIT "
        "or code without CFI, and no frame pointer), read_fault (stack memory unreadable), "
        "bad_frame (an impossible frame).",
        {"outcome"}, [this] {
          BpfCounters c = bpf_->Counters();
          return std::vector<CallbackSample>{
              {{"complete"}, static_cast<double>(c[PS_CTR_UNWIND_COMPLETE])},
              {{"truncated"}, static_cast<double>(c[PS_CTR_UNWIND_TRUNCATED])},
              {{"no_table_yet"}, static_cast<double>(c[PS_CTR_UNWIND_NO_TABLE_YET])},
              {{"no_table_for_pc"}, static_cast<double>(c[PS_CTR_UNWIND_NO_TABLE_PC])},
              {{"read_fault"}, static_cast<double>(c[PS_CTR_UNWIND_READ_FAULT])},
              {{"bad_frame"}, static_cast<double>(c[PS_CTR_UNWIND_BAD_FRAME])}};
        }));
    AddBpfCounter("parascope_unwind_memo_hits_total",
                  "Switch-outs whose user stack was the thread's previous walk, reused because its "
                  "starting registers and every stack word it read were unchanged (bpf/abi.h "
                  "ps_user_memo); not counted in parascope_unwind_stacks_total.",
                  PS_CTR_UNWIND_MEMO_HITS);
    AddBpfCounter(
        "parascope_unwind_frame_pointer_frames_total",
        "Frames the unwinder found by the frame-pointer fallback (no table for their pc).",
        PS_CTR_UNWIND_FP_FRAMES);
    AddBpfCounter(
        "parascope_unwind_vma_frames_total",
        "Frames unwound through the table of the file their vma maps (bpf_find_vma, Linux "
        "5.17+): pcs in a mapping the process's list lacked yet (a library mapped a moment ago, "
        "a process not read yet).",
        PS_CTR_UNWIND_VMA_FRAMES);
    AddBpfCounter(
        "parascope_unwind_vma_cache_full_total",
        "Execs whose image got no vma cache entry (the map of PS_UNWIND_PROC_ENTRIES was "
        "full): until the daemon loads its maps, each of its walks finds one unlisted file.",
        PS_CTR_UNWIND_VMA_CACHE_FULL);
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_window_flip_wait_timeouts_total",
        "Window flips that drained a buffer after waiting 1 s for BPF programs still running "
        "on some CPU (should stay 0).",
        {}, [this] {
          return std::vector<CallbackSample>{
              {{}, static_cast<double>(bpf_->flip_wait_timeouts())}};
        }));
    auto unwind_scalar = [&](MetricType type, const char* name, const char* help,
                             std::function<double(const unwind::UnwindTableStats&)> f) {
      regs_.push_back(registry->AddCallback(type, name, help, {}, [this, f] {
        return std::vector<CallbackSample>{{{}, f(bpf_->unwind_stats())}};
      }));
    };
    unwind_scalar(MetricType::kGauge, "parascope_unwind_table_bytes",
                  "BPF memory used by unwind table rows, in bytes.",
                  [](const auto& s) { return static_cast<double>(s.table_bytes); });
    unwind_scalar(MetricType::kGauge, "parascope_unwind_table_budget_bytes",
                  "BPF memory reserved for unwind table rows (--unwind-table-bytes), in bytes.",
                  [](const auto& s) { return static_cast<double>(s.table_budget_bytes); });
    unwind_scalar(MetricType::kGauge, "parascope_unwind_tables",
                  "Unwind tables loaded (one per distinct file).",
                  [](const auto& s) { return static_cast<double>(s.tables); });
    unwind_scalar(MetricType::kGauge, "parascope_unwind_processes",
                  "Processes whose mappings the unwinder knows.",
                  [](const auto& s) { return static_cast<double>(s.processes); });
    unwind_scalar(MetricType::kCounter, "parascope_unwind_tables_built_total",
                  "Unwind tables built from .eh_frame/.debug_frame.",
                  [](const auto& s) { return static_cast<double>(s.tables_built); });
    unwind_scalar(MetricType::kCounter, "parascope_unwind_tables_evicted_total",
                  "Unwind tables no live process used, evicted to make room (LRU).",
                  [](const auto& s) { return static_cast<double>(s.tables_evicted); });
    unwind_scalar(MetricType::kCounter, "parascope_unwind_process_loads_total",
                  "Mapping lists written for processes (first loads, exec, new libraries).",
                  [](const auto& s) { return static_cast<double>(s.process_loads); });
    unwind_scalar(MetricType::kCounter, "parascope_process_snapshots_shed_total",
                  "New process images (an exec, a process first met by the unwinder) not read "
                  "(mappings snapshot and unwind table load) because that work had spent its CPU "
                  "budget (50 ms, refilled at 2% of a core); read later if they live and are "
                  "sampled.",
                  [](const auto& s) { return static_cast<double>(s.exec_snapshots_shed); });
    unwind_scalar(MetricType::kCounter, "parascope_process_snapshot_work_seconds_total",
                  "CPU time spent reading new process images and loading their unwind tables, "
                  "in seconds (what that budget paid): the whole of the unwinder threads' rounds "
                  "that handled new images, wake-ups included.",
                  [](const auto& s) { return s.exec_snapshot_cpu_ns / 1e9; });
    unwind_scalar(MetricType::kCounter, "parascope_process_snapshot_work_forgiven_seconds_total",
                  "Of parascope_process_snapshot_work_seconds_total, the CPU time the budget did "
                  "not charge: its debt stops at one burst (50 ms), so a single expensive load "
                  "(a big new file's unwind table) does not shed new images for more than 2.5 "
                  "s after it. What new-image work cost beyond the budget's rate, in seconds.",
                  [](const auto& s) { return s.exec_forgiven_cpu_ns / 1e9; });
    unwind_scalar(MetricType::kCounter, "parascope_process_snapshot_work_capped_seconds_total",
                  "Of parascope_process_snapshot_work_seconds_total, the CPU time the budget did "
                  "not charge because a single snapshot or round of new-image work measured "
                  "more than its cap (20 ms; a table build 20 ms plus 400 ns a built row): on a "
                  "VM the thread clock also counts time the host took the vCPU away, and one such "
                  "stall would shed new images for seconds. In seconds.",
                  [](const auto& s) { return s.exec_capped_cpu_ns / 1e9; });
    unwind_scalar(MetricType::kCounter, "parascope_unwind_table_build_seconds_total",
                  "Time spent building unwind tables, in seconds.",
                  [](const auto& s) { return s.build_ns / 1e9; });
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_unwind_table_failures_total",
        "Executable files or processes left to frame pointers, by reason: no_cfi (no "
        ".eh_frame/.debug_frame), unreadable (cannot open or parse), budget_full (no room in "
        "--unwind-table-bytes), mappings_full (mapping slots exhausted), process_gone (exited "
        "before or while being read), requests_lost (ring buffer full).",
        {"reason"}, [this] {
          unwind::UnwindTableStats s = bpf_->unwind_stats();
          return std::vector<CallbackSample>{
              {{"no_cfi"}, static_cast<double>(s.no_cfi)},
              {{"unreadable"}, static_cast<double>(s.unreadable)},
              {{"budget_full"}, static_cast<double>(s.budget_full)},
              {{"mappings_full"}, static_cast<double>(s.mappings_full)},
              {{"process_gone"}, static_cast<double>(s.process_gone)},
              {{"requests_lost"},
               static_cast<double>(bpf_->Counters()[PS_CTR_UNWIND_EVENTS_LOST])}};
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, mn::kBpfRunTime,
        "Run time of each BPF program (needs sysctl kernel.bpf_stats_enabled=1).", {"program"},
        [this] {
          std::vector<CallbackSample> out;
          for (const auto& p : bpf_->ProgramRunTimes()) {
            out.push_back({{p.name}, p.run_time_ns / 1e9});
          }
          return out;
        }));
    regs_.push_back(registry->AddCallback(
        MetricType::kCounter, "parascope_bpf_run_count_total",
        "Invocations of each BPF program (needs sysctl kernel.bpf_stats_enabled=1).",
        {"program"}, [this] {
          std::vector<CallbackSample> out;
          for (const auto& p : bpf_->ProgramRunTimes()) {
            out.push_back({{p.name}, static_cast<double>(p.run_cnt)});
          }
          return out;
        }));
    samples_ = &registry->GetCounter(mn::kSamples, "On-CPU samples placed in profiles.");
    parallelism_unknown_ = &registry->GetCounter(
        "parascope_samples_parallelism_unknown_total",
        "Samples taken before every CPU's task was known (attached mid-run).");
    offcpu_ns_ = &registry->GetCounter("parascope_offcpu_seconds_total",
                                       "Off-CPU time placed in profiles, in seconds.");
    stacks_lost_ = &registry->GetCounterFamily(
        "parascope_stacks_degraded_total",
        "Samples or intervals whose stack is shown with a synthetic frame, by reason.",
        {"reason"});
    symbolization_misses_ = &registry->GetCounterFamily(
        mn::kSymbolizationMisses, "Frames that could not be symbolized, by reason.", {"reason"});
    profiles_written_ = &registry->GetCounter(
        mn::kProfilesWritten,
        "Profiles written by the file exporter (merged into overflow/ files included: "
        "parascope_output_merged_profiles_total).");
    export_errors_ = &registry->GetCounter("parascope_export_errors_total",
                                           "Profiles an exporter failed to accept.");
    processes_ = &registry->GetGauge(mn::kProcessesTracked, "Processes in the process table.");
    thread_states_ = &registry->GetGauge(
        "parascope_thread_states",
        "Threads with an off-CPU tracking state in BPF (task storage, or the ps_threads "
        "hash on kernels without it).");
    windows_ = &registry->GetCounter("parascope_windows_total", "Collection windows closed.");
    regs_.push_back(registry->AddCallback(
        MetricType::kGauge, "parascope_window_cpu_seconds",
        "Agent CPU time spent on the last window's flush, by phase: drain (BPF maps), symbolize "
        "(symbolization and profile building), export (serialization and delivery), in seconds. "
        "symbolize and export alternate per process: their thread CPU time is split in "
        "proportion to their wall times.",
        {"phase"}, [this] {
          return std::vector<CallbackSample>{{{"drain"}, window_cpu_[0].load()},
                                             {{"symbolize"}, window_cpu_[1].load()},
                                             {{"export"}, window_cpu_[2].load()}};
        }));
    pinned_files_ = &registry->GetGauge(
        "parascope_pinned_files",
        "Mapped files the process table holds open so processes are symbolized after they exit.");
    snapshots_ = &registry->GetCounter(
        "parascope_process_snapshots_total",
        "Process images whose mappings were read while they ran (first sample, exec).");
    symbol_cache_bytes_ = &registry->GetGauge(
        "parascope_symbol_cache_bytes",
        "Bytes held by the cross-window cache of symbolized user addresses (by build id).");
    kallsyms_reloads_ = &registry->GetCounter(
        "parascope_kallsyms_reloads_total",
        "Reloads of /proc/kallsyms after modules or BPF programs were loaded or unloaded.");
    symbol_cache_evictions_ = &registry->GetCounter(
        "parascope_symbol_cache_evictions_total",
        "Symbolized addresses dropped from that cache to respect its byte bound.");
    frames_by_source_ = &registry->GetCounterFamily(
        "parascope_frames_symbolized_total",
        "User frames named from a source other than the ELF symbol table: dwarf (source lines "
        "and inlined functions), debug_symtab (a separate debug file or MiniDebugInfo), jit (a "
        "perf map).",
        {"source"});
  }

  // The last window's agent CPU (ns) in its three phases.
  void SetWindowCpu(int64_t drain_ns, int64_t build_ns, int64_t export_ns) {
    window_cpu_[0] = drain_ns / 1e9;
    window_cpu_[1] = build_ns / 1e9;
    window_cpu_[2] = export_ns / 1e9;
  }
  void UpdateProcesses(const proc::ProcessTable& t, const StackSymbolizer& symbolizer) {
    const SymbolizerStats& ss = symbolizer.stats();
    const symbolize::SymbolCache& symbols = symbolizer.symbol_cache();
    Advance(kallsyms_reloads_, symbolizer.kallsyms_reloads(), &last_kallsyms_reloads_);
    pinned_files_->Set(static_cast<double>(t.pinned_files()));
    symbol_cache_bytes_->Set(static_cast<double>(symbols.bytes()));
    Advance(symbol_cache_evictions_, symbols.evictions(), &last_symbol_evictions_);
    Advance(snapshots_, t.snapshots(), &last_snapshots_);
    Advance(&frames_by_source_->With({"dwarf"}), ss.dwarf, &last_dwarf_);
    Advance(&frames_by_source_->With({"debug_symtab"}), ss.debug_file_symbol, &last_debug_sym_);
    Advance(&frames_by_source_->With({"jit"}), ss.jit, &last_jit_);
  }

  // Called once per window from the collection thread with cumulative figures.
  void Update(const ProfileStats& ps, const SymbolizerStats& ss, const BpfMapStats& ms,
              size_t processes, uint64_t profiles_written, uint64_t export_errors) {
    Advance(samples_, ps.samples, &last_.samples);
    Advance(parallelism_unknown_, ps.samples_parallelism_unknown,
            &last_.samples_parallelism_unknown);
    uint64_t offcpu_s = ps.offcpu_ns / 1000000000;
    Advance(offcpu_ns_, offcpu_s, &last_offcpu_s_);
    Advance(&stacks_lost_->With({"user_stack_lost"}), ps.user_stack_lost, &last_.user_stack_lost);
    Advance(&stacks_lost_->With({"kernel_stack_lost"}), ps.kernel_stack_lost,
            &last_.kernel_stack_lost);
    Advance(&stacks_lost_->With({"truncated"}), ps.truncated, &last_.truncated);
    Advance(&stacks_lost_->With({"user_stack_incomplete"}), ps.user_stack_incomplete,
            &last_.user_stack_incomplete);
    Advance(&stacks_lost_->With({"stack_missing"}), ms.stacks_missing, &last_missing_);
    Advance(&symbolization_misses_->With({"no_mapping"}), ss.no_mapping, &last_ss_.no_mapping);
    Advance(&symbolization_misses_->With({"no_elf"}), ss.no_elf, &last_ss_.no_elf);
    Advance(&symbolization_misses_->With({"no_symbol"}), ss.no_symbol, &last_ss_.no_symbol);
    Advance(&symbolization_misses_->With({"kernel_no_symbol"}), ss.kernel_no_symbol,
            &last_ss_.kernel_no_symbol);
    Advance(profiles_written_, profiles_written, &last_written_);
    Advance(export_errors_, export_errors, &last_export_errors_);
    processes_->Set(static_cast<double>(processes));
    thread_states_->Set(static_cast<double>(ms.thread_states));
    windows_->Increment();
  }

 private:
  // Registers counter `name` (help text `help`) as BPF counter `idx` (bpf/abi.h PS_CTR_*, summed
  // over CPUs) times `scale` (1e-9: a counter of ns exposed in seconds).
  void AddBpfCounter(const char* name, const char* help, uint32_t idx, double scale = 1) {
    regs_.push_back(
        registry_->AddCallback(server::MetricType::kCounter, name, help, {}, [this, idx, scale] {
          return std::vector<server::CallbackSample>{
              {{}, static_cast<double>(bpf_->Counters()[idx]) * scale}};
        }));
  }

  static void Advance(server::Counter* c, uint64_t now, uint64_t* last) {
    if (now > *last) c->Increment(now - *last);
    *last = now;
  }

  server::MetricsRegistry* registry_;
  const BpfPrograms* bpf_;
  std::vector<server::CallbackRegistration> regs_;
  server::Counter *samples_, *parallelism_unknown_, *offcpu_ns_, *profiles_written_,
      *export_errors_, *windows_;
  server::CounterFamily *stacks_lost_, *symbolization_misses_;
  server::Gauge *processes_ = nullptr, *thread_states_ = nullptr, *pinned_files_ = nullptr,
                *symbol_cache_bytes_ = nullptr;
  server::Counter *snapshots_ = nullptr, *symbol_cache_evictions_ = nullptr,
                  *kallsyms_reloads_ = nullptr;
  server::CounterFamily* frames_by_source_;
  std::atomic<double> window_cpu_[3] = {0, 0, 0};
  uint64_t last_symbol_evictions_ = 0, last_kallsyms_reloads_ = 0;
  uint64_t last_snapshots_ = 0, last_dwarf_ = 0, last_debug_sym_ = 0, last_jit_ = 0;
  ProfileStats last_;
  SymbolizerStats last_ss_;
  uint64_t last_offcpu_s_ = 0, last_missing_ = 0, last_written_ = 0, last_export_errors_ = 0;
};

// Reports the push exporter's delivery figures at scrape time.
std::vector<server::CallbackRegistration> RegisterExporterMetrics(
    server::MetricsRegistry* registry, const PyroscopeExporter* exporter) {
  namespace mn = server::metric_names;
  using server::CallbackSample;
  using server::MetricType;
  std::vector<server::CallbackRegistration> regs;
  auto scalar = [&](MetricType type, const char* name, const char* help,
                    std::function<double(const PyroscopeExporter::Stats&)> f) {
    regs.push_back(registry->AddCallback(type, name, help, {}, [exporter, f] {
      return std::vector<CallbackSample>{{{}, f(exporter->GetStats())}};
    }));
  };
  scalar(MetricType::kCounter, mn::kProfilesPushed, "Profiles the remote endpoint accepted.",
         [](const auto& s) { return static_cast<double>(s.sent); });
  scalar(MetricType::kCounter, mn::kPushRetries, "Push attempts that failed and were retried.",
         [](const auto& s) { return static_cast<double>(s.retries); });
  scalar(MetricType::kGauge, mn::kQueueBytes, "Bytes waiting in the push queue.",
         [](const auto& s) { return static_cast<double>(s.queue_bytes); });
  scalar(MetricType::kCounter, "parascope_push_profiles_trimmed_total",
         "Profiles folded into [other] to fit the server's limits.",
         [](const auto& s) { return static_cast<double>(s.profiles_trimmed); });
  auto family = [&](const char* name, const char* help, const char* label,
                    std::function<const std::map<std::string, uint64_t>&(
                        const PyroscopeExporter::Stats&)> f) {
    regs.push_back(registry->AddCallback(MetricType::kCounter, name, help, {label},
                                         [exporter, f] {
                                           PyroscopeExporter::Stats s = exporter->GetStats();
                                           std::vector<CallbackSample> out;
                                           for (const auto& [k, v] : f(s)) {
                                             out.push_back({{k}, static_cast<double>(v)});
                                           }
                                           return out;
                                         }));
  };
  family(mn::kPushFailures, "Failed push attempts, by gRPC status or HTTP code.", "code",
         [](const auto& s) -> const std::map<std::string, uint64_t>& { return s.failures; });
  family(mn::kQueueDrops, "Profiles dropped before delivery, by reason.", "reason",
         [](const auto& s) -> const std::map<std::string, uint64_t>& { return s.dropped; });
  return regs;
}

}  // namespace

// Reports the debuginfod fetcher's figures at scrape time.
// --output-max-bytes / --output-max-age (export/retention.h).
std::vector<server::CallbackRegistration> RegisterRetentionMetrics(
    server::MetricsRegistry* registry, const FileExporter* files) {
  using server::CallbackSample;
  using server::MetricType;
  std::vector<server::CallbackRegistration> regs;
  regs.push_back(registry->AddCallback(
      MetricType::kGauge, "parascope_output_bytes",
      "Bytes on disk (allocated blocks) of the profile files in --output-dir.", {}, [files] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(files->retention_stats().bytes)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kGauge, "parascope_output_files", "Profile files in --output-dir.", {},
      [files] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(files->retention_stats().files)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_output_deleted_files_total",
      "Profile files deleted from --output-dir, oldest window first, by reason: max_bytes "
      "(--output-max-bytes), max_age (--output-max-age), max_files (the index bound).",
      {"reason"}, [files] {
        RetentionStats s = files->retention_stats();
        return std::vector<CallbackSample>{
            {{"max_bytes"}, static_cast<double>(s.deleted_bytes_bound)},
            {{"max_age"}, static_cast<double>(s.deleted_age)},
            {{"max_files"}, static_cast<double>(s.deleted_files_bound)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_output_deleted_bytes_total",
      "Bytes on disk freed by deleting profile files from --output-dir.", {}, [files] {
        return std::vector<CallbackSample>{
            {{}, static_cast<double>(files->retention_stats().deleted_bytes)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_output_retention_errors_total",
      "Profile files retention could not delete (unlink failed other than ENOENT).", {},
      [files] {
        return std::vector<CallbackSample>{
            {{}, static_cast<double>(files->retention_stats().errors)}};
      }));
  return regs;
}

// --output-max-new-processes (export/file_exporter.h, "Process churn").
std::vector<server::CallbackRegistration> RegisterOverflowMetrics(server::MetricsRegistry* registry,
                                                                  const FileExporter* files) {
  using server::CallbackSample;
  using server::MetricType;
  std::vector<server::CallbackRegistration> regs;
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_output_merged_processes_total",
      "Process images whose profiles went to --output-dir's overflow/ files (merged, each sample "
      "labelled with its pid) instead of a directory of their own: exited, and new past "
      "--output-max-new-processes in their window.",
      {}, [files] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(files->merged_processes())}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_output_merged_profiles_total",
      "Profiles (one per process image and type) merged into --output-dir's overflow/ files.", {},
      [files] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(files->merged_profiles())}};
      }));
  return regs;
}

// Kubernetes metadata (agent/k8s/): the API server's state and what the lookups found.
std::vector<server::CallbackRegistration> RegisterKubernetesMetrics(
    server::MetricsRegistry* registry, const k8s::PodWatcher* watcher, const k8s::PodStore* store,
    const k8s::KubernetesMetadata* metadata, const std::atomic<uint64_t>* untargeted) {
  using server::CallbackSample;
  using server::MetricType;
  std::vector<server::CallbackRegistration> regs;
  regs.push_back(registry->AddCallback(
      MetricType::kGauge, "parascope_kubernetes_api_up",
      "1 while the Kubernetes API server answers the pod list and watch, 0 while it fails "
      "(profiling goes on; pods known before keep their labels).",
      {}, [watcher] {
        return std::vector<CallbackSample>{{{}, watcher->stats().up ? 1.0 : 0.0}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_kubernetes_api_errors_total",
      "Failed Kubernetes API requests and events by reason: connect (no connection, TLS, "
      "timeout), status (HTTP status not 200), decode (not a pod list or watch event), expired "
      "(410 Gone: listed again), token (service account token unreadable).",
      {"reason"}, [watcher] {
        k8s::PodWatcherStats s = watcher->stats();
        return std::vector<CallbackSample>{
            {{"connect"}, static_cast<double>(s.errors_connect)},
            {{"status"}, static_cast<double>(s.errors_status)},
            {{"decode"}, static_cast<double>(s.errors_decode)},
            {{"expired"}, static_cast<double>(s.errors_expired)},
            {{"token"}, static_cast<double>(s.errors_token)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_kubernetes_pod_lists_total",
      "Complete lists of this node's pods stored (at start, after errors, at each resync).", {},
      [watcher] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(watcher->stats().lists)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_kubernetes_watch_events_total",
      "Pod watch events received, by type.", {"type"}, [watcher] {
        k8s::PodWatcherStats s = watcher->stats();
        return std::vector<CallbackSample>{
            {{"added"}, static_cast<double>(s.events_added)},
            {{"modified"}, static_cast<double>(s.events_modified)},
            {{"deleted"}, static_cast<double>(s.events_deleted)},
            {{"bookmark"}, static_cast<double>(s.events_bookmark)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kGauge, "parascope_kubernetes_pods", "Pods of this node known to the agent.",
      {}, [store] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(store->stats().pods)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_kubernetes_pods_dropped_total",
      "Pods not kept because the pod store was full.", {}, [store] {
        return std::vector<CallbackSample>{{{}, static_cast<double>(store->stats().dropped)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_kubernetes_lookups_total",
      "Kubernetes metadata lookups for pushed profiles' labels, by result: pod (found), "
      "pod_unknown (a pod UID the API server has not described; asked again once the pods "
      "change), not_in_pod (no pod UID and no listed container: host processes, other engines).",
      {"result"}, [metadata] {
        k8s::MetadataStats s = metadata->stats();
        return std::vector<CallbackSample>{
            {{"pod"}, static_cast<double>(s.pod)},
            {{"pod_unknown"}, static_cast<double>(s.pod_unknown)},
            {{"not_in_pod"}, static_cast<double>(s.not_in_pod)}};
      }));
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_target_excluded_processes_total",
      "Process windows left out by --target-namespaces / --target-pod-selector (not in a "
      "selected pod, or in a pod not known yet).",
      {}, [untargeted] {
        return std::vector<CallbackSample>{
            {{}, static_cast<double>(untargeted->load(std::memory_order_relaxed))}};
      }));
  return regs;
}

std::vector<server::CallbackRegistration> RegisterDebuginfodMetrics(
    server::MetricsRegistry* registry, const symbolize::Debuginfod* debuginfod) {
  using server::CallbackSample;
  using server::MetricType;
  std::vector<server::CallbackRegistration> regs;
  regs.push_back(registry->AddCallback(
      MetricType::kCounter, "parascope_debuginfod_requests_total",
      "Debug files asked of --debuginfod-urls, by result: fetched (now in the cache), not_found "
      "(no server has the build id), error (unreachable, timed out, too large), dropped (the "
      "fetch queue was full; asked again later).",
      {"result"}, [debuginfod] {
        symbolize::DebuginfodStats s = debuginfod->stats();
        return std::vector<CallbackSample>{{{"fetched"}, static_cast<double>(s.fetched)},
                                           {{"not_found"}, static_cast<double>(s.not_found)},
                                           {{"error"}, static_cast<double>(s.errors)},
                                           {{"dropped"}, static_cast<double>(s.dropped)}};
      }));
  auto scalar = [&](MetricType type, const char* name, const char* help,
                    std::function<double(const symbolize::DebuginfodStats&)> f) {
    regs.push_back(registry->AddCallback(type, name, help, {}, [debuginfod, f] {
      return std::vector<CallbackSample>{{{}, f(debuginfod->stats())}};
    }));
  };
  scalar(MetricType::kGauge, "parascope_debuginfod_cache_bytes",
         "Bytes in --debuginfod-cache-dir at the last scan (start, after each fetch).",
         [](const auto& s) { return static_cast<double>(s.cache_bytes); });
  scalar(MetricType::kCounter, "parascope_debuginfod_cache_evictions_total",
         "Debug files deleted from --debuginfod-cache-dir to stay within "
         "--debuginfod-cache-max-bytes (least recently used first).",
         [](const auto& s) { return static_cast<double>(s.evictions); });
  scalar(MetricType::kGauge, "parascope_debuginfod_queue_length",
         "Build ids waiting to be fetched from --debuginfod-urls.",
         [](const auto& s) { return static_cast<double>(s.queued); });
  return regs;
}

// parascope_thread_cpu_seconds_total{thread}: the agent's CPU time by thread name (util/
// thread_name.h; "main" for the collection thread, other names as the libraries set them, e.g.
// gRPC's), from /proc/self/task/<tid>/stat utime + stime (fields 14 and 15, clock ticks;
// proc(5)). Monotonic: each scrape adds each thread's growth since the previous one, so a thread
// that exits keeps what was counted for it (its CPU after the last scrape is not).
std::vector<server::CallbackRegistration> RegisterThreadMetrics(server::MetricsRegistry* registry) {
  using server::CallbackSample;
  struct State {
    std::mutex mu;
    absl::flat_hash_map<uint32_t, uint64_t> last_ticks;  // by tid (threads alive at the last scrape)
    std::map<std::string, uint64_t> total_ticks;         // by name
  };
  auto state = std::make_shared<State>();
  std::vector<server::CallbackRegistration> regs;
  regs.push_back(registry->AddCallback(
      server::MetricType::kCounter, "parascope_thread_cpu_seconds_total",
      "CPU time (user + system) of the agent's threads, by thread name: main (collection, "
      "symbolization, profile building, file export), ps-unwind-poll/-table/-claim (process "
      "snapshots and unwind tables), ps-push, ps-http, ps-k8s-watch, ps-debuginfod, and "
      "library threads under their own names.",
      {"thread"}, [state] {
        static const double kTicksPerSecond = static_cast<double>(sysconf(_SC_CLK_TCK));
        const uint32_t pid = static_cast<uint32_t>(getpid());
        std::lock_guard<std::mutex> l(state->mu);
        absl::flat_hash_map<uint32_t, uint64_t> now;
        std::error_code ec;
        for (const auto& e : std::filesystem::directory_iterator("/proc/self/task", ec)) {
          uint32_t tid = 0;
          if (!absl::SimpleAtoi(e.path().filename().string(), &tid)) continue;
          absl::StatusOr<std::string> stat = proc::ReadFileToString(e.path().string() + "/stat");
          if (!stat.ok()) continue;  // exited meanwhile
          const size_t open = stat->find('('), close = stat->rfind(')');
          if (open == std::string::npos || close == std::string::npos || close < open) continue;
          std::vector<absl::string_view> f =
              absl::StrSplit(absl::string_view(*stat).substr(close + 1), ' ', absl::SkipEmpty());
          uint64_t utime = 0, stime = 0;
          if (f.size() < 13 || !absl::SimpleAtoi(f[11], &utime) ||
              !absl::SimpleAtoi(f[12], &stime)) {
            continue;
          }
          const std::string name =
              tid == pid ? std::string("main") : stat->substr(open + 1, close - open - 1);
          const uint64_t ticks = utime + stime;
          auto it = state->last_ticks.find(tid);
          const uint64_t before = it == state->last_ticks.end() ? 0 : it->second;
          state->total_ticks[name] += ticks > before ? ticks - before : 0;
          now[tid] = ticks;
        }
        state->last_ticks = std::move(now);
        std::vector<CallbackSample> out;
        out.reserve(state->total_ticks.size());
        for (const auto& [name, ticks] : state->total_ticks) {
          out.push_back({{name}, static_cast<double>(ticks) / kTicksPerSecond});
        }
        return out;
      }));
  return regs;
}

sigset_t HandledSignals() {
  sigset_t set;
  sigemptyset(&set);
  for (int sig : {SIGINT, SIGTERM, SIGQUIT, SIGUSR1, SIGUSR2, SIGHUP}) sigaddset(&set, sig);
  return set;
}

namespace {

// The cgroup v2 path of process `tgid` (the "0::" line of /proc/<tgid>/cgroup, man 7 cgroups), or
// "" when it cannot be read (the process exited).
std::string CgroupV2Path(uint32_t tgid) {
  auto text = proc::ReadFileToString(absl::StrCat("/proc/", tgid, "/cgroup"));
  if (!text.ok()) return "";
  for (absl::string_view line : absl::StrSplit(*text, '\n')) {
    if (absl::StartsWith(line, "0::")) return std::string(line.substr(3));
  }
  return "";
}

// The exit status a shell gives a command that could not be run: 127 not found, 126 found but
// not executable (POSIX "Command Search and Execution").
int CannotRunStatus(const absl::Status& s) {
  return s.code() == absl::StatusCode::kNotFound ? 127 : 126;
}

// Command mode, after profiling stopped before the command exited: blocks until it exits (its
// pidfd is readable), passing on every signal sent to the agent alone (kill(2); a terminal's
// signals reach the command's process group themselves, SI_KERNEL).
void WaitForCommand(proc::Command* command, int signal_fd) {
  if (command->pidfd() < 0) return;  // Reap() blocks instead
  for (;;) {
    pollfd fds[2] = {{command->pidfd(), POLLIN, 0}, {signal_fd, POLLIN, 0}};
    int n = poll(fds, 2, -1);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 || (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) != 0) return;
    if (fds[1].revents & POLLIN) {
      signalfd_siginfo si{};
      if (read(signal_fd, &si, sizeof(si)) == sizeof(si) && si.ssi_code != SI_KERNEL) {
        Log(LogLevel::kInfo, "received %s: passed on to the command",
            strsignal(static_cast<int>(si.ssi_signo)));
        command->Signal(static_cast<int>(si.ssi_signo));
      }
    }
  }
}

}  // namespace

absl::Status RunAgent(const Config& config, int* exit_status) {
  *exit_status = 0;
  InstallLibbpfLogger();
  PS_RETURN_IF_ERROR(CheckAgentCapabilities());
  PS_RETURN_IF_ERROR(ProbeBpfEnvironment());
  // Command mode: the command's process first, while the agent has one thread (fork); it waits
  // until the programs are attached and it is in the tree.
  std::unique_ptr<proc::Command> command;
  if (!config.command.empty()) {
    auto started = proc::Command::Start(config.command);
    if (!started.ok()) {
      *exit_status = CannotRunStatus(started.status());
      return started.status();
    }
    command = *std::move(started);
  }
  std::vector<uint32_t> pinned = config.pids;
  if (command != nullptr) pinned = {static_cast<uint32_t>(command->pid())};
  // The --pid targets' (or the command's) identities, fixed now: a pid that does not exist is an
  // error, and a process that later gets a target's pid is never profiled.
  PS_ASSIGN_OR_RETURN(proc::TargetProcesses targets, proc::TargetProcesses::Pin(pinned));
  // The tree's profiles are reported under its root, the command's process (its exec id is
  // taken from its records: it changes at the exec of CMD).
  ProfileOwner tree_owner;
  if (command != nullptr) {
    PS_ASSIGN_OR_RETURN(std::string stat_text,
                        proc::ReadFileToString(absl::StrCat("/proc/", command->pid(), "/stat")));
    PS_ASSIGN_OR_RETURN(proc::ProcStat st, proc::ParseStat(stat_text));
    tree_owner.process = {static_cast<uint32_t>(command->pid()),
                          proc::TicksToNs(st.start_time_ticks), 0};
    tree_owner.group.kind = ProfileGroup::Kind::kTree;
    tree_owner.group.id = static_cast<uint64_t>(command->pid());
    tree_owner.group.latency_group =
        config.latency_group == Config::LatencyGroup::kTree     ? "tree"
        : config.latency_group == Config::LatencyGroup::kCgroup ? "cgroup"
                                                                : "process";
  }
  if (config.latency_group == Config::LatencyGroup::kCgroup &&
      access("/proc/self/cgroup", R_OK) == 0 && CgroupV2Path(getpid()).empty()) {
    return absl::FailedPreconditionError(
        "--latency-group=cgroup needs cgroup v2: /proc/self/cgroup has no \"0::\" line (mount "
        "cgroup2, e.g. the unified hierarchy of systemd)");
  }
  // HandledSignals() are blocked in every thread (main.cc); the window loop reads them here.
  const sigset_t handled = HandledSignals();
  const int signal_fd = signalfd(-1, &handled, SFD_CLOEXEC);
  if (signal_fd < 0) return ErrnoStatus(errno, "signalfd");
  struct CloseFd {
    int fd;
    ~CloseFd() { close(fd); }
  } close_signal_fd{signal_fd};

  // debuginfod first: it sets libdebuginfod's environment variables, safe only while no other
  // thread runs (symbolize/debuginfod.h). Never with --symbolize=server (Validate).
  std::unique_ptr<symbolize::Debuginfod> debuginfod;
  if (!config.debuginfod_urls.empty()) {
    symbolize::DebuginfodOptions dopts;
    dopts.urls = config.debuginfod_urls;
    dopts.cache_dir = config.debuginfod_cache_dir;
    dopts.cache_max_bytes = config.debuginfod_cache_max_bytes;
    auto created = symbolize::Debuginfod::Create(dopts);
    if (!created.ok()) {
      return absl::Status(created.status().code(),
                          absl::StrCat("debuginfod: ", created.status().message()));
    }
    debuginfod = *std::move(created);
    Log(LogLevel::kInfo, "debuginfod: fetching missing debug files from %s into %s (at most %d bytes)",
        absl::StrJoin(config.debuginfod_urls, " "), config.debuginfod_cache_dir,
        config.debuginfod_cache_max_bytes);
  }

  // Kubernetes metadata: the store and lookups now, the watcher once attached (its thread then
  // starts without the capabilities dropped after attaching). processes_ptr is set once the
  // process table exists, before any profile is labeled.
  std::unique_ptr<k8s::PodStore> pod_store;
  std::unique_ptr<k8s::KubernetesMetadata> k8s_metadata;
  proc::ProcessTable* processes_ptr = nullptr;
  if (config.kubernetes) {
    k8s::TargetOptions to;
    to.namespaces.insert(config.target_namespaces.begin(), config.target_namespaces.end());
    PS_ASSIGN_OR_RETURN(to.pod_selector, k8s::LabelSelector::Parse(config.target_pod_selector));
    pod_store = std::make_unique<k8s::PodStore>();
    k8s_metadata = std::make_unique<k8s::KubernetesMetadata>(
        pod_store.get(), config.kubernetes_node_name, std::move(to));
  }

  // Push exporter first: bad TLS files or secrets fail before anything is loaded.
  std::unique_ptr<SeriesLabeler> labeler;
  std::unique_ptr<PyroscopeExporter> pusher;
  if (!config.remote_url.empty()) {
    PyroscopeOptions po;
    po.url = config.remote_url;
    po.protocol = config.remote_protocol;
    po.tenant_id = config.tenant_id;
    po.basic_auth_user = config.basic_auth_user;
    if (!config.basic_auth_password_file.empty()) {
      PS_ASSIGN_OR_RETURN(po.basic_auth_password, ReadSecretFile(config.basic_auth_password_file));
    }
    if (!config.bearer_token_file.empty()) {
      PS_ASSIGN_OR_RETURN(po.bearer_token, ReadSecretFile(config.bearer_token_file));
    }
    po.headers = config.remote_headers;
    po.tls_ca_file = config.tls_ca_file;
    po.tls_cert_file = config.tls_cert_file;
    po.tls_key_file = config.tls_key_file;
    po.queue_max_bytes = static_cast<size_t>(config.queue_max_bytes);
    po.shutdown_timeout = config.shutdown_timeout;
    po.window = config.collect_interval;
    LabelOptions lo;
    // In a pod gethostname(2) is the agent pod's name, new at every rollout: the node's name is
    // the host's.
    if (config.kubernetes) lo.hostname = config.kubernetes_node_name;
    lo.service_name = config.service_name;
    lo.pid_filter_run = !config.pids.empty();
    lo.external = config.external_labels;
    lo.pid_label = config.pid_label;
    if (k8s_metadata != nullptr) {
      k8s::KubernetesMetadata* m = k8s_metadata.get();
      proc::ProcessTable** table = &processes_ptr;
      k8s::PodStore* store = pod_store.get();
      lo.kubernetes_generation = [store] { return store->generation(); };
      lo.kubernetes = [m, table](const proc::ProcessKey& key, absl::string_view cgroup) {
        std::string text(cgroup);
        if (text.empty() && *table != nullptr) {
          // Exited since: the cgroup read with its snapshot at exec.
          if (auto info = (*table)->Get(key); info.ok()) text = (*info)->cgroup;
        }
        return m->Lookup(text);
      };
    }
    labeler = std::make_unique<SeriesLabeler>(lo);
    SeriesLabeler* l = labeler.get();
    PS_ASSIGN_OR_RETURN(
        pusher, PyroscopeExporter::Create(po, [l](const ProcessProfile& p) {
          auto labels = l->Labels(p.process, p.process_name, p.type);
          return labels.ok() ? *std::move(labels) : LabelList{};
        }));
  }

  std::unique_ptr<symbolize::Kallsyms> kallsyms;
  if (auto k = symbolize::Kallsyms::Load(); k.ok()) {
    kallsyms = std::make_unique<symbolize::Kallsyms>(*std::move(k));
  } else {
    Log(LogLevel::kWarning, "kernel frames stay unsymbolized: %s", k.status().ToString());
  }

  BpfPrograms::Options opts;
  opts.frequency_hz = config.sampling_frequency_hz;
  opts.tgids = config.pids;
  opts.tree_root = command != nullptr ? static_cast<uint32_t>(command->pid()) : 0;
  opts.latency_group = config.latency_group == Config::LatencyGroup::kCgroup ? PS_GROUP_CGROUP
                       : config.latency_group == Config::LatencyGroup::kTree ? PS_GROUP_TREE
                                                                              : PS_GROUP_PROCESS;
  opts.collect_interval = config.collect_interval;
  opts.sched = config.profiles.needs_sched();
  opts.offcpu = config.profiles.needs_offcpu();
  opts.min_offcpu_ns = absl::ToInt64Nanoseconds(config.off_cpu_min_duration);
  opts.offcpu_stack_rate = static_cast<uint32_t>(config.off_cpu_stack_rate);
  opts.offcpu_stack_budget = static_cast<uint32_t>(config.off_cpu_stack_budget);
  // P% of the 1e9 ns of a second; at least 1 ns for any P > 0 (0 would mean no limit).
  opts.offcpu_stack_cpu_ns =
      config.off_cpu_stack_cpu_budget > 0
          ? std::max<uint64_t>(1, static_cast<uint64_t>(config.off_cpu_stack_cpu_budget * 1e7))
          : 0;
  opts.unwind_table_bytes = static_cast<uint64_t>(config.unwind_table_bytes);
  // Open files: pinned mapped files and perf maps, BPF maps and programs, perf events (one per
  // CPU), sockets. The soft RLIMIT_NOFILE (often 1024) is raised to the hard one (setrlimit(2);
  // systemd's default hard limit is 524288), and pinning takes at most a quarter of it.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = nofile.rlim_max;
    (void)setrlimit(RLIMIT_NOFILE, &nofile);
    (void)getrlimit(RLIMIT_NOFILE, &nofile);
  }
  const size_t max_pinned = static_cast<size_t>(
      std::min<rlim_t>(4096, nofile.rlim_cur == RLIM_INFINITY ? 4096 : nofile.rlim_cur / 4));
  // Before the programs: the unwinder's thread snapshots processes into it from the first event.
  proc::ProcessTable processes("/proc", 8192, max_pinned);
  processes.set_read_cgroup(k8s_metadata != nullptr);
  processes_ptr = &processes;
  // The labeler (made before the table) must not reach it once it is gone.
  struct ForgetTable {
    proc::ProcessTable** p;
    ~ForgetTable() { *p = nullptr; }
  } forget_table{&processes_ptr};
  opts.processes = &processes;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<BpfPrograms> bpf, BpfPrograms::Create(opts));
  // Unix time of a monotonic instant: windows are cut on CLOCK_MONOTONIC (what BPF sees).
  const int64_t unix_minus_mono = RealtimeNowNs() - MonotonicNowNs();
  symbolize::ElfCache elf_cache;
  StackSymbolizer symbolizer(&processes, &elf_cache, kallsyms.get());
  // Modules and BPF programs loaded later (other tools' programs, the agent's own) get names:
  // checked every 10 s, kallsyms reloaded only when the set changed.
  if (kallsyms != nullptr) {
    symbolizer.EnableKallsymsRefresh("/proc/kallsyms", "/proc/modules", 10000000000);
  }
  symbolize::DebugSearch debug_search;
  debug_search.debug_dirs = config.debug_dirs;
  debug_search.debuginfod = debuginfod.get();
  symbolize::DwarfCache dwarf_cache(debug_search);
  if (config.symbolize_server) {
    symbolizer.SetServerSide(true);
  } else {
    symbolizer.SetDwarf(&dwarf_cache, StackSymbolizer::kDwarfBurstNs, debuginfod.get());
  }
  ProfileOptions popts;
  popts.period_ns = (1000000000LL + config.sampling_frequency_hz / 2) /
                    config.sampling_frequency_hz;
  popts.period_is_ns = bpf->period_is_ns();
  popts.description = absl::StrCat("parascope: event=", bpf->event_name(),
                                   " frequency=", config.sampling_frequency_hz, "Hz");
  popts.types = config.profiles;
  if (config.off_cpu_stack_rate > 0) {
    popts.offcpu_description = absl::StrCat(
        "parascope: off-CPU stacks of a thread switching out more than ", config.off_cpu_stack_rate,
        " times/s are captured at random (probability 1/w, w = rate/", config.off_cpu_stack_rate,
        "); a captured interval under ", PS_EXACT_OFFCPU_NS / 1000000,
        " ms counts w times (unbiased), longer ones once");
  }
  // The CPU's capture budget (bpf/abi.h): in captures a second, in CPU time, or both.
  const bool by_count = config.off_cpu_stack_budget > 0;
  const bool by_time = config.off_cpu_stack_cpu_budget > 0;
  if (by_count || by_time) {
    const std::string count =
        absl::StrCat("capturing more than ", config.off_cpu_stack_budget, " off-CPU stacks/s");
    const std::string time = absl::StrCat("spending more than ", config.off_cpu_stack_cpu_budget,
                                          "% of it on off-CPU stack captures");
    const std::string count_c = absl::StrCat("ceil(rate/", config.off_cpu_stack_budget, ")");
    const std::string time_c = absl::StrCat("ceil(rate * mean capture time / ",
                                            config.off_cpu_stack_cpu_budget, "% of a second)");
    absl::StrAppend(
        &popts.offcpu_description, popts.offcpu_description.empty() ? "parascope: " : "; ",
        "a CPU ",
        by_count && by_time ? absl::StrCat(count, " or ", time)
        : by_count          ? count
                            : time,
        " captures each at random (probability 1/c, c = ",
        by_count && by_time ? absl::StrCat("the larger of ", count_c, " and ", time_c)
        : by_count          ? count_c
                            : time_c,
        "); a captured interval under ", PS_BUDGET_EXACT_OFFCPU_NS / 1000000,
        " ms counts c times more (unbiased); intervals of ", PS_BUDGET_EXACT_OFFCPU_NS / 1000000,
        " ms or more count once, exactly, and a thread's next wait after one is captured "
        "outside the budget (up to as many again)");
  }
  if (!popts.offcpu_description.empty()) {
    absl::StrAppend(&popts.offcpu_description,
                    "; each thread's total per state and window is exact: the weighted intervals "
                    "are scaled to it (only the split across stacks is sampled)");
  }
  // --latency-group=cgroup: the latency profiles are the cgroups' (group_set, which also builds
  // each cgroup's CPU profile for the summary); the per-process set builds the other types.
  const bool cgroup_groups = config.latency_group == Config::LatencyGroup::kCgroup;
  std::unique_ptr<ProfileSet> group_set;
  if (cgroup_groups) {
    ProfileOptions gopts = popts;
    gopts.types.enabled.fill(false);
    gopts.types.enabled[static_cast<int>(ProfileType::kCpu)] = true;
    gopts.types.enabled[static_cast<int>(ProfileType::kLatency)] = true;
    group_set = std::make_unique<ProfileSet>(gopts, &symbolizer, &processes);
    popts.types.enabled[static_cast<int>(ProfileType::kLatency)] = false;
  }
  ProfileSet profile_set(popts, &symbolizer, &processes);
  // Cgroup paths by id (bounded: cleared past 4096), read from a member's /proc/<pid>/cgroup.
  absl::flat_hash_map<uint64_t, std::string> cgroup_paths;

  std::vector<Exporter*> exporters;
  std::unique_ptr<FileExporter> file_exporter;
  if (!config.output_dir.empty()) {
    RetentionOptions ro;
    ro.max_bytes = config.output_max_bytes;
    ro.max_age = config.output_max_age;
    file_exporter = std::make_unique<FileExporter>(
        config.output_dir, ro, static_cast<size_t>(config.output_max_new_processes));
    if (absl::Status s = file_exporter->Start(absl::Now()); !s.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--output-dir: ", s.message()));
    }
    exporters.push_back(file_exporter.get());
  }
  if (pusher != nullptr) exporters.push_back(pusher.get());
  // Process churn (export/file_exporter.h): when the files are the only output, the images the
  // file exporter merges into DIR/overflow/ are built straight into one overflow group per
  // part, not into a profile each that is then merged: under continuous churn (~6,500 merged
  // images a window) the per-image builders, their wall copy and the merge took this thread
  // 2.69 s of CPU in 45 s; 1.67 s without them. The group's profiles hold the same samples with
  // the same labels (pid, process) as the merged ones (test/unit/profile_set_test.cc). A pusher
  // or the summary needs each image's own profiles.
  ProfileSet overflow_set(popts, &symbolizer, &processes);
  const bool build_overflow =
      file_exporter != nullptr && pusher == nullptr && !config.print_summary && command == nullptr;
  ProfileOwner overflow_owner;
  overflow_owner.group.kind = ProfileGroup::Kind::kOverflow;

  server::MetricsRegistry registry;
  AgentMetrics metrics(&registry, bpf.get());
  std::vector<server::CallbackRegistration> push_metrics;
  if (pusher != nullptr) push_metrics = RegisterExporterMetrics(&registry, pusher.get());
  std::vector<server::CallbackRegistration> retention_metrics;
  if (file_exporter != nullptr && file_exporter->retention_enabled()) {
    retention_metrics = RegisterRetentionMetrics(&registry, file_exporter.get());
  }
  std::vector<server::CallbackRegistration> overflow_metrics;
  if (file_exporter != nullptr) {
    overflow_metrics = RegisterOverflowMetrics(&registry, file_exporter.get());
  }
  std::atomic<uint64_t> untargeted{0};
  std::unique_ptr<k8s::PodWatcher> pod_watcher;
  std::vector<server::CallbackRegistration> k8s_metrics;
  if (k8s_metadata != nullptr) {
    k8s::PodWatcherOptions wo;
    wo.api_url = config.kubernetes_api_url;
    wo.node_name = config.kubernetes_node_name;
    wo.token_file = config.kubernetes_token_file;
    wo.ca_file = config.kubernetes_ca_file;
    pod_watcher = std::make_unique<k8s::PodWatcher>(wo, pod_store.get());
    k8s_metrics = RegisterKubernetesMetrics(&registry, pod_watcher.get(), pod_store.get(),
                                            k8s_metadata.get(), &untargeted);
  }
  std::vector<server::CallbackRegistration> thread_metrics = RegisterThreadMetrics(&registry);
  std::vector<server::CallbackRegistration> debuginfod_metrics;
  if (debuginfod != nullptr) {
    debuginfod_metrics = RegisterDebuginfodMetrics(&registry, debuginfod.get());
  }
  std::unique_ptr<server::HttpServer> http;
  if (!config.http_address.empty()) {
    server::HttpServerOptions ho;
    ho.address = config.http_address;
    ho.metrics = &registry;
    PyroscopeExporter* p = pusher.get();
    ho.readiness = [p]() -> absl::Status {
      if (p != nullptr && !p->Ready()) {
        return absl::UnavailableError("remote endpoint unreachable for more than two windows");
      }
      return absl::OkStatus();
    };
    http = std::make_unique<server::HttpServer>(ho);
    PS_RETURN_IF_ERROR(http->Start());
  }
  RunSummary summary;

  Log(LogLevel::kInfo,
      "attached: %s; on-CPU sampling with %s at %d Hz on %d CPUs%s, %s, windows of %s%s",
      EnabledProfiles(config.profiles), bpf->event_name(), config.sampling_frequency_hz,
      static_cast<int>(bpf->num_cpus()),
      bpf->sched_attach_kind().empty() ? ""
      : bpf->thread_state_store().empty()
          ? absl::StrCat(", sched_switch via ", bpf->sched_attach_kind())
          : absl::StrCat(", sched_switch via ", bpf->sched_attach_kind(), " (thread states in ",
                         bpf->thread_state_store(), ")"),
      command != nullptr ? absl::StrCat("the command ", command->path(), " (pid ", command->pid(),
                                        ") and its descendants")
      : config.pids.empty() ? std::string("all processes")
                            : absl::StrCat("pids ", absl::StrJoin(config.pids, ",")),
      absl::FormatDuration(config.collect_interval),
      config.duration > absl::ZeroDuration()
          ? absl::StrCat(", for ", absl::FormatDuration(config.duration))
          : std::string());

  // Loaded and attached: CAP_BPF, CAP_PERFMON and whatever else the agent will not use again go
  // (util/capabilities.h).
  {
    std::vector<std::string> dropped;
    if (absl::Status s = DropCapabilitiesAfterAttach(&dropped); !s.ok()) {
      Log(LogLevel::kWarning, "could not drop capabilities after attaching: %s", s.ToString());
    } else if (!dropped.empty()) {
      Log(LogLevel::kDebug, "dropped %d capabilities after attaching: %s",
          static_cast<int>(dropped.size()), absl::StrJoin(dropped, ", "));
    }
  }
  if (pod_watcher != nullptr) {
    PS_RETURN_IF_ERROR(pod_watcher->Start());
    Log(LogLevel::kInfo, "kubernetes: watching the pods of node %s on %s%s",
        config.kubernetes_node_name, config.kubernetes_api_url,
        k8s_metadata->targeting()
            ? absl::StrCat("; profiling only pods", config.target_namespaces.empty() ? "" : " in ",
                           absl::StrJoin(config.target_namespaces, ","),
                           config.target_pod_selector.empty() ? "" : " matching ",
                           config.target_pod_selector)
            : std::string());
  }
  // Type=notify: profiling from here on (deploy/systemd/parascope.service).
  if (absl::Status s = SdNotify("READY=1\nSTATUS=profiling"); !s.ok()) {
    Log(LogLevel::kWarning, "sd_notify: %s", s.ToString());
  }
  WindowSchedule schedule(bpf->start_mono_ns(), absl::ToInt64Nanoseconds(config.collect_interval),
                          absl::ToInt64Nanoseconds(config.duration));
  uint64_t windows = 0, profiles_written = 0, export_errors = 0, impostor_records = 0;
  RateLimitedLog impostor_log;
  RateLimitedLog export_log;
  bool stop = false;
  if (command != nullptr) {
    // In the tree (BPF) since before attach: CMD is recorded from its first instruction on.
    if (absl::Status s = command->Release(); !s.ok()) {
      absl::StatusOr<int> died = command->Reap();
      // Killed before it could exec (^C during start-up): 128 + the signal, as a shell says.
      *exit_status = s.code() == absl::StatusCode::kInternal && died.ok() ? *died
                                                                          : CannotRunStatus(s);
      return s;
    }
  }
  int64_t cpu_loop_end = ThreadCpuNs();
  while (!stop) {
    signalfd_siginfo got{};
    const Wake wake = WaitForWake(schedule.boundary_ns(), signal_fd, &targets, bpf.get(), &got);
    stop = wake != Wake::kDeadline || schedule.final();
    if (wake == Wake::kSignal && command != nullptr && got.ssi_code != SI_KERNEL) {
      // A signal sent to the agent alone (kill(2); a terminal's ^C reaches the command's process
      // group itself, SI_KERNEL) is passed on to the command, like a shell's job control.
      command->Signal(static_cast<int>(got.ssi_signo));
    }
    const int64_t cpu0 = ThreadCpuNs();
    Log(LogLevel::kDebug, "between windows: agent CPU ms %.1f", (cpu0 - cpu_loop_end) / 1e6);
    auto data = bpf->Drain(stop);
    if (!data.ok()) return data.status();
    const int64_t cpu_drained = ThreadCpuNs();
    // Build and export process by process: only one process's builders and profiles are alive at
    // a time, so memory follows the largest process, not the number of processes in the window.
    struct RecordIndex {
      std::vector<uint32_t> oncpu, offcpu, runtime;
    };
    // In command mode every record is the tree's: one owner, the root, under the exec id of its
    // latest image (CMD's, once it exec'd; ids only grow, bpf/abi.h "Process identity").
    const ProfileOwner* owner = command != nullptr ? &tree_owner : nullptr;
    if (owner != nullptr) {
      auto note = [&](const proc::ProcessKey& k) {
        if (k.tgid == tree_owner.process.tgid) {
          tree_owner.process.exec_id = std::max(tree_owner.process.exec_id, k.exec_id);
        }
      };
      for (const OnCpuRecord& r : data->oncpu) note(r.process);
      for (const OffCpuRecord& r : data->offcpu) note(r.process);
      for (const RuntimeRecord& r : data->runtime) note(r.process);
    }
    auto owner_key = [&](const proc::ProcessKey& k) -> const proc::ProcessKey& {
      return owner != nullptr ? tree_owner.process : k;
    };
    // --target-namespaces / --target-pod-selector: decided once per process and window from
    // the cgroup read with its snapshot (so a process that exited is judged too).
    absl::flat_hash_map<proc::ProcessKey, bool> selected;
    auto targeted = [&](const proc::ProcessKey& k) {
      if (k8s_metadata == nullptr || !k8s_metadata->targeting()) return true;
      auto [it, inserted] = selected.try_emplace(k, false);
      if (inserted) {
        auto info = processes.Get(k);
        it->second = info.ok() && k8s_metadata->Selected((*info)->cgroup);
        if (!it->second) untargeted.fetch_add(1, std::memory_order_relaxed);
      }
      return it->second;
    };
    absl::flat_hash_map<proc::ProcessKey, RecordIndex> by_process;
    for (uint32_t i = 0; i < data->oncpu.size(); ++i) {
      by_process[owner_key(data->oncpu[i].process)].oncpu.push_back(i);
    }
    for (uint32_t i = 0; i < data->offcpu.size(); ++i) {
      by_process[owner_key(data->offcpu[i].process)].offcpu.push_back(i);
    }
    for (uint32_t i = 0; i < data->runtime.size(); ++i) {
      by_process[owner_key(data->runtime[i].process)].runtime.push_back(i);
    }

    const int64_t t0_unix_ns = data->start_mono_ns + unix_minus_mono;
    const int64_t duration_ns = data->end_mono_ns - data->start_mono_ns;
    // Build and export alternate per process. Their wall times are summed with CLOCK_MONOTONIC
    // (vDSO, ~30 ns) and the thread CPU time of the whole loop is split between them in
    // proportion: CLOCK_THREAD_CPUTIME_ID is a system call (2 us on this kind of VM), and three
    // of them per process were 5% of this thread under process churn (perf).
    int64_t wall_build = 0, wall_export = 0;
    const int64_t cpu_profiles0 = ThreadCpuNs();
    size_t profiles_this_window = 0;
    // The overflow group's profiles, as one part (FileExporter::ExportMergedPart).
    auto export_overflow = [&] {
      const int64_t c0 = MonotonicNowNs();
      std::vector<ProcessProfile> profiles = overflow_set.Finish(t0_unix_ns, duration_ns);
      const int64_t c1 = MonotonicNowNs();
      for (ProcessProfile& p : profiles) {
        const size_t images = p.group_processes;
        profiles_this_window += images;
        // Written or lost with their part (the merge path counts them written when merged,
        // then lost: TakeMergedLost).
        if (absl::Status s = file_exporter->ExportMergedPart(std::move(p)); s.ok()) {
          profiles_written += images;
        } else {
          export_errors += images;
          export_log.Log(LogLevel::kWarning, "export failed: %s", s.ToString());
        }
      }
      wall_build += c1 - c0;
      wall_export += MonotonicNowNs() - c1;
    };
    for (const auto& [key, index] : by_process) {
      if (!targets.empty() && !targets.Matches(key)) {
        // A process that got an exited target's pid before the filter dropped it: never
        // profiled as the target.
        impostor_records += index.oncpu.size() + index.offcpu.size() + index.runtime.size();
        impostor_log.Log(LogLevel::kInfo,
                         "ignored pid %d: another process than the --pid target (pid reused)",
                         key.tgid);
        continue;
      }
      if (!targeted(key)) continue;
      const int64_t c0 = MonotonicNowNs();
      if (build_overflow && (!index.offcpu.empty() || !index.oncpu.empty()) &&
          file_exporter->MergesProcess(key)) {
        for (uint32_t i : index.offcpu) overflow_set.AddOffCpu(data->offcpu[i], &overflow_owner);
        for (uint32_t i : index.oncpu) overflow_set.AddOnCpu(data->oncpu[i], &overflow_owner);
        for (uint32_t i : index.runtime) {
          overflow_set.AddRuntime(data->runtime[i], &overflow_owner);
        }
        overflow_set.ForgetFrames();
        wall_build += MonotonicNowNs() - c0;
        // A part is written once one of its profiles holds about as much as a merged part may
        // (the bound of the window's overflow memory, per type).
        if (overflow_set.approx_bytes() >= FileExporter::kMaxMergedBytes) export_overflow();
        continue;
      }
      // Off-CPU first: the wall profile then starts as a copy of the off_cpu one.
      for (uint32_t i : index.offcpu) profile_set.AddOffCpu(data->offcpu[i], owner);
      for (uint32_t i : index.oncpu) profile_set.AddOnCpu(data->oncpu[i], owner);
      for (uint32_t i : index.runtime) profile_set.AddRuntime(data->runtime[i], owner);
      std::vector<ProcessProfile> profiles = profile_set.Finish(t0_unix_ns, duration_ns);
      const int64_t c1 = MonotonicNowNs();
      profiles_this_window += profiles.size();
      for (const ProcessProfile& p : profiles) {
        if (config.print_summary) summary.Add(p);
        for (Exporter* e : exporters) {
          absl::Status s = e->Export(p);
          if (s.ok()) {
            if (e == file_exporter.get()) ++profiles_written;
          } else {
            ++export_errors;
            export_log.Log(LogLevel::kWarning, "export failed: %s", s.ToString());
          }
        }
      }
      wall_build += c1 - c0;
      wall_export += MonotonicNowNs() - c1;
    }
    if (build_overflow) export_overflow();
    if (group_set != nullptr) {
      // The cgroups' latency profiles: parallelism counted over each cgroup (BPF keyed the
      // samples by its id), one group at a time.
      absl::flat_hash_map<uint64_t, std::vector<uint32_t>> by_group;
      for (uint32_t i = 0; i < data->oncpu.size(); ++i) {
        const OnCpuRecord& r = data->oncpu[i];
        // A --pid run's impostors are left out (in command mode BPF records the tree alone).
        if (command == nullptr && !targets.empty() && !targets.Matches(r.process)) continue;
        if (!targeted(r.process)) continue;
        by_group[r.group].push_back(i);
      }
      for (const auto& [id, index] : by_group) {
        const int64_t c0 = MonotonicNowNs();
        ProfileOwner cg;
        cg.process = data->oncpu[index.front()].process;
        cg.group.kind = ProfileGroup::Kind::kCgroup;
        cg.group.id = id;
        auto it = cgroup_paths.find(id);
        if (it == cgroup_paths.end()) {
          if (cgroup_paths.size() >= 4096) cgroup_paths.clear();
          std::string path;
          for (uint32_t i : index) {
            path = CgroupV2Path(data->oncpu[i].process.tgid);
            if (!path.empty()) break;
          }
          it = cgroup_paths.emplace(id, path).first;
        }
        cg.group.cgroup_path = it->second;
        for (uint32_t i : index) group_set->AddOnCpu(data->oncpu[i], &cg);
        std::vector<ProcessProfile> profiles = group_set->Finish(t0_unix_ns, duration_ns);
        const int64_t c1 = MonotonicNowNs();
        for (const ProcessProfile& p : profiles) {
          if (config.print_summary) summary.Add(p);
          if (p.type != "latency") continue;  // the CPU profile is for the summary only
          ++profiles_this_window;
          for (Exporter* e : exporters) {
            absl::Status s = e->Export(p);
            if (s.ok()) {
              if (e == file_exporter.get()) ++profiles_written;
            } else {
              ++export_errors;
              export_log.Log(LogLevel::kWarning, "export failed: %s", s.ToString());
            }
          }
        }
        wall_build += c1 - c0;
        wall_export += MonotonicNowNs() - c1;
      }
    }
    const int64_t cpu_profiles = ThreadCpuNs() - cpu_profiles0;
    const int64_t wall_profiles = wall_build + wall_export;
    int64_t cpu_build =
        wall_profiles > 0
            ? static_cast<int64_t>(static_cast<__int128>(cpu_profiles) * wall_build / wall_profiles)
            : cpu_profiles;
    int64_t cpu_export = cpu_profiles - cpu_build;
    if (file_exporter != nullptr) {
      const int64_t c0 = ThreadCpuNs();
      if (absl::Status s = file_exporter->Flush(); !s.ok()) {
        export_log.Log(LogLevel::kWarning, "export failed: %s", s.ToString());
      }
      // Merged profiles were accepted (and counted written) before their part's write failed.
      export_errors += file_exporter->TakeMergedLost();
      file_exporter->EndWindow(absl::Now());
      cpu_export += ThreadCpuNs() - c0;
    }
    processes.EndWindow();
    symbolizer.EndWindow();
    if (labeler != nullptr) labeler->EndWindow();
    ++windows;
    ProfileStats profile_stats = profile_set.stats();
    profile_stats += overflow_set.stats();
    metrics.Update(profile_stats, symbolizer.stats(), bpf->map_stats(), processes.size(),
                   profiles_written, export_errors);
    metrics.UpdateProcesses(processes, symbolizer);
    metrics.SetWindowCpu(cpu_drained - cpu0, cpu_build, cpu_export);
    Log(LogLevel::kDebug,
        "window %d: %d on-CPU records, %d off-CPU records, %d processes, %d profiles; agent "
        "CPU ms: drain %.1f, symbolize and build %.1f, export %.1f",
        windows, data->oncpu.size(), data->offcpu.size(), by_process.size(),
        profiles_this_window, (cpu_drained - cpu0) / 1e6, cpu_build / 1e6, cpu_export / 1e6);
    schedule.Advance(data->end_mono_ns);
    by_process.clear();
    data = absl::StatusOr<WindowData>();
    // Hand the window's freed heap (records, builders) and its profiles' arena blocks back to
    // the kernel so RSS follows the steady state, not the largest window (glibc keeps it
    // otherwise).
    ReleaseProfileArenaBlocks();
    malloc_trim(0);
    cpu_loop_end = ThreadCpuNs();
    Log(LogLevel::kDebug, "window %d: agent CPU ms in all %.1f", windows,
        (cpu_loop_end - cpu0) / 1e6);
  }

  if (command != nullptr) {
    // The command's exit status is the agent's. When profiling stopped first (--duration, a
    // signal), the agent waits for it, passing on the signals sent to the agent alone.
    if (!targets.all_exited()) {
      Log(LogLevel::kInfo, "profiling stopped; waiting for %s (pid %d) to exit", command->path(),
          command->pid());
      WaitForCommand(command.get(), signal_fd);
    }
    absl::StatusOr<int> status = command->Reap();
    if (!status.ok()) {
      *exit_status = 1;
      return status.status();
    }
    *exit_status = *status;
    Log(LogLevel::kInfo, "command %s exited with status %d", command->path(), *exit_status);
  }
  if (pusher != nullptr) {
    pusher->Shutdown();  // delivers what is queued, for at most --shutdown-timeout
    PyroscopeExporter::Stats st = pusher->GetStats();
    uint64_t dropped = 0;
    for (const auto& [reason, n] : st.dropped) dropped += n;
    Log(LogLevel::kInfo, "push: sent=%d retries=%d dropped=%d queued_at_exit=%d", st.sent,
        st.retries, dropped, st.queue_length);
  }
  if (http != nullptr) http->Stop();
  BpfCounters c = bpf->Counters();
  ProfileStats ps = profile_set.stats();
  ps += overflow_set.stats();
  const SymbolizerStats& ss = symbolizer.stats();
  const BpfMapStats& ms = bpf->map_stats();
  const unwind::UnwindTableStats us = bpf->unwind_stats();
  Log(LogLevel::kInfo,
      "stopped: windows=%d flip_wait_timeouts=%d samples_taken=%d samples_in_profiles=%d "
      "profiles_written=%d "
      "export_errors=%d switches=%d switches_unseen(chain=%d sample=%d) "
      "offcpu_stacks(not_captured=%d over_budget=%d weighted=%d) offcpu_ns=%d sampled_cpu_ns=%d "
      "exact_cpu_ns=%d "
      "samples_parallelism_unknown=%d parallelism_uncounted=%d lost(agg_map_full=%d "
      "stack_map_full=%d thread_map_full=%d offcpu_map_full=%d running_map_full=%d "
      "runtime_map_full=%d map_busy=%d) "
      "stacks(user_lost=%d kernel_lost=%d truncated=%d missing=%d) thread_states=%d "
      "thread_states_max=%d symbolize(frames=%d no_mapping=%d no_elf=%d no_symbol=%d "
      "kernel_no_symbol=%d) processes(vanished=%d) unwind(complete=%d truncated=%d "
      "no_table_yet=%d no_table_for_pc=%d read_fault=%d bad_frame=%d fp_frames=%d vma_frames=%d "
      "vma_cache_full=%d tables=%d table_bytes=%d built=%d evicted=%d budget_full=%d files=%d "
      "files_full=%d) new_images(shed=%d gone=%d work_ms=%d forgiven_ms=%d capped_ms=%d "
      "build_ms=%d inline_loads=%d)",
      windows, bpf->flip_wait_timeouts(), c[PS_CTR_SAMPLES], ps.samples, profiles_written,
      export_errors, c[PS_CTR_SWITCHES], c[PS_CTR_SWITCH_CHAIN_BREAKS], c[PS_CTR_SAMPLE_REPAIRS],
      c[PS_CTR_OFFCPU_NOT_CAPTURED], c[PS_CTR_OFFCPU_OVER_BUDGET], c[PS_CTR_OFFCPU_WEIGHTED],
      ps.offcpu_ns, ps.sampled_cpu_ns, ps.exact_cpu_ns, ps.samples_parallelism_unknown,
      c[PS_CTR_RUNNING_UNCOUNTED], c[PS_CTR_AGG_MAP_FULL], c[PS_CTR_STACK_MAP_FULL],
      c[PS_CTR_THREAD_MAP_FULL], c[PS_CTR_OFFCPU_MAP_FULL], c[PS_CTR_RUNNING_MAP_FULL],
      c[PS_CTR_RUNTIME_MAP_FULL], c[PS_CTR_MAP_BUSY], ps.user_stack_lost, ps.kernel_stack_lost,
      ps.truncated, ms.stacks_missing, ms.thread_states, ms.thread_states_max, ss.frames,
      ss.no_mapping, ss.no_elf, ss.no_symbol, ss.kernel_no_symbol, processes.vanished(),
      c[PS_CTR_UNWIND_COMPLETE], c[PS_CTR_UNWIND_TRUNCATED], c[PS_CTR_UNWIND_NO_TABLE_YET],
      c[PS_CTR_UNWIND_NO_TABLE_PC], c[PS_CTR_UNWIND_READ_FAULT], c[PS_CTR_UNWIND_BAD_FRAME],
      c[PS_CTR_UNWIND_FP_FRAMES], c[PS_CTR_UNWIND_VMA_FRAMES], c[PS_CTR_UNWIND_VMA_CACHE_FULL],
      us.tables, us.table_bytes, us.tables_built, us.tables_evicted, us.budget_full, us.files,
      us.files_full, us.exec_snapshots_shed, us.process_gone, us.exec_snapshot_cpu_ns / 1000000,
      us.exec_forgiven_cpu_ns / 1000000, us.exec_capped_cpu_ns / 1000000, us.build_ns / 1000000,
      us.exec_inline_loads);
  if (debuginfod != nullptr) {
    symbolize::DebuginfodStats d = debuginfod->stats();
    Log(LogLevel::kInfo,
        "debuginfod: fetched=%d not_found=%d errors=%d dropped=%d evictions=%d cache_bytes=%d "
        "queued_at_exit=%d",
        d.fetched, d.not_found, d.errors, d.dropped, d.evictions, d.cache_bytes, d.queued);
  }
  if (config.print_summary) {
    std::cout << "parascope: busiest processes (" << bpf->event_name() << ", "
              << config.sampling_frequency_hz << " Hz, " << bpf->num_cpus() << " CPUs)\n";
    summary.Print(std::cout, config.summary_processes, config.summary_functions);
    if (!config.output_dir.empty()) {
      std::cout << "\nprofiles written to " << config.output_dir
                << "/<pid>/<start ticks>.<exec id>/<type>-<t0 unix ms>.pb.gz (open with: pprof -top "
                   "FILE)\n";
    }
    std::cout.flush();
  }
  return absl::OkStatus();
}

}  // namespace parascope
