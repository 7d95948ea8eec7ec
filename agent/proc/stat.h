// Parsing of /proc/<pid>/stat text and clock-tick conversions. Pure functions: no file access.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace parascope::proc {

// USER_HZ, the unit of clock_t values in /proc ("clock ticks"). Fixed by the kernel ABI at 100 on
// every architecture this agent targets (include/asm-generic/param.h); sysconf(_SC_CLK_TCK)
// reports it. Independent of the kernel's internal CONFIG_HZ.
inline constexpr uint64_t kUserHz = 100;
inline constexpr uint64_t kNsPerTick = 1'000'000'000 / kUserHz;  // 10'000'000 ns

// The fields of /proc/<pid>/stat the agent uses. Field numbers are 1-based as in man 5 proc;
// the line is printed by do_task_stat() in fs/proc/array.c.
struct ProcStat {
  int32_t pid = 0;   // field 1 (a tgid for /proc/<pid>/stat, a tid under task/<tid>/)
  std::string comm;  // field 2, between the first '(' and the LAST ')' (may contain ") " etc.)
  char state = '?';  // field 3, e.g. 'R', 'S', 'D', 'Z'
  int32_t ppid = 0;  // field 4
  uint64_t utime_ticks = 0, stime_ticks = 0;  // fields 14, 15, in clock ticks (USER_HZ)
  int64_t num_threads = 0;                    // field 20
  // Field 22: task_struct::start_boottime converted by nsec_to_clock_t(), clock ticks since boot
  // (CLOCK_BOOTTIME; plus the time namespace's boottime offset for readers inside one).
  uint64_t start_time_ticks = 0;
};

// Parses one /proc/<pid>/stat line (a trailing newline is allowed). Needs at least fields 1..22.
// Returns InvalidArgument when the parentheses around comm are missing, a field is missing, or a
// used field is not a number.
absl::StatusOr<ProcStat> ParseStat(absl::string_view text);

// Converts clock ticks (USER_HZ) to nanoseconds: ticks * 10'000'000. Saturates at UINT64_MAX.
uint64_t TicksToNs(uint64_t ticks);

// Converts nanoseconds since boot to clock ticks the way fs/proc/array.c computes start_time:
// nsec_to_clock_t() (kernel/time/time.c), i.e. floor(boot_ns / 10'000'000).
uint64_t BootNsToTicks(uint64_t boot_ns);

}  // namespace parascope::proc
