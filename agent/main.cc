// parascope: flags -> Config -> Validate -> RunAgent. Exit codes (SPEC section 7): 0 clean stop,
// 1 runtime or environment failure, 2 usage error.
#include <signal.h>

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/config/config.h"
#include "agent/config/flags.h"
#include "agent/util/log.h"

ABSL_FLAG(int32_t, sampling_frequency, 19, "on-CPU samples per second per CPU (Hz)");
ABSL_FLAG(absl::Duration, collect_interval, absl::Seconds(15),
          "window length: one profile per process per window");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "stop after this long, flushing the last partial window (0: until SIGINT/SIGTERM)");
ABSL_FLAG(std::string, pid, "", "profile only these processes, e.g. 123,456 (default: all)");
ABSL_FLAG(std::string, profiles, "cpu,off_cpu,wall,latency",
          "profile types to build: cpu, off_cpu, wall, latency (comma-separated)");
ABSL_FLAG(absl::Duration, off_cpu_min_duration, absl::ZeroDuration(),
          "ignore off-CPU intervals shorter than this");
ABSL_FLAG(std::string, output_dir, "",
          "write DIR/<pid>/<profile>-<t0 unix ms>.pb.gz (gzip pprof) each window");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(bool, print_summary, false,
          "at exit, print the busiest processes and their top functions by CPU");
ABSL_FLAG(int32_t, summary_processes, 5, "processes shown by --print-summary");
ABSL_FLAG(int32_t, summary_functions, 8, "functions per process shown by --print-summary");

namespace {

int UsageError(const std::string& message) {
  std::fprintf(stderr, "parascope: %s\nRun 'parascope --help' for the flags.\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Block the stop signals before any thread exists; the agent waits for them with sigtimedwait.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  sigprocmask(SIG_BLOCK, &stop_signals, nullptr);

  std::vector<std::string> positional;
  bool help = false;
  if (absl::Status s = parascope::ParseFlags(argc, argv, &positional, &help); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (help) {
    std::cout << parascope::FlagsHelp("parascope", "agent/main.cc");
    return 0;
  }
  if (!positional.empty()) return UsageError("unexpected argument '" + positional[0] + "'");

  parascope::Config config;
  config.sampling_frequency_hz = absl::GetFlag(FLAGS_sampling_frequency);
  config.collect_interval = absl::GetFlag(FLAGS_collect_interval);
  config.duration = absl::GetFlag(FLAGS_duration);
  auto pids = parascope::ParsePidList(absl::GetFlag(FLAGS_pid));
  if (!pids.ok()) return UsageError("--pid: " + std::string(pids.status().message()));
  config.pids = *pids;
  auto profiles = parascope::ParseProfileTypes(absl::GetFlag(FLAGS_profiles));
  if (!profiles.ok()) return UsageError("--profiles: " + std::string(profiles.status().message()));
  config.profiles = *profiles;
  config.off_cpu_min_duration = absl::GetFlag(FLAGS_off_cpu_min_duration);
  config.output_dir = absl::GetFlag(FLAGS_output_dir);
  if (!parascope::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &config.log_level)) {
    return UsageError("--log-level: expected debug, info, warning or error, got '" +
                      absl::GetFlag(FLAGS_log_level) + "'");
  }
  config.print_summary = absl::GetFlag(FLAGS_print_summary);
  config.summary_processes = absl::GetFlag(FLAGS_summary_processes);
  config.summary_functions = absl::GetFlag(FLAGS_summary_functions);
  if (absl::Status s = config.Validate(); !s.ok()) return UsageError(std::string(s.message()));

  parascope::SetLogLevel(config.log_level);
  if (absl::Status s = parascope::RunAgent(config); !s.ok()) {
    parascope::Log(parascope::LogLevel::kError, "%s", std::string(s.message()));
    return 1;
  }
  return 0;
}
