// Root tests of the on-CPU BPF program itself: it loads and verifies on this kernel, the pid
// filter holds, and the double-buffered drain loses nothing.
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <thread>

#include "agent/bpf/programs.h"
#include "agent/collect/window_clock.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {

TEST_CASE("bpf: oncpu program loads and filters by tgid and drains every sample", "[root][bpf]") {
  if (!RequireRoot()) return;
  // A busy child process to sample; its tgid is the only one in the filter.
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    volatile uint64_t x = 0;
    for (;;) x = x + 1;
  }
  BpfPrograms::Options opts;
  opts.frequency_hz = 997;
  opts.tgids = {static_cast<uint32_t>(child)};
  opts.collect_interval = absl::Seconds(1);
  opts.sched = false;
  opts.offcpu = false;
  auto prog = BpfPrograms::Create(opts);
  if (!prog.ok()) kill(child, SIGKILL);
  REQUIRE(prog.ok());

  uint64_t drained = 0, windows = 0;
  int64_t start = MonotonicNowNs();
  // Drain repeatedly while sampling continues: samples taken during a drain must appear in a
  // later drain, so the sum over drains equals the program's own count.
  while (MonotonicNowNs() - start < 1500000000LL) {
    auto data = (*prog)->Drain(false);
    REQUIRE(data.ok());
    for (const auto& r : data->oncpu) {
      CHECK(r.process.tgid == static_cast<uint32_t>(child));
      CHECK(r.tid == static_cast<uint32_t>(child));
      // cpu-clock: every sample's period is NSEC_PER_SEC / 997 ns (perf_swevent_init_hrtimer).
      if ((*prog)->period_is_ns()) CHECK(r.period_sum == r.count * 1003009);
      drained += r.count;
    }
    ++windows;
    usleep(50000);  // pacing only: correctness does not depend on it
  }
  auto last = (*prog)->Drain(true);
  REQUIRE(last.ok());
  for (const auto& r : last->oncpu) drained += r.count;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);

  BpfCounters c = (*prog)->Counters();
  INFO("windows=" << windows << " drained=" << drained << " taken=" << c[PS_CTR_SAMPLES]
                  << " filtered=" << c[PS_CTR_SAMPLES_FILTERED]);
  CHECK(c[PS_CTR_AGG_MAP_FULL] == 0);
  CHECK(drained == c[PS_CTR_SAMPLES]);
  // 1.5 s of one busy thread at 997 Hz: about 1500 samples (the child shares 2 CPUs).
  CHECK(drained > 700);
  CHECK(drained < 1700);
}

}  // namespace parascope::testing
