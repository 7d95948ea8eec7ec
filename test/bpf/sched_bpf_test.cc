// Root tests of the scheduler programs themselves (bpf/sched.bpf.c): both sched_switch variants
// load and record sleeps on this kernel (the 3-argument one is the fallback for kernels before
// 5.18, forced here), the start-up probes pass, and the parallelism counts that the sampler only
// reads stay within the threads that exist.
#include <bpf/btf.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <set>
#include <string>

#include "agent/bpf/probe.h"
#include "agent/bpf/programs.h"
#include "agent/collect/window_clock.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

bool HasProgram(const BpfPrograms& p, const std::string& name) {
  for (const auto& s : p.ProgramRunTimes()) {
    if (s.name == name) return true;
  }
  return false;
}

void* Nap5ms(void*) {
  for (;;) {
    timespec ts{0, 5000000};
    nanosleep(&ts, nullptr);
  }
  return nullptr;
}

void* Spin(void*) {
  volatile uint64_t x = 0;
  for (;;) x = x + 1;
  return nullptr;
}

}  // namespace

TEST_CASE("bpf: the start-up probes pass on this kernel", "[root][bpf]") {
  if (!RequireRoot()) return;
  absl::Status st = ProbeBpfEnvironment();
  INFO(st.message());
  CHECK(st.ok());
}

TEST_CASE(
    "bpf: sched_switch loads as the kernel's BTF says, as the 3-argument fallback and with "
    "thread states in the ps_threads hash, each recording the time of a thread asleep "
    "since before attach and of one started after",
    "[root][bpf]") {
  if (!RequireRoot()) return;
  btf* vmlinux = btf__load_vmlinux_btf();
  REQUIRE(vmlinux != nullptr);
  const int kernel_args = TracepointArgCount(vmlinux, "sched_switch");
  // Task storage for tracing programs (Linux 5.13+), as the agent decides it.
  const bool kernel_task_storage = StructHasMember(vmlinux, "task_struct", "bpf_storage");
  btf__free(vmlinux);
  REQUIRE(kernel_args >= 3);

  struct Variant {
    int args;
    bool hash;
  };
  for (Variant v : {Variant{0, false}, Variant{3, false}, Variant{0, true}}) {
    const int args = v.args;
    const bool with_state = (args == 0 ? kernel_args : args) >= 4;
    const bool storage = kernel_task_storage && !v.hash;
    INFO("sched_switch_args=" << args << " (kernel: " << kernel_args
                              << ") thread_state_hash=" << v.hash);
    // A child asleep in read() from before attach; after attach it starts a second thread, and
    // both sleep 5 ms at a time: off-CPU in TASK_INTERRUPTIBLE nearly all the time. The first
    // thread's state comes from the seeding iterator, the second's from its creation (task
    // storage: ps_thread_new) or its first switch-out (hash).
    int go[2];
    REQUIRE(pipe(go) == 0);
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      char b;
      if (read(go[0], &b, 1) == 1) {
        pthread_t t;
        pthread_create(&t, nullptr, Nap5ms, nullptr);
      }
      Nap5ms(nullptr);
    }
    close(go[0]);
    BpfPrograms::Options opts;
    opts.frequency_hz = 99;
    opts.tgids = {static_cast<uint32_t>(child)};
    opts.collect_interval = absl::Seconds(1);
    opts.sched = true;
    opts.offcpu = true;
    opts.offcpu_stack_rate = 0;
    opts.sched_switch_args = args;
    opts.thread_state_hash = v.hash;
    auto prog = BpfPrograms::Create(opts);
    if (!prog.ok()) kill(child, SIGKILL);
    INFO(prog.status().message());
    REQUIRE(prog.ok());
    REQUIRE(write(go[1], "g", 1) == 1);
    close(go[1]);
    CHECK(HasProgram(**prog, with_state ? "ps_sched_switch" : "ps_sched_switch3"));
    CHECK(!HasProgram(**prog, with_state ? "ps_sched_switch3" : "ps_sched_switch"));
    CHECK((*prog)->thread_state_store() == (storage ? "task_storage" : "hash"));
    CHECK(HasProgram(**prog, "ps_dump_threads") == storage);
    CHECK(HasProgram(**prog, "ps_thread_new") == storage);

    const int64_t t0 = MonotonicNowNs();
    usleep(1200000);
    auto data = (*prog)->Drain(true);
    const double elapsed_ns = static_cast<double>(MonotonicNowNs() - t0);
    kill(child, SIGKILL);
    waitpid(child, nullptr, 0);
    REQUIRE(data.ok());
    // By thread: the first (tid == child) and the one started after attach.
    uint64_t sleeping_ns[2] = {0, 0}, other_ns[2] = {0, 0};
    std::set<uint32_t> new_tids;
    for (const OffCpuRecord& r : data->offcpu) {
      CHECK(r.process.tgid == static_cast<uint32_t>(child));
      const int i = r.tid == static_cast<uint32_t>(child) ? 0 : 1;
      if (i == 1) new_tids.insert(r.tid);
      (r.state == PS_STATE_SLEEPING ? sleeping_ns[i] : other_ns[i]) += r.ns;
    }
    BpfCounters c = (*prog)->Counters();
    INFO("first thread: sleeping_ns=" << sleeping_ns[0] << " other_ns=" << other_ns[0]
                                      << "; second: sleeping_ns=" << sleeping_ns[1]
                                      << " other_ns=" << other_ns[1] << " tids=" << new_tids.size()
                                      << "; elapsed_ns=" << elapsed_ns
                                      << " switches=" << c[PS_CTR_SWITCHES]);
    // Asleep except for the instants they run (and run-queue waits on this shared machine); the
    // second from a moment after t0.
    CHECK(new_tids.size() == 1);
    for (int i : {0, 1}) {
      CHECK(sleeping_ns[i] > 0.7 * elapsed_ns);
      CHECK(sleeping_ns[i] + other_ns[i] < 1.05 * elapsed_ns);
    }
    CHECK(c[PS_CTR_SWITCHES] > 100);
    CHECK(c[PS_CTR_THREAD_MAP_FULL] == 0);
    CHECK(c[PS_CTR_MAP_BUSY] == 0);
  }
}

TEST_CASE("bpf: a two-thread process busy since before attach counts parallelism 1-2, never "
          "more, without the sampler inserting",
          "[root][bpf]") {
  if (!RequireRoot()) return;
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pthread_t t;
    pthread_create(&t, nullptr, Spin, nullptr);
    Spin(nullptr);
  }
  usleep(200000);  // both threads running before the programs attach
  BpfPrograms::Options opts;
  opts.frequency_hz = 199;
  opts.tgids = {static_cast<uint32_t>(child)};
  opts.collect_interval = absl::Seconds(1);
  opts.sched = true;
  opts.offcpu = false;
  auto prog = BpfPrograms::Create(opts);
  if (!prog.ok()) kill(child, SIGKILL);
  INFO(prog.status().message());
  REQUIRE(prog.ok());
  usleep(1500000);
  auto data = (*prog)->Drain(true);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  REQUIRE(data.ok());
  uint64_t samples = 0, max_parallelism = 0;
  for (const OnCpuRecord& r : data->oncpu) {
    samples += r.count;
    max_parallelism = std::max<uint64_t>(max_parallelism, r.parallelism);
  }
  BpfCounters c = (*prog)->Counters();
  INFO("samples=" << samples << " max_parallelism=" << max_parallelism
                  << " uncounted=" << c[PS_CTR_RUNNING_UNCOUNTED]);
  CHECK(samples > 100);
  // The process had its parallelism entry from the seeding iterator, so the sampler's first
  // sights of the CPUs could count its threads without inserting.
  CHECK(c[PS_CTR_RUNNING_UNCOUNTED] == 0);
  CHECK(max_parallelism == 2);
  CHECK(c[PS_CTR_RUNNING_MAP_FULL] == 0);
  CHECK(c[PS_CTR_MAP_BUSY] == 0);
}

}  // namespace parascope::testing
