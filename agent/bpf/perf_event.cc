#include "agent/bpf/perf_event.h"

#include <linux/perf_event.h>
#include <sys/syscall.h>

#include <cerrno>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "agent/proc/read_file.h"
#include "agent/util/status.h"

namespace parascope {

absl::StatusOr<std::vector<int>> ParseCpuList(absl::string_view text) {
  std::vector<int> cpus;
  absl::string_view t = absl::StripAsciiWhitespace(text);
  if (t.empty()) return cpus;
  for (absl::string_view part : absl::StrSplit(t, ',')) {
    std::pair<absl::string_view, absl::string_view> r = absl::StrSplit(part, absl::MaxSplits('-', 1));
    int lo = 0, hi = 0;
    if (!absl::SimpleAtoi(r.first, &lo) || lo < 0) {
      return absl::InvalidArgumentError(absl::StrCat("bad CPU list item '", part, "'"));
    }
    hi = lo;
    if (!r.second.empty() && (!absl::SimpleAtoi(r.second, &hi) || hi < lo)) {
      return absl::InvalidArgumentError(absl::StrCat("bad CPU list item '", part, "'"));
    }
    for (int c = lo; c <= hi; ++c) cpus.push_back(c);
  }
  return cpus;
}

absl::StatusOr<std::vector<int>> OnlineCpus() {
  PS_ASSIGN_OR_RETURN(std::string text, proc::ReadFileToString("/sys/devices/system/cpu/online"));
  return ParseCpuList(text);
}

namespace {

int PerfEventOpen(perf_event_attr* attr, int pid, int cpu) {
  return static_cast<int>(
      syscall(SYS_perf_event_open, attr, pid, cpu, -1, PERF_FLAG_FD_CLOEXEC));
}

perf_event_attr SamplingAttr(uint32_t type, uint64_t config, int frequency_hz) {
  perf_event_attr attr{};
  attr.size = sizeof(attr);
  attr.type = type;
  attr.config = config;
  attr.freq = 1;
  attr.sample_freq = frequency_hz;
  return attr;
}

absl::Status PerfError(int err, const std::string& event, int cpu) {
  if (err == EACCES || err == EPERM) {
    return absl::PermissionDeniedError(absl::StrCat(
        "perf_event_open(", event, ", cpu ", cpu,
        ") denied: run as root or grant CAP_PERFMON and CAP_BPF (CAP_SYS_ADMIN before Linux "
        "5.8), or lower kernel.perf_event_paranoid"));
  }
  return ErrnoStatus(err, absl::StrCat("perf_event_open(", event, ", cpu ", cpu, ")"));
}

}  // namespace

absl::StatusOr<SamplingEvents> OpenSamplingEvents(int frequency_hz) {
  PS_ASSIGN_OR_RETURN(std::vector<int> cpus, OnlineCpus());
  if (cpus.empty()) return absl::FailedPreconditionError("no online CPUs");
  SamplingEvents ev;
  ev.cpus = cpus;
  // Try the hardware cycle counter on the first CPU; fall back to the cpu-clock software event.
  perf_event_attr attr = SamplingAttr(PERF_TYPE_HARDWARE, PERF_COUNT_HW_CPU_CYCLES, frequency_hz);
  ev.name = "cycles";
  int fd = PerfEventOpen(&attr, -1, cpus[0]);
  if (fd < 0) {
    int err = errno;
    if (err != ENOENT && err != EOPNOTSUPP && err != ENODEV && err != EINVAL) {
      return PerfError(err, ev.name, cpus[0]);
    }
    attr = SamplingAttr(PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, frequency_hz);
    ev.name = "cpu-clock";
    ev.period_is_ns = true;
    fd = PerfEventOpen(&attr, -1, cpus[0]);
    if (fd < 0) return PerfError(errno, ev.name, cpus[0]);
  }
  ev.fds.emplace_back(fd);
  for (size_t i = 1; i < cpus.size(); ++i) {
    fd = PerfEventOpen(&attr, -1, cpus[i]);
    if (fd < 0) return PerfError(errno, ev.name, cpus[i]);
    ev.fds.emplace_back(fd);
  }
  return ev;
}

}  // namespace parascope
