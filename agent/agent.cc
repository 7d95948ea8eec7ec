#include "agent/agent.h"

#include <signal.h>

#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/bpf/libbpf_log.h"
#include "agent/bpf/oncpu_program.h"
#include "agent/bpf/probe.h"
#include "agent/collect/window_clock.h"
#include "agent/export/file_exporter.h"
#include "agent/profile/cpu_profiles.h"
#include "agent/profile/summary.h"
#include "agent/proc/process_table.h"
#include "agent/symbolize/elf_cache.h"
#include "agent/symbolize/kallsyms.h"
#include "agent/symbolize/stack_symbolizer.h"
#include "agent/util/log.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

// Waits until the monotonic deadline or a blocked SIGINT/SIGTERM. True when a signal arrived.
bool WaitForDeadlineOrSignal(int64_t deadline_ns) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  for (;;) {
    int64_t left = deadline_ns - MonotonicNowNs();
    if (left <= 0) return false;
    timespec ts{static_cast<time_t>(left / 1000000000), static_cast<long>(left % 1000000000)};
    int sig = sigtimedwait(&set, nullptr, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      Log(LogLevel::kInfo, "received %s: flushing the current window", strsignal(sig));
      return true;
    }
    // EAGAIN: timeout; EINTR: another signal; loop re-checks the deadline.
  }
}

}  // namespace

absl::Status RunAgent(const Config& config) {
  InstallLibbpfLogger();
  PS_RETURN_IF_ERROR(ProbeBpfEnvironment());

  std::unique_ptr<symbolize::Kallsyms> kallsyms;
  if (auto k = symbolize::Kallsyms::Load(); k.ok()) {
    kallsyms = std::make_unique<symbolize::Kallsyms>(*std::move(k));
  } else {
    Log(LogLevel::kWarning, "kernel frames stay unsymbolized: %s", k.status().ToString());
  }

  OnCpuProgram::Options opts;
  opts.frequency_hz = config.sampling_frequency_hz;
  opts.tgids = config.pids;
  opts.collect_interval = config.collect_interval;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<OnCpuProgram> oncpu, OnCpuProgram::Create(opts));

  proc::ProcessTable processes;
  symbolize::ElfCache elf_cache;
  StackSymbolizer symbolizer(&processes, &elf_cache, kallsyms.get());
  CpuProfileOptions cpu_opts;
  cpu_opts.period_ns = (1000000000LL + config.sampling_frequency_hz / 2) /
                       config.sampling_frequency_hz;
  cpu_opts.period_is_ns = oncpu->period_is_ns();
  cpu_opts.description = absl::StrCat("parascope: event=", oncpu->event_name(),
                                      " frequency=", config.sampling_frequency_hz, "Hz");
  CpuProfileSet cpu_profiles(cpu_opts, &symbolizer, &processes);

  std::vector<std::unique_ptr<Exporter>> exporters;
  if (!config.output_dir.empty()) {
    exporters.push_back(std::make_unique<FileExporter>(config.output_dir));
  }
  ProfileSummary summary(/*value_index=*/1);

  Log(LogLevel::kInfo,
      "attached: on-CPU sampling with %s at %d Hz on %d CPUs, %s, windows of %s%s",
      oncpu->event_name(), config.sampling_frequency_hz, static_cast<int>(oncpu->num_cpus()),
      config.pids.empty() ? std::string("all processes")
                          : absl::StrCat("pids ", absl::StrJoin(config.pids, ",")),
      absl::FormatDuration(config.collect_interval),
      config.duration > absl::ZeroDuration()
          ? absl::StrCat(", for ", absl::FormatDuration(config.duration))
          : std::string());

  WindowSchedule schedule(MonotonicNowNs(), absl::ToInt64Nanoseconds(config.collect_interval),
                          absl::ToInt64Nanoseconds(config.duration));
  int64_t window_start_unix_ns = RealtimeNowNs();
  uint64_t windows = 0, samples_drained = 0, profiles_written = 0, export_errors = 0;
  RateLimitedLog export_log;
  bool stop = false;
  while (!stop) {
    stop = WaitForDeadlineOrSignal(schedule.boundary_ns()) || schedule.final();
    int64_t window_end_unix_ns = RealtimeNowNs();
    int64_t now_mono = MonotonicNowNs();
    auto records = stop ? oncpu->DetachAndDrain() : oncpu->Drain();
    if (!records.ok()) return records.status();
    for (const OnCpuRecord& r : *records) {
      samples_drained += r.count;
      cpu_profiles.Add(r);
    }
    std::vector<ProcessProfile> profiles =
        cpu_profiles.Finish(window_start_unix_ns, window_end_unix_ns - window_start_unix_ns);
    for (const ProcessProfile& p : profiles) {
      if (config.print_summary) summary.Add(p);
      for (auto& e : exporters) {
        absl::Status s = e->Export(p);
        if (s.ok()) {
          ++profiles_written;
        } else {
          ++export_errors;
          export_log.Log(LogLevel::kWarning, "export failed: %s", s.ToString());
        }
      }
    }
    processes.EndWindow();
    ++windows;
    Log(LogLevel::kDebug, "window %d: %d records, %d profiles", windows, records->size(),
        profiles.size());
    window_start_unix_ns = window_end_unix_ns;
    schedule.Advance(now_mono);
  }

  BpfCounters c = oncpu->Counters();
  const CpuProfileStats& cs = cpu_profiles.stats();
  const SymbolizerStats& ss = symbolizer.stats();
  Log(LogLevel::kInfo,
      "stopped: windows=%d samples_taken=%d samples_in_profiles=%d profiles_written=%d "
      "export_errors=%d lost(agg_map_full=%d stack_map_full=%d) stacks(user_lost=%d "
      "kernel_lost=%d truncated=%d) symbolize(frames=%d no_mapping=%d no_elf=%d no_symbol=%d "
      "kernel_no_symbol=%d) processes(vanished=%d)",
      windows, c[PS_CTR_SAMPLES], cs.samples, profiles_written, export_errors,
      c[PS_CTR_AGG_MAP_FULL], c[PS_CTR_STACK_MAP_FULL], cs.user_stack_lost, cs.kernel_stack_lost,
      cs.truncated, ss.frames, ss.no_mapping, ss.no_elf, ss.no_symbol, ss.kernel_no_symbol,
      processes.vanished());
  (void)samples_drained;
  if (config.print_summary) {
    std::cout << "parascope: busiest processes by on-CPU time (" << oncpu->event_name() << ", "
              << config.sampling_frequency_hz << " Hz, " << oncpu->num_cpus() << " CPUs)\n";
    summary.Print(std::cout, config.summary_processes, config.summary_functions);
    if (!config.output_dir.empty()) {
      std::cout << "\nprofiles written to " << config.output_dir
                << "/<pid>/process_cpu-<t0 unix ms>.pb.gz (open with: pprof -top FILE)\n";
    }
    std::cout.flush();
  }
  return absl::OkStatus();
}

}  // namespace parascope
