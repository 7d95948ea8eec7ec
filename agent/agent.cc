#include "agent/agent.h"

#include <signal.h>

#include <iostream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/bpf/libbpf_log.h"
#include "agent/bpf/probe.h"
#include "agent/bpf/programs.h"
#include "agent/collect/window_clock.h"
#include "agent/export/file_exporter.h"
#include "agent/profile/profile_set.h"
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

std::string EnabledProfiles(const ProfileTypes& t) {
  std::vector<std::string> names;
  for (int i = 0; i < kNumProfileTypes; ++i) {
    if (t.enabled[i]) names.push_back(ProfileTypeName(static_cast<ProfileType>(i)));
  }
  return absl::StrJoin(names, ",");
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

  BpfPrograms::Options opts;
  opts.frequency_hz = config.sampling_frequency_hz;
  opts.tgids = config.pids;
  opts.collect_interval = config.collect_interval;
  opts.sched = config.profiles.needs_sched();
  opts.offcpu = config.profiles.needs_offcpu();
  opts.min_offcpu_ns = absl::ToInt64Nanoseconds(config.off_cpu_min_duration);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<BpfPrograms> bpf, BpfPrograms::Create(opts));
  // Unix time of a monotonic instant: windows are cut on CLOCK_MONOTONIC (what BPF sees).
  const int64_t unix_minus_mono = RealtimeNowNs() - MonotonicNowNs();

  proc::ProcessTable processes;
  symbolize::ElfCache elf_cache;
  StackSymbolizer symbolizer(&processes, &elf_cache, kallsyms.get());
  ProfileOptions popts;
  popts.period_ns = (1000000000LL + config.sampling_frequency_hz / 2) /
                    config.sampling_frequency_hz;
  popts.period_is_ns = bpf->period_is_ns();
  popts.description = absl::StrCat("parascope: event=", bpf->event_name(),
                                   " frequency=", config.sampling_frequency_hz, "Hz");
  popts.types = config.profiles;
  ProfileSet profile_set(popts, &symbolizer, &processes);

  std::vector<std::unique_ptr<Exporter>> exporters;
  if (!config.output_dir.empty()) {
    exporters.push_back(std::make_unique<FileExporter>(config.output_dir));
  }
  RunSummary summary;

  Log(LogLevel::kInfo,
      "attached: %s; on-CPU sampling with %s at %d Hz on %d CPUs%s, %s, windows of %s%s",
      EnabledProfiles(config.profiles), bpf->event_name(), config.sampling_frequency_hz,
      static_cast<int>(bpf->num_cpus()),
      bpf->sched_attach_kind().empty() ? ""
                                       : absl::StrCat(", sched_switch via ",
                                                      bpf->sched_attach_kind()),
      config.pids.empty() ? std::string("all processes")
                          : absl::StrCat("pids ", absl::StrJoin(config.pids, ",")),
      absl::FormatDuration(config.collect_interval),
      config.duration > absl::ZeroDuration()
          ? absl::StrCat(", for ", absl::FormatDuration(config.duration))
          : std::string());

  WindowSchedule schedule(bpf->start_mono_ns(), absl::ToInt64Nanoseconds(config.collect_interval),
                          absl::ToInt64Nanoseconds(config.duration));
  uint64_t windows = 0, profiles_written = 0, export_errors = 0;
  RateLimitedLog export_log;
  bool stop = false;
  while (!stop) {
    stop = WaitForDeadlineOrSignal(schedule.boundary_ns()) || schedule.final();
    auto data = bpf->Drain(stop);
    if (!data.ok()) return data.status();
    for (const OnCpuRecord& r : data->oncpu) profile_set.AddOnCpu(r);
    for (const OffCpuRecord& r : data->offcpu) profile_set.AddOffCpu(r);
    for (const RuntimeRecord& r : data->runtime) profile_set.AddRuntime(r);
    std::vector<ProcessProfile> profiles =
        profile_set.Finish(data->start_mono_ns + unix_minus_mono,
                           data->end_mono_ns - data->start_mono_ns);
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
    Log(LogLevel::kDebug, "window %d: %d on-CPU records, %d off-CPU records, %d profiles",
        windows, data->oncpu.size(), data->offcpu.size(), profiles.size());
    schedule.Advance(data->end_mono_ns);
  }

  BpfCounters c = bpf->Counters();
  const ProfileStats& ps = profile_set.stats();
  const SymbolizerStats& ss = symbolizer.stats();
  const BpfMapStats& ms = bpf->map_stats();
  Log(LogLevel::kInfo,
      "stopped: windows=%d samples_taken=%d samples_in_profiles=%d profiles_written=%d "
      "export_errors=%d switches=%d offcpu_ns=%d sampled_cpu_ns=%d exact_cpu_ns=%d "
      "samples_parallelism_unknown=%d lost(agg_map_full=%d stack_map_full=%d "
      "thread_map_full=%d offcpu_map_full=%d running_map_full=%d runtime_map_full=%d) "
      "stacks(user_lost=%d kernel_lost=%d truncated=%d missing=%d) thread_states=%d "
      "thread_states_max=%d symbolize(frames=%d no_mapping=%d no_elf=%d no_symbol=%d "
      "kernel_no_symbol=%d) processes(vanished=%d)",
      windows, c[PS_CTR_SAMPLES], ps.samples, profiles_written, export_errors,
      c[PS_CTR_SWITCHES], ps.offcpu_ns, ps.sampled_cpu_ns, ps.exact_cpu_ns,
      ps.samples_parallelism_unknown, c[PS_CTR_AGG_MAP_FULL], c[PS_CTR_STACK_MAP_FULL],
      c[PS_CTR_THREAD_MAP_FULL], c[PS_CTR_OFFCPU_MAP_FULL], c[PS_CTR_RUNNING_MAP_FULL],
      c[PS_CTR_RUNTIME_MAP_FULL], ps.user_stack_lost, ps.kernel_stack_lost, ps.truncated,
      ms.stacks_missing, ms.thread_states, ms.thread_states_max, ss.frames, ss.no_mapping,
      ss.no_elf, ss.no_symbol, ss.kernel_no_symbol, processes.vanished());
  if (config.print_summary) {
    std::cout << "parascope: busiest processes (" << bpf->event_name() << ", "
              << config.sampling_frequency_hz << " Hz, " << bpf->num_cpus() << " CPUs)\n";
    summary.Print(std::cout, config.summary_processes, config.summary_functions);
    if (!config.output_dir.empty()) {
      std::cout << "\nprofiles written to " << config.output_dir
                << "/<pid>/<type>-<t0 unix ms>.pb.gz (open with: pprof -top FILE)\n";
    }
    std::cout.flush();
  }
  return absl::OkStatus();
}

}  // namespace parascope
