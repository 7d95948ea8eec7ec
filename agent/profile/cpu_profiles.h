// Assembles per-process `process_cpu` profiles (SPEC section 2) from one window's on-CPU records.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/collect/oncpu_record.h"
#include "agent/profile/pprof_builder.h"
#include "agent/symbolize/stack_symbolizer.h"
#include "proto/profile.pb.h"

namespace parascope {

// A finished profile of one process for one window.
struct ProcessProfile {
  proc::ProcessKey process;
  std::string process_name;  // comm of the process, "" if it could not be read
  std::string type;          // SPEC `__name__`, e.g. "process_cpu"
  perftools::profiles::Profile profile;
};

struct CpuProfileOptions {
  // P of SPEC section 2: round(1e9 / frequency) ns.
  int64_t period_ns = 0;
  // True when the perf event counts time in ns (cpu-clock): then a sample's cpu value is its
  // actual period (ps_oncpu_value.period_sum); otherwise (cycles) count * period_ns.
  bool period_is_ns = true;
  // Added to each profile as a comment, e.g. "event=cpu-clock frequency=499Hz".
  std::string description;
  // Add `thread_name` (string) and `tid` (numeric) sample labels (local files; SPEC section 3).
  bool thread_labels = true;
};

// Counters of stack quality (monotonic), exported as metrics.
struct CpuProfileStats {
  uint64_t samples = 0;               // samples placed in profiles
  uint64_t user_stack_lost = 0;       // samples whose user stack was lost ([unknown] frame)
  uint64_t kernel_stack_lost = 0;     // samples whose kernel stack was lost
  uint64_t truncated = 0;             // samples whose stack hit PS_MAX_STACK_DEPTH ([truncated])
};

// Collects records of one window into one PprofBuilder per process. Not thread-safe.
class CpuProfileSet {
 public:
  CpuProfileSet(CpuProfileOptions options, StackSymbolizer* symbolizer,
                proc::ProcessTable* processes);

  void Add(const OnCpuRecord& record);
  // Builds every process's profile for the window [t0_unix_ns, t0_unix_ns + duration_ns) and
  // resets the set for the next window.
  std::vector<ProcessProfile> Finish(int64_t t0_unix_ns, int64_t duration_ns);

  const CpuProfileStats& stats() const { return stats_; }

  static constexpr char kType[] = "process_cpu";

 private:
  struct PerProcess {
    std::unique_ptr<PprofBuilder> builder;
    std::string name;
  };
  PerProcess& ForProcess(const OnCpuRecord& record);

  CpuProfileOptions options_;
  StackSymbolizer* symbolizer_;
  proc::ProcessTable* processes_;
  CpuProfileStats stats_;
  absl::flat_hash_map<proc::ProcessKey, PerProcess> per_process_;
  std::vector<uint64_t> scratch_;
};

}  // namespace parascope
