// One drained on-CPU aggregate entry, decoded from abi.h's ps_oncpu_key/value and its stacks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/proc/process_table.h"

namespace parascope {

struct OnCpuRecord {
  proc::ProcessKey process;      // (tgid, group leader start_boottime ns)
  uint32_t tid = 0;
  std::string thread_name;       // task comm at the first sample of the window
  std::vector<uint64_t> kernel_ips;  // leaf first; empty when the sample was in user mode
  std::vector<uint64_t> user_ips;    // leaf first; empty for kernel threads
  int32_t kernel_stack_err = 0;  // 0, or -errno when the kernel stack was lost
  int32_t user_stack_err = 0;    // 0, or -errno when the user stack was lost
  uint64_t count = 0;            // samples
  uint64_t period_sum = 0;       // sum of sample periods, in the event's unit
};

}  // namespace parascope
