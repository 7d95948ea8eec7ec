// Run-long summary of profiles for humans: busiest processes and their top functions by a value
// (e.g. cpu ns). Used by `make run` (--print-summary); not on any hot path.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "agent/profile/cpu_profiles.h"

namespace parascope {

class ProfileSummary {
 public:
  // value_index: the sample value to rank by (1 = cpu/nanoseconds in process_cpu).
  explicit ProfileSummary(int value_index) : value_index_(value_index) {}

  // Adds a finished profile. Function shares are by the innermost Line of each Location; frames
  // without a function show as their hex address.
  void Add(const ProcessProfile& p);

  // Prints the `max_processes` busiest processes, each with its `max_functions` top functions by
  // self value, with self and total (inclusive) percentages of the process's value.
  void Print(std::ostream& os, int max_processes, int max_functions) const;

  int64_t total() const { return total_; }

 private:
  struct Process {
    uint32_t tgid = 0;
    std::string name;
    int64_t total = 0;
    absl::flat_hash_map<std::string, int64_t> self;
    absl::flat_hash_map<std::string, int64_t> inclusive;
  };
  int value_index_;
  int64_t total_ = 0;
  absl::flat_hash_map<proc::ProcessKey, Process> processes_;
};

}  // namespace parascope
