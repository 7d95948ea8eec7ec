// What one window's drain yields, decoded from abi.h's maps: on-CPU sample aggregates, off-CPU
// intervals and exact on-CPU time per process.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "agent/proc/process_table.h"

namespace parascope {

// Thread states of off-CPU time (abi.h PS_STATE_*; SPEC section 2 label `state`).
enum class ThreadState : uint32_t { kRunning = 0, kRunnable = 1, kSleeping = 2, kUninterruptible = 3 };
// "running", "runnable", "sleeping", "uninterruptible" ("unknown" for anything else).
const char* ThreadStateName(uint32_t state);

// Stacks of one sample or interval. Frames leaf first.
struct StackPair {
  std::vector<uint64_t> kernel_ips;  // empty when the sample was in user mode
  std::vector<uint64_t> user_ips;    // empty for kernel threads
  int32_t kernel_stack_err = 0;      // 0, or -errno when the kernel stack was lost
  int32_t user_stack_err = 0;        // 0, or -errno when the user stack was lost
  uint32_t user_unwind = 0;          // how the user-stack walk ended: PS_UNWIND_* (bpf/abi.h)
};

// One drained on-CPU aggregate entry (ps_oncpu_key/value).
struct OnCpuRecord {
  proc::ProcessKey process;      // (tgid, group leader start_boottime ns)
  uint32_t tid = 0;
  std::string thread_name;       // task comm at the first sample of the window
  StackPair stacks;
  uint32_t parallelism = 1;      // threads of the group on a CPU at the sample instant (>= 1)
  uint64_t group = 0;            // the group parallelism was counted over (bpf/abi.h PS_GROUP_*:
                                 // tgid, cgroup v2 id or tree root tgid)
  bool parallelism_unknown = false;  // some CPU's task was not yet known (attached mid-run)
  uint64_t count = 0;            // samples
  uint64_t period_sum = 0;       // sum of sample periods, in the event's unit
};

// Off-CPU time of one thread with one stack and state in one window (ps_offcpu_key/value, or a
// part of an interval crossing a window boundary attributed by the daemon).
struct OffCpuRecord {
  proc::ProcessKey process;
  uint32_t tid = 0;
  std::string thread_name;
  StackPair stacks;              // captured at switch-out
  uint32_t state = 0;            // PS_STATE_RUNNABLE, _SLEEPING or _UNINTERRUPTIBLE
  uint64_t ns = 0;               // each interval (part) times its weight (bpf/abi.h)
  uint64_t count = 0;            // intervals or interval parts, each times its weight
  // The part of ns from intervals of weight 2 or more, and their length once each (bpf/abi.h
  // ps_offcpu_value): Collector scales that part to the thread's exact total, then clears both.
  uint64_t sampled_ns = 0;
  uint64_t sampled_raw_ns = 0;
};

// Exact on-CPU time of one process in one window, from sched_switch accounting.
struct RuntimeRecord {
  proc::ProcessKey process;
  uint64_t ns = 0;
};

struct WindowData {
  int64_t start_mono_ns = 0;  // window [start, end) on CLOCK_MONOTONIC
  int64_t end_mono_ns = 0;
  std::vector<OnCpuRecord> oncpu;
  std::vector<OffCpuRecord> offcpu;
  std::vector<RuntimeRecord> runtime;
};

}  // namespace parascope
