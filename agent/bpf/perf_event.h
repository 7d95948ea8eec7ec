// perf_event_open(2) for on-CPU sampling, and small fd/CPU helpers.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace parascope {

// Owns one file descriptor; closes it on destruction.
class UniqueFd {
 public:
  UniqueFd() = default;
  explicit UniqueFd(int fd) : fd_(fd) {}
  UniqueFd(UniqueFd&& o) noexcept : fd_(o.release()) {}
  UniqueFd& operator=(UniqueFd&& o) noexcept {
    reset(o.release());
    return *this;
  }
  ~UniqueFd() { reset(); }
  int get() const { return fd_; }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }
  void reset(int fd = -1) {
    if (fd_ >= 0) close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

// Parses a kernel CPU list such as "0-3,8,10-11" (Documentation/admin-guide/cputopology.rst).
absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text);
// Online CPUs from /sys/devices/system/cpu/online.
absl::StatusOr<std::vector<int>> OnlineCpus();

// One sampling event per online CPU, all of the same kind.
struct SamplingEvents {
  std::string name;           // "cycles" or "cpu-clock"
  bool period_is_ns = false;  // cpu-clock's period counts ns; cycles' counts cycles
  std::vector<int> cpus;
  std::vector<UniqueFd> fds;  // fds[i] samples cpus[i]
};

// Opens a frequency-mode sampling event (attr.freq = 1, sample_freq = frequency_hz) on every
// online CPU for all tasks (pid = -1): PERF_COUNT_HW_CPU_CYCLES where the PMU has it, else
// PERF_COUNT_SW_CPU_CLOCK (VMs without a virtual PMU: ENOENT/EOPNOTSUPP/ENODEV on cycles).
// Errors: PermissionDenied naming CAP_PERFMON and kernel.perf_event_paranoid
// (Documentation/admin-guide/perf-security.rst), others from errno with the CPU.
absl::StatusOr<SamplingEvents> OpenSamplingEvents(int frequency_hz);

}  // namespace parascope
