// Run-long summary of profiles for humans (`make run`, --print-summary): the busiest processes,
// their top functions by CPU and by latency side by side, and their parallelism histogram. Not
// on any hot path.
#pragma once

#include <cstdint>
#include <map>
#include <ostream>
#include <string>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "agent/profile/profile_set.h"

namespace parascope {

class RunSummary {
 public:
  // Adds a finished profile of any type; process_cpu ranks by cpu/nanoseconds, latency by
  // latency/nanoseconds, other types are ignored. Functions are the innermost Line of each
  // Location; frames without a function show as their hex address. A group's profiles
  // (p.group) make one entry per group; a cgroup group's process_cpu only counts there, not in
  // the share of all samples (its members' own profiles do).
  void Add(const ProcessProfile& p);

  // Prints the `max_processes` busiest processes by CPU, each with its `max_functions` top
  // functions by self CPU and by self latency (self% / total% of the process's value), and the
  // share of its busy wall time spent at each parallelism.
  void Print(std::ostream& os, int max_processes, int max_functions) const;

 private:
  struct Ranking {
    int64_t total = 0;
    absl::flat_hash_map<std::string, int64_t> self;
    absl::flat_hash_map<std::string, int64_t> inclusive;
    void Add(const perftools::profiles::Profile& prof, int value_index);
  };
  struct Process {
    uint32_t tgid = 0;
    std::string name;
    ProfileGroup group;  // a group's entry (--latency-group=cgroup|tree)
    size_t processes = 0;  // a group's distinct member processes (label `process`/`pid`)
    absl::flat_hash_map<uint64_t, bool> pids;
    Ranking cpu;
    Ranking latency;
    std::map<std::string, int64_t> parallelism;  // bucket label -> latency ns
    // A group's CPU and latency by the `process` label (the comm of each member).
    std::map<std::string, int64_t> cpu_by_process, latency_by_process;
  };
  int64_t cpu_total_ = 0;
  // By (process, group kind, group id): a cgroup's group entry and its members' own entries
  // are apart.
  absl::flat_hash_map<std::tuple<proc::ProcessKey, int, uint64_t>, Process> processes_;
};

}  // namespace parascope
