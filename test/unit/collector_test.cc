// collect::Collector over recorded map contents: what bpf/sched.bpf.c and bpf/oncpu.bpf.c would
// have left in the maps at each window boundary, written by hand from their rules (bpf/abi.h
// ps_thread_state and ps_cpu_state; sched.bpf.c ps_switch_in, ps_switch_out, ps_add_runtime),
// and the exact nanoseconds the daemon must attribute to each window.
#include "agent/collect/collector.h"

#include <algorithm>
#include <array>
#include <catch2/catch.hpp>
#include <cerrno>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "agent/collect/map_reader.h"
#include "bpf/abi.h"

namespace parascope::collect {
namespace {

// Window starts on the ktime clock (CLOCK_MONOTONIC ns): the agent attached at kT1, and the
// daemon closes windows at kT2, kT3, ... Window n is [kT<n>, kT<n+1>) and fills buffer
// (n - 1) % 2.
constexpr int64_t kT1 = 1'000'000'000;
constexpr int64_t kT2 = 2'000'000'000;
constexpr int64_t kT3 = 3'000'000'000;
constexpr int64_t kT4 = 4'000'000'000;
constexpr int64_t kT5 = 5'000'000'000;
constexpr int64_t kT6 = 6'000'000'000;

// Two processes: (tgid, group leader start_boottime ns, exec id).
constexpr proc::ProcessKey kProcA{100, 11'000'000, 7};
constexpr proc::ProcessKey kProcB{200, 22'000'000, 9};

// A stack as recorded in ps_stacks<N>: `len` as BPF wrote it, `ips` the frames that exist.
struct RecordedStack {
  uint32_t len = 0;
  uint32_t flags = 0;
  std::vector<uint64_t> ips;
};

RecordedStack Stack(std::vector<uint64_t> ips, uint32_t flags = 0) {
  RecordedStack s;
  s.len = static_cast<uint32_t>(ips.size());
  s.flags = flags;
  s.ips = std::move(ips);
  return s;
}

// MapReader over recorded contents. Drain* empties the buffer's map (read + delete, as the BPF
// reader does); ps_threads and ps_cpu_state are only read, and the test changes them between
// windows the way the programs would.
class FakeMapReader : public MapReader {
 public:
  struct Buffer {
    std::map<uint64_t, RecordedStack> stacks;
    std::vector<std::pair<ps_oncpu_key, ps_oncpu_value>> oncpu;
    std::vector<std::pair<ps_offcpu_key, ps_offcpu_value>> offcpu;
    std::vector<std::pair<ps_runtime_key, uint64_t>> runtime;
  };
  std::array<Buffer, PS_NUM_BUFFERS> buffers;
  std::map<uint32_t, ps_thread_state> threads;  // ps_threads, key tid
  std::vector<ps_cpu_state> cpus;               // ps_cpu_state, one per CPU
  // Calls of each method, to check which maps were read.
  int stack_drains = 0, oncpu_drains = 0, offcpu_drains = 0, runtime_drains = 0;
  int thread_visits = 0, cpu_reads = 0;

  void DrainStacks(uint32_t buffer,
                   absl::FunctionRef<void(uint64_t, const ps_stack&)> fn) override {
    ++stack_drains;
    std::map<uint64_t, RecordedStack> drained = std::move(buffers.at(buffer).stacks);
    buffers.at(buffer).stacks.clear();
    for (const auto& [hash, rs] : drained) {
      ps_stack st{};
      st.len = rs.len;
      st.flags = rs.flags;
      for (size_t i = 0; i < rs.ips.size() && i < PS_MAX_STACK_DEPTH; ++i) st.ips[i] = rs.ips[i];
      fn(hash, st);
    }
  }
  void DrainOnCpu(uint32_t buffer,
                  absl::FunctionRef<void(const ps_oncpu_key&, const ps_oncpu_value&)> fn) override {
    ++oncpu_drains;
    auto drained = std::move(buffers.at(buffer).oncpu);
    buffers.at(buffer).oncpu.clear();
    for (const auto& [k, v] : drained) fn(k, v);
  }
  void DrainOffCpu(
      uint32_t buffer,
      absl::FunctionRef<void(const ps_offcpu_key&, const ps_offcpu_value&)> fn) override {
    ++offcpu_drains;
    auto drained = std::move(buffers.at(buffer).offcpu);
    buffers.at(buffer).offcpu.clear();
    for (const auto& [k, v] : drained) fn(k, v);
  }
  void DrainRuntime(uint32_t buffer,
                    absl::FunctionRef<void(const ps_runtime_key&, uint64_t)> fn) override {
    ++runtime_drains;
    auto drained = std::move(buffers.at(buffer).runtime);
    buffers.at(buffer).runtime.clear();
    for (const auto& [k, ns] : drained) fn(k, ns);
  }
  void VisitThreads(absl::FunctionRef<void(uint32_t, const ps_thread_state&)> fn) override {
    ++thread_visits;
    for (const auto& [tid, ts] : threads) fn(tid, ts);
  }
  std::vector<ps_cpu_state> ReadCpuStates() override {
    ++cpu_reads;
    return cpus;
  }
};

void SetComm(char* comm, const char* name) {
  std::memset(comm, 0, PS_TASK_COMM_LEN);
  std::memcpy(comm, name, std::min<size_t>(std::strlen(name), PS_TASK_COMM_LEN));
}

// A BPF record type (a map key, a thread state, a pending runtime) with its process fields (tgid,
// tgid_start_ns, exec_id) those of `p`, the others zero.
template <typename T>
T OfProcess(const proc::ProcessKey& p) {
  T r{};
  r.tgid = p.tgid;
  r.tgid_start_ns = p.start_boot_ns;
  r.exec_id = p.exec_id;
  return r;
}

// ps_threads entry of a thread of `p` switched out at out_ns with captured stacks (stack_weight
// and budget_weight 1), as ps_switch_out leaves it.
ps_thread_state SwitchedOut(const proc::ProcessKey& p, uint64_t out_ns, uint64_t kernel_stack,
                            uint64_t user_stack, uint32_t state = PS_STATE_SLEEPING) {
  ps_thread_state ts = OfProcess<ps_thread_state>(p);
  ts.out_ns = out_ns;
  ts.kernel_stack = kernel_stack;
  ts.user_stack = user_stack;
  ts.state = state;
  ts.stack_weight = 1;
  ts.budget_weight = 1;
  SetComm(ts.comm, "worker");
  return ts;
}

// What ps_switch_in does to a thread switched in at now_ns while the programs see window start
// ws_ns: an interval that began before ws_ns is copied to carry_* (carry_ws_ns = ws_ns), and the
// part from max(out_ns, ws_ns) is returned as the record BPF adds to ps_offcpu<buf>. The stacks
// here are captured with weights 1 and no minimum duration, so the weight is final at any length
// (bpf/abi.h ps_offcpu_weight_final) and always 1.
std::pair<ps_offcpu_key, ps_offcpu_value> SwitchIn(uint32_t tid, ps_thread_state* ts,
                                                   uint64_t now_ns, uint64_t ws_ns) {
  uint64_t start = ts->out_ns;
  if (ts->out_ns < ws_ns) {
    ts->carry_out_ns = ts->out_ns;
    ts->carry_user_stack = ts->user_stack;
    ts->carry_kernel_stack = ts->kernel_stack;
    ts->carry_user_stack_err = ts->user_stack_err;
    ts->carry_kernel_stack_err = ts->kernel_stack_err;
    ts->carry_state = ts->state;
    ts->carry_weight = 1;
    ts->carry_ws_ns = ws_ns;
    start = ws_ns;
  }
  ps_offcpu_key k{};
  k.tgid = ts->tgid;
  k.tid = tid;
  k.tgid_start_ns = ts->tgid_start_ns;
  k.exec_id = ts->exec_id;
  k.user_stack = ts->user_stack;
  k.kernel_stack = ts->kernel_stack;
  k.user_stack_err = ts->user_stack_err;
  k.kernel_stack_err = ts->kernel_stack_err;
  k.state = ts->state;
  ps_offcpu_value v{};
  v.ns = now_ns - start;
  v.count = 1;
  std::memcpy(v.comm, ts->comm, sizeof(v.comm));
  ts->out_ns = 0;
  return {k, v};
}

// ps_cpu_state of a CPU whose current task (a thread of p) is known and counted since in_ns.
ps_cpu_state Running(uint32_t tid, const proc::ProcessKey& p, uint64_t in_ns) {
  ps_cpu_state c{};
  c.tid = tid;
  c.tgid = p.tgid;
  c.tgid_start_ns = p.start_boot_ns;
  c.exec_id = p.exec_id;
  c.in_ns = in_ns;
  c.known = 1;
  c.counted = 1;
  return c;
}

ps_cpu_state Idle() {
  ps_cpu_state c{};
  c.known = 1;
  return c;
}

std::vector<OffCpuRecord> OffCpuOf(const WindowData& w, uint32_t tid) {
  std::vector<OffCpuRecord> out;
  for (const OffCpuRecord& r : w.offcpu) {
    if (r.tid == tid) out.push_back(r);
  }
  return out;
}

uint64_t OffCpuNs(const WindowData& w, uint32_t tid) {
  uint64_t ns = 0;
  for (const OffCpuRecord& r : OffCpuOf(w, tid)) ns += r.ns;
  return ns;
}

std::vector<uint64_t> RuntimeOf(const WindowData& w, const proc::ProcessKey& p) {
  std::vector<uint64_t> out;
  for (const RuntimeRecord& r : w.runtime) {
    if (r.process == p) out.push_back(r.ns);
  }
  return out;
}

uint64_t RuntimeNs(const WindowData& w, const proc::ProcessKey& p) {
  uint64_t ns = 0;
  for (uint64_t n : RuntimeOf(w, p)) ns += n;
  return ns;
}

constexpr uint64_t kKernelStack = 0x4b4b;
constexpr uint64_t kUserStack = 0x5555;
const std::vector<uint64_t> kKernelIps = {0xffffffff81000010, 0xffffffff81000020};
const std::vector<uint64_t> kUserIps = {0x401000, 0x402000, 0x403000};

// A BPF map key (ps_oncpu_key, ps_offcpu_key) of thread `tid` of process A: its identity
// fields set, the others zero.
template <typename Key>
Key KeyOfA(uint32_t tid) {
  Key k = OfProcess<Key>(kProcA);
  k.tid = tid;
  return k;
}

// An on-CPU entry of process A's thread `tid`: one sample of 10 ms whose kernel stack is
// `kernel_stack` (a stack id) and no user stack.
std::pair<ps_oncpu_key, ps_oncpu_value> OnCpuOfA(uint32_t tid, uint64_t kernel_stack) {
  ps_oncpu_key k = KeyOfA<ps_oncpu_key>(tid);
  k.kernel_stack = kernel_stack;
  k.parallelism = 1;
  ps_oncpu_value v{};
  v.count = 1;
  v.period_sum = 10'000'000;
  return std::make_pair(k, v);
}

}  // namespace

TEST_CASE("collector: an off-CPU interval crossing the window start is split at it", "[collect]") {
  // Ground truth: thread 11 of A was switched out (sleeping, stacks captured into ps_stacks0) at
  // 1.7 s and switched in at 2.0003 s, after the daemon had moved the programs to buffer 1 and
  // window start 2 s but before it read ps_threads. Off-CPU 300'300'000 ns in all: 300'000'000
  // before the boundary (window 1, attributed by the daemon from the carry_* copy) and 300'000
  // after it (window 2, recorded by BPF in ps_offcpu1).
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.buffers[0].stacks[kUserStack] = Stack(kUserIps, PS_UNWIND_COMPLETE);
  ps_thread_state ts = SwitchedOut(kProcA, 1'700'000'000, kKernelStack, kUserStack);
  maps.buffers[1].offcpu.push_back(SwitchIn(11, &ts, 2'000'300'000, kT2));
  maps.threads[11] = ts;

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(w1.start_mono_ns == kT1);
  CHECK(w1.end_mono_ns == kT2);
  std::vector<OffCpuRecord> r1 = OffCpuOf(w1, 11);
  REQUIRE(r1.size() == 1);
  CHECK(r1[0].ns == 300'000'000);
  CHECK(r1[0].count == 1);
  CHECK(r1[0].state == PS_STATE_SLEEPING);
  CHECK(r1[0].process == kProcA);
  CHECK(r1[0].thread_name == "worker");
  CHECK(r1[0].stacks.kernel_ips == kKernelIps);
  CHECK(r1[0].stacks.user_ips == kUserIps);

  // Window 2: BPF's part only. carry_ws_ns (2 s) is not this boundary and out_ns is 0.
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  std::vector<OffCpuRecord> r2 = OffCpuOf(w2, 11);
  REQUIRE(r2.size() == 1);
  CHECK(r2[0].ns == 300'000);
  CHECK(r2[0].stacks.kernel_ips == kKernelIps);  // from the cache: ps_stacks0 was drained
  CHECK(r2[0].stacks.user_ips == kUserIps);
  CHECK(OffCpuNs(w1, 11) + OffCpuNs(w2, 11) == 300'300'000);

  // Window 3: nothing left of it.
  WindowData w3 = collector.Collect(kT3, kT4, 0, false);
  CHECK(OffCpuOf(w3, 11).empty());
  CHECK(collector.map_stats().stacks_missing == 0);
}

TEST_CASE("collector: on-CPU time crossing the window start comes from ps_cpu_state carry fields",
          "[collect]") {
  // Ground truth: CPU 0 ran thread 21 of A from 1.9 s to 2.0001 s, a switch after the programs
  // saw window start 2 s but before the daemon read ps_cpu_state; then it went idle.
  // ps_add_runtime copied its switch-in to carry_* (carry_ws_ns 2 s) and added 100'000 ns to
  // ps_runtime1. A ran 100'100'000 ns: 100'000'000 in window 1 (daemon, from the carry) and
  // 100'000 in window 2 (BPF). CPU 1 runs thread 31 of B from 1.5 s on without a switch: 500 ms
  // in window 1, the whole 1 s of window 2. CPU 2 has not been seen since attach (known 0) and
  // CPU 3 runs a thread of a process that is not profiled (counted 0): neither adds anything.
  FakeMapReader maps;
  Collector collector(&maps, {});
  ps_cpu_state cpu0 = Idle();
  cpu0.in_ns = 2'000'100'000;
  cpu0.carry_in_ns = 1'900'000'000;
  cpu0.carry_tgid = kProcA.tgid;
  cpu0.carry_tgid_start_ns = kProcA.start_boot_ns;
  cpu0.carry_exec_id = kProcA.exec_id;
  cpu0.carry_ws_ns = kT2;
  ps_cpu_state cpu2 = Running(41, kProcB, 1'200'000'000);
  cpu2.known = 0;
  ps_cpu_state cpu3 = Running(51, kProcB, 1'200'000'000);
  cpu3.counted = 0;
  maps.cpus = {cpu0, Running(31, kProcB, 1'500'000'000), cpu2, cpu3};
  maps.buffers[1].runtime.push_back(
      {ps_runtime_key{kProcA.tgid, kProcA.exec_id, kProcA.start_boot_ns}, 100'000});

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(RuntimeOf(w1, kProcA) == std::vector<uint64_t>{100'000'000});
  CHECK(RuntimeOf(w1, kProcB) == std::vector<uint64_t>{500'000'000});

  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  CHECK(RuntimeOf(w2, kProcA) == std::vector<uint64_t>{100'000});
  CHECK(RuntimeOf(w2, kProcB) == std::vector<uint64_t>{1'000'000'000});
  CHECK(RuntimeNs(w1, kProcA) + RuntimeNs(w2, kProcA) == 100'100'000);
}

TEST_CASE("collector: on-CPU time pending in ps_cpu_state counts in its window, once",
          "[collect]") {
  // Ground truth: in window 1 (buffer 0, start kT1) CPU 0 ran A's threads for 300 ms in all, of
  // which sched_switch added 200 ms to ps_runtime0 (when it switched to another image) and kept
  // the last 100 ms pending (bpf/abi.h ps_runtime_pending); CPU 1 kept B's 40 ms pending. CPU 1's
  // buffer-1 entry is left from two windows before (start kT1 - 2 s): read then, not again. In
  // window 2 (buffer 1, start kT2) CPU 0 keeps 7 ms of B pending when the agent stops: the final
  // read drains buffer 1 without a flip, and takes it once.
  FakeMapReader maps;
  Collector collector(&maps, {});
  auto pending = [](const proc::ProcessKey& p, uint64_t ws, uint64_t ns) {
    ps_runtime_pending r = OfProcess<ps_runtime_pending>(p);
    r.ws_ns = ws;
    r.ns = ns;
    return r;
  };
  ps_cpu_state cpu0 = Idle(), cpu1 = Idle();
  cpu0.pending[0] = pending(kProcA, kT1, 100'000'000);
  cpu1.pending[0] = pending(kProcB, kT1, 40'000'000);
  cpu1.pending[1] = pending(kProcB, kT1 - 2'000'000'000, 999);
  maps.cpus = {cpu0, cpu1};
  maps.buffers[0].runtime.push_back(
      {ps_runtime_key{kProcA.tgid, kProcA.exec_id, kProcA.start_boot_ns}, 200'000'000});

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(RuntimeNs(w1, kProcA) == 300'000'000);
  CHECK(RuntimeNs(w1, kProcB) == 40'000'000);

  cpu0.pending[1] = pending(kProcB, kT2, 7'000'000);
  maps.cpus = {cpu0, cpu1};
  maps.buffers[0].runtime.clear();
  WindowData w2 = collector.Collect(kT2, kT3, 1, true);
  CHECK(RuntimeNs(w2, kProcA) == 0);
  CHECK(RuntimeNs(w2, kProcB) == 7'000'000);
}

TEST_CASE("collector: a thread still off-CPU at the window end is counted up to it each window",
          "[collect]") {
  // Ground truth: thread 51 of A was switched out at 1.6 s (stacks captured into ps_stacks0)
  // and stays off-CPU through windows 1, 2 and 3; it is switched in at 4.5 s, in window 4 (buffer
  // 1), long after the daemon closed window 3: BPF adds the part from window start 4 s, 500 ms.
  // Off-CPU 2'900'000'000 ns in all: 400 ms in window 1, 1 s in windows 2 and 3, 500 ms in 4.
  // Its stacks were drained in window 1 and referenced by no record until window 4: the cache
  // keeps them because the thread is still off-CPU. Thread 52 of B was switched out at 2.00005 s,
  // after the programs saw window start 2 s: that interval is window 2's (999'950'000 ns there).
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.buffers[0].stacks[kUserStack] = Stack(kUserIps);
  maps.threads[51] = SwitchedOut(kProcA, 1'600'000'000, kKernelStack, kUserStack);
  maps.threads[52] = SwitchedOut(kProcB, 2'000'050'000, 0, 0);

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  std::vector<OffCpuRecord> r1 = OffCpuOf(w1, 51);
  REQUIRE(r1.size() == 1);
  CHECK(r1[0].ns == 400'000'000);
  CHECK(r1[0].count == 1);
  CHECK(r1[0].stacks.kernel_ips == kKernelIps);
  CHECK(OffCpuOf(w1, 52).empty());

  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  CHECK(OffCpuNs(w2, 51) == 1'000'000'000);
  CHECK(OffCpuNs(w2, 52) == 999'950'000);

  WindowData w3 = collector.Collect(kT3, kT4, 0, false);
  CHECK(OffCpuNs(w3, 51) == 1'000'000'000);

  maps.buffers[1].offcpu.push_back(SwitchIn(51, &maps.threads[51], 4'500'000'000, kT4));
  WindowData w4 = collector.Collect(kT4, kT5, 1, false);
  std::vector<OffCpuRecord> r4 = OffCpuOf(w4, 51);
  REQUIRE(r4.size() == 1);
  CHECK(r4[0].ns == 500'000'000);
  CHECK(r4[0].stacks.kernel_ips == kKernelIps);
  CHECK(r4[0].stacks.user_ips == kUserIps);
  CHECK(collector.map_stats().stacks_missing == 0);
  CHECK(OffCpuNs(w1, 51) + OffCpuNs(w2, 51) + OffCpuNs(w3, 51) + OffCpuNs(w4, 51) == 2'900'000'000);
}

TEST_CASE("collector: an interval whose stacks were not captured counts from PS_EXACT_OFFCPU_NS",
          "[collect]") {
  // Ground truth at the boundary 2 s, per thread of A (bpf/abi.h, off-CPU stack sampling):
  // 61: stacks not captured (stack_weight 0), off-CPU since 2 s - 999'999 ns: shorter than
  //     PS_EXACT_OFFCPU_NS so far, it is represented by weighted intervals: nothing.
  // 62: not captured, off-CPU since 2 s - 1'000'000 ns: exactly PS_EXACT_OFFCPU_NS: counted
  //     once, 1'000'000 ns, with both stacks PS_ERR_NOT_CAPTURED.
  // 63: captured, off-CPU since 2 s - 999'999 ns: counted, 999'999 ns.
  // 64: switched in after the boundary, before the daemon looked; BPF found the interval not to
  //     be counted (carry_weight 0): nothing.
  // 65: same, carry_weight 1, carry_out_ns 2 s - 700'000 ns: 700'000 ns.
  // 66: not captured, off-CPU since 0.5 s, before the window: counted for the window, 1 s.
  FakeMapReader maps;
  Collector collector(&maps, {});
  auto uncaptured = [](uint64_t out_ns) {
    ps_thread_state ts = SwitchedOut(kProcA, out_ns, 0, 0);
    ts.stack_weight = 0;
    ts.kernel_stack_err = PS_ERR_NOT_CAPTURED;
    ts.user_stack_err = PS_ERR_NOT_CAPTURED;
    return ts;
  };
  maps.threads[61] = uncaptured(kT2 - 999'999);
  maps.threads[62] = uncaptured(kT2 - 1'000'000);
  maps.threads[63] = SwitchedOut(kProcA, kT2 - 999'999, 0, 0);
  ps_thread_state t64 = uncaptured(0);
  t64.carry_ws_ns = kT2;
  t64.carry_out_ns = kT2 - 999'999;
  t64.carry_kernel_stack_err = PS_ERR_NOT_CAPTURED;
  t64.carry_user_stack_err = PS_ERR_NOT_CAPTURED;
  t64.carry_state = PS_STATE_SLEEPING;
  t64.carry_weight = 0;
  maps.threads[64] = t64;
  ps_thread_state t65 = SwitchedOut(kProcA, kT2 - 700'000, 0, 0, PS_STATE_UNINTERRUPTIBLE);
  SwitchIn(65, &t65, kT2 + 20'000, kT2);
  maps.threads[65] = t65;
  maps.threads[66] = uncaptured(500'000'000);

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(OffCpuOf(w1, 61).empty());
  std::vector<OffCpuRecord> r62 = OffCpuOf(w1, 62);
  REQUIRE(r62.size() == 1);
  CHECK(r62[0].ns == PS_EXACT_OFFCPU_NS);
  CHECK(r62[0].stacks.kernel_ips.empty());
  CHECK(r62[0].stacks.user_ips.empty());
  CHECK(r62[0].stacks.kernel_stack_err == PS_ERR_NOT_CAPTURED);
  CHECK(r62[0].stacks.user_stack_err == PS_ERR_NOT_CAPTURED);
  CHECK(OffCpuNs(w1, 63) == 999'999);
  CHECK(OffCpuOf(w1, 64).empty());
  std::vector<OffCpuRecord> r65 = OffCpuOf(w1, 65);
  REQUIRE(r65.size() == 1);
  CHECK(r65[0].ns == 700'000);
  CHECK(r65[0].state == PS_STATE_UNINTERRUPTIBLE);
  CHECK(OffCpuNs(w1, 66) == 1'000'000'000);
  CHECK(w1.offcpu.size() == 4);
}

TEST_CASE("collector: an interval whose weight is not final at a boundary is left whole to BPF",
          "[collect]") {
  // Ground truth (bpf/abi.h ps_offcpu_weight_final): the daemon counts the part of an interval
  // before a boundary only once its weight can no longer change; until then BPF counts it whole,
  // or a later scan does, from its start. Per thread of A at the boundary 2 s, all off-CPU:
  // 81: chosen, not captured for the budget (budget_weight 0), since 2 s - 99'999'999 ns: under
  //     PS_BUDGET_EXACT_OFFCPU_NS so far, its weight may still become 1: nothing yet.
  // 82: same, since 2 s - 100 ms: final, once: 100 ms, stacks PS_ERR_NOT_CAPTURED.
  // 83: captured with budget weight 5, since 2 s - 50 ms: not final: nothing yet.
  // 84: captured with budget weight 5, since 2 s - 100 ms: final, once: 100 ms.
  // 85: captured with stack weight 4 and budget weight 5, since 2 s - 500 us: nothing yet.
  // 86: captured with stack weight 4 (no budget), since 2 s - 2 ms: final, once: 2 ms.
  // At the boundary 3 s:
  // 81: still off-CPU, now final: from its start, 1'099'999'999 ns.
  // 83: switched in at 2.01 s; BPF counted it whole (no carry for 3 s): nothing.
  // 85: switched in after 3 s, final there (carry_weight 1): from its start, 1'000'500'000 ns.
  // 82, 84, 86: still off-CPU, split at 2 s before: the window, 1 s each.
  // At the last boundary, 4 s (final: no switch-in will be seen), still running intervals are
  // cut by their weight so far: 91 (budget weight 5, since 4 s - 50 ms): 5 x 50 ms, count 5;
  // 92 (budget weight 0, since 4 s - 50 ms): nothing, it is represented by weighted ones.
  FakeMapReader maps;
  Collector collector(&maps, {});
  auto weighted = [](uint64_t out_ns, uint32_t stack_weight, uint32_t budget_weight) {
    ps_thread_state ts = SwitchedOut(kProcA, out_ns, 0, 0);
    ts.stack_weight = stack_weight;
    ts.budget_weight = budget_weight;
    if (budget_weight == 0) {
      ts.kernel_stack_err = PS_ERR_NOT_CAPTURED;
      ts.user_stack_err = PS_ERR_NOT_CAPTURED;
    }
    return ts;
  };
  maps.threads[81] = weighted(kT2 - 99'999'999, 1, 0);
  maps.threads[82] = weighted(kT2 - 100'000'000, 1, 0);
  maps.threads[83] = weighted(kT2 - 50'000'000, 1, 5);
  maps.threads[84] = weighted(kT2 - 100'000'000, 1, 5);
  maps.threads[85] = weighted(kT2 - 500'000, 4, 5);
  maps.threads[86] = weighted(kT2 - 2'000'000, 4, 1);

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  auto only = [](const WindowData& w, uint32_t tid, uint64_t ns) {
    std::vector<OffCpuRecord> r = OffCpuOf(w, tid);
    INFO("tid " << tid);
    REQUIRE(r.size() == 1);
    CHECK(r[0].ns == ns);
    CHECK(r[0].count == 1);
    return r[0];
  };
  CHECK(OffCpuOf(w1, 81).empty());
  OffCpuRecord r82 = only(w1, 82, PS_BUDGET_EXACT_OFFCPU_NS);
  CHECK(r82.stacks.kernel_stack_err == PS_ERR_NOT_CAPTURED);
  CHECK(r82.stacks.user_stack_err == PS_ERR_NOT_CAPTURED);
  CHECK(OffCpuOf(w1, 83).empty());
  only(w1, 84, 100'000'000);
  CHECK(OffCpuOf(w1, 85).empty());
  only(w1, 86, 2'000'000);
  CHECK(w1.offcpu.size() == 3);

  maps.threads[83].out_ns = 0;  // switched in at 2.01 s
  ps_thread_state& t85 = maps.threads[85];
  t85.carry_ws_ns = kT3;
  t85.carry_out_ns = t85.out_ns;
  t85.carry_kernel_stack_err = t85.kernel_stack_err;
  t85.carry_user_stack_err = t85.user_stack_err;
  t85.carry_state = t85.state;
  t85.carry_weight = 1;
  t85.out_ns = kT3 + 20'000'000;  // switched in after 3 s, out again
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  only(w2, 81, 1'099'999'999);
  CHECK(OffCpuOf(w2, 83).empty());
  only(w2, 85, 1'000'500'000);
  only(w2, 82, 1'000'000'000);
  only(w2, 84, 1'000'000'000);
  only(w2, 86, 1'000'000'000);
  CHECK(w2.offcpu.size() == 5);

  maps.threads.clear();
  maps.threads[91] = weighted(kT4 - 50'000'000, 1, 5);
  maps.threads[92] = weighted(kT4 - 50'000'000, 1, 0);
  WindowData w3 = collector.Collect(kT3, kT4, 0, /*final=*/true);
  std::vector<OffCpuRecord> r91 = OffCpuOf(w3, 91);
  REQUIRE(r91.size() == 1);
  CHECK(r91[0].ns == 5 * 50'000'000);
  CHECK(r91[0].count == 5);
  CHECK(OffCpuOf(w3, 92).empty());
}

TEST_CASE("collector: the off-CPU minimum duration applies to the whole interval at the boundary",
          "[collect]") {
  // Ground truth with --off-cpu-min-duration 5 ms, captured stacks, all off-CPU at 2 s:
  // 71 since 2 s - 4'999'999 ns: shorter than the minimum so far: nothing.
  // 72 since 2 s - 5'000'000 ns: 5'000'000 ns.
  // 73 since 0.999'999'999 s (before the window, 1'000'000'001 ns so far): the window, 1 s.
  FakeMapReader maps;
  Collector::Options options;
  options.min_offcpu_ns = 5'000'000;
  Collector collector(&maps, options);
  maps.threads[71] = SwitchedOut(kProcA, kT2 - 4'999'999, 0, 0);
  maps.threads[72] = SwitchedOut(kProcA, kT2 - 5'000'000, 0, 0);
  maps.threads[73] = SwitchedOut(kProcA, kT1 - 1, 0, 0);

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(OffCpuOf(w1, 71).empty());
  CHECK(OffCpuNs(w1, 72) == 5'000'000);
  CHECK(OffCpuNs(w1, 73) == 1'000'000'000);
}

TEST_CASE("collector: nothing is emitted for a thread after its ps_threads entry is gone",
          "[collect]") {
  // Ground truth: thread 81 of A was switched out at 1.8 s (stacks captured into ps_stacks0),
  // still off-CPU at 2 s: 200 ms in window 1. Switched in at 2.1 s (BPF: 100 ms from window
  // start 2 s into ps_offcpu1; carry_ws_ns 2 s), it exits at 2.2 s: sched_process_exit deletes
  // its entry. Window 2 holds BPF's 100 ms only, window 3 nothing: 300 ms in all. Its stacks,
  // last used in window 2, are dropped at the end of window 4 (unused in windows 3 and 4), and
  // that is not an eviction.
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.threads[81] = SwitchedOut(kProcA, 1'800'000'000, kKernelStack, 0);

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  CHECK(OffCpuNs(w1, 81) == 200'000'000);
  CHECK(collector.map_stats().thread_states == 1);
  CHECK(collector.map_stats().stack_cache == 1);

  maps.buffers[1].offcpu.push_back(SwitchIn(81, &maps.threads[81], 2'100'000'000, kT2));
  maps.threads.erase(81);
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  std::vector<OffCpuRecord> r2 = OffCpuOf(w2, 81);
  REQUIRE(r2.size() == 1);
  CHECK(r2[0].ns == 100'000'000);
  CHECK(r2[0].stacks.kernel_ips == kKernelIps);
  CHECK(collector.map_stats().thread_states == 0);
  CHECK(collector.map_stats().thread_states_max == 1);

  WindowData w3 = collector.Collect(kT3, kT4, 0, false);
  CHECK(w3.offcpu.empty());
  CHECK(collector.map_stats().stack_cache == 1);
  WindowData w4 = collector.Collect(kT4, kT5, 1, false);
  CHECK(w4.offcpu.empty());
  CHECK(collector.map_stats().stack_cache == 0);
  CHECK(collector.map_stats().stack_cache_evicted == 0);
}

TEST_CASE("collector: a thread seen on a CPU after its switch-out is off-CPU only until then",
          "[collect]") {
  // Ground truth: thread 91 of A was switched out at 1.3 s (reported) and came back on CPU 1 by
  // a switch the tracepoint did not report; BPF estimated that switch-in at 1.7 s (bpf/abi.h,
  // unreported switches) and records CPU 1 as running it since then, while its ps_threads entry
  // still says off-CPU since 1.3 s. Window 1: off-CPU 1.3 s to 1.7 s, 400'000'000 ns; on-CPU 1.7 s
  // to 2 s, 300'000'000 ns; together the 700 ms since the switch-out. It keeps running on CPU 1
  // through windows 2 and 3 (no switch): on-CPU 1 s each, no off-CPU time; the stack captured at
  // its switch-out (drained in window 1) stays cached while its entry says off-CPU, although no
  // record uses it.
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.threads[91] = SwitchedOut(kProcA, 1'300'000'000, kKernelStack, 0);
  maps.cpus = {Idle(), Running(91, kProcA, 1'700'000'000)};

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  std::vector<OffCpuRecord> r1 = OffCpuOf(w1, 91);
  REQUIRE(r1.size() == 1);
  CHECK(r1[0].ns == 400'000'000);
  CHECK(r1[0].stacks.kernel_ips == kKernelIps);
  CHECK(RuntimeOf(w1, kProcA) == std::vector<uint64_t>{300'000'000});

  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  CHECK(OffCpuOf(w2, 91).empty());
  CHECK(RuntimeOf(w2, kProcA) == std::vector<uint64_t>{1'000'000'000});
  WindowData w3 = collector.Collect(kT3, kT4, 0, false);
  CHECK(OffCpuOf(w3, 91).empty());
  CHECK(RuntimeOf(w3, kProcA) == std::vector<uint64_t>{1'000'000'000});
  CHECK(collector.map_stats().stack_cache == 1);
}

TEST_CASE("collector: a stale CPU record older than the switch-out does not cut the interval",
          "[collect]") {
  // Ground truth: thread 95 of A ran on CPU 0 from 1.2 s, left it by an unreported switch,
  // came in unseen elsewhere and was switched out (reported) at 1.5 s; CPU 0's record still
  // names it since 1.2 s (stale: older than its switch-out). It is off-CPU 1.5 s to 2 s:
  // 500'000'000 ns. Thread 96 of B is named by two CPUs: CPU 2 since 1.1 s (stale) and CPU 3
  // since 1.75 s, an unreported switch-in after its switch-out at 1.6 s: off-CPU 1.6 s to
  // 1.75 s, 150'000'000 ns (the later switch-in is the current one).
  // On-CPU: ScanCpus takes every known, counted CPU record as it is (it does not consult
  // ps_threads), so the stale records still add [in_ns, 2 s): 800 ms for A from CPU 0 and 900 ms
  // for B from CPU 2, besides CPU 3's 250 ms. That is the daemon's rule, not ground truth (A
  // ran on CPU 0 for less than 300 ms); BPF repairs a stale record at that CPU's next switch or
  // sample.
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.threads[95] = SwitchedOut(kProcA, 1'500'000'000, 0, 0);
  maps.threads[96] = SwitchedOut(kProcB, 1'600'000'000, 0, 0);
  maps.cpus = {Running(95, kProcA, 1'200'000'000), Idle(), Running(96, kProcB, 1'100'000'000),
               Running(96, kProcB, 1'750'000'000)};

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  std::vector<OffCpuRecord> r95 = OffCpuOf(w1, 95);
  REQUIRE(r95.size() == 1);
  CHECK(r95[0].ns == 500'000'000);
  std::vector<OffCpuRecord> r96 = OffCpuOf(w1, 96);
  REQUIRE(r96.size() == 1);
  CHECK(r96[0].ns == 150'000'000);
  CHECK(RuntimeOf(w1, kProcA) == std::vector<uint64_t>{800'000'000});
  CHECK(RuntimeNs(w1, kProcB) == 900'000'000 + 250'000'000);
}

TEST_CASE("collector: records resolve their stacks with flags, clamped depth and errors",
          "[collect]") {
  // Ground truth, buffer 0 of window 1: kernel stack K (2 frames) and user stack U whose walk
  // was cut (PS_UNWIND_TRUNCATED) with len 200, more than the PS_MAX_STACK_DEPTH (127) frames a
  // ps_stack holds: 127 frames are kept. Record 1 (thread 11 of A, comm of exactly
  // PS_TASK_COMM_LEN bytes without a NUL, parallelism 0, PS_SAMPLE_PARALLELISM_UNKNOWN, 3
  // samples of 10 ms) refers to K and U. Record 2 (thread 12) lost its kernel stack (-EFAULT,
  // no hash) and refers to a user stack found nowhere: -ENOENT, counted as missing.
  FakeMapReader maps;
  Collector collector(&maps, {});
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  std::vector<uint64_t> deep;
  for (uint64_t i = 0; i < PS_MAX_STACK_DEPTH; ++i) deep.push_back(0x400000 + i);
  RecordedStack u = Stack(deep, PS_UNWIND_TRUNCATED);
  u.len = 200;
  maps.buffers[0].stacks[kUserStack] = u;

  ps_oncpu_key k1{};
  k1.tgid = kProcA.tgid;
  k1.tid = 11;
  k1.tgid_start_ns = kProcA.start_boot_ns;
  k1.exec_id = kProcA.exec_id;
  k1.kernel_stack = kKernelStack;
  k1.user_stack = kUserStack;
  k1.parallelism = 0;
  k1.flags = PS_SAMPLE_PARALLELISM_UNKNOWN;
  ps_oncpu_value v1{};
  v1.count = 3;
  v1.period_sum = 30'000'000;
  std::memcpy(v1.comm, "sixteen-chars-xx", PS_TASK_COMM_LEN);
  ps_oncpu_key k2 = k1;
  k2.tid = 12;
  k2.kernel_stack = 0;
  k2.kernel_stack_err = -EFAULT;
  k2.user_stack = 0xdead;
  k2.parallelism = 2;
  k2.flags = 0;
  ps_oncpu_value v2{};
  v2.count = 1;
  v2.period_sum = 10'000'000;
  SetComm(v2.comm, "t12");
  maps.buffers[0].oncpu = {{k1, v1}, {k2, v2}};

  WindowData w1 = collector.Collect(kT1, kT2, 0, false);
  REQUIRE(w1.oncpu.size() == 2);
  const OnCpuRecord& a = w1.oncpu[0].tid == 11 ? w1.oncpu[0] : w1.oncpu[1];
  const OnCpuRecord& b = w1.oncpu[0].tid == 11 ? w1.oncpu[1] : w1.oncpu[0];
  CHECK(a.process == kProcA);
  CHECK(a.thread_name == "sixteen-chars-xx");
  CHECK(a.stacks.kernel_ips == kKernelIps);
  CHECK(a.stacks.user_ips == deep);
  CHECK(a.stacks.user_ips.size() == PS_MAX_STACK_DEPTH);
  CHECK(a.stacks.user_unwind == PS_UNWIND_TRUNCATED);
  CHECK(a.stacks.kernel_stack_err == 0);
  CHECK(a.stacks.user_stack_err == 0);
  CHECK(a.parallelism == 1);
  CHECK(a.parallelism_unknown);
  CHECK(a.count == 3);
  CHECK(a.period_sum == 30'000'000);
  CHECK(b.tid == 12);
  CHECK(b.thread_name == "t12");
  CHECK(b.stacks.kernel_ips.empty());
  CHECK(b.stacks.kernel_stack_err == -EFAULT);
  CHECK(b.stacks.user_ips.empty());
  CHECK(b.stacks.user_stack_err == -ENOENT);
  CHECK(b.stacks.user_unwind == 0);
  CHECK(b.parallelism == 2);
  CHECK_FALSE(b.parallelism_unknown);
  CHECK(collector.map_stats().stacks_missing == 1);
  CHECK(collector.map_stats().stack_cache == 2);
}

TEST_CASE("collector: the stack cache drops the least recently used stacks beyond its bound",
          "[collect]") {
  // Ground truth with a bound of 2 stacks: window 1 drains stacks 0x30 and 0x20 (used by no
  // record), window 2 drains 0x10 and a record uses 0x30. At the end of window 2 the cache holds
  // 0x30 and 0x10 (last used in window 2) and 0x20 (window 1): one over the bound, 0x20 is
  // evicted (1 eviction). In window 3 records using 0x30, 0x20 and 0x10 resolve 0x30 and 0x10;
  // 0x20 is missing. Unused in windows 4 and 5, the two are dropped at the end of window 5 by
  // age, which is not an eviction.
  FakeMapReader maps;
  Collector::Options options;
  options.max_cached_stacks = 2;
  Collector collector(&maps, options);
  maps.buffers[0].stacks[0x30] = Stack({0x3});
  maps.buffers[0].stacks[0x20] = Stack({0x2});
  collector.Collect(kT1, kT2, 0, false);
  CHECK(collector.map_stats().stack_cache == 2);
  CHECK(collector.map_stats().stack_cache_evicted == 0);

  maps.buffers[1].stacks[0x10] = Stack({0x1});
  maps.buffers[1].oncpu = {OnCpuOfA(1, 0x30)};
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  REQUIRE(w2.oncpu.size() == 1);
  CHECK(w2.oncpu[0].stacks.kernel_ips == std::vector<uint64_t>{0x3});
  CHECK(collector.map_stats().stack_cache == 2);
  CHECK(collector.map_stats().stack_cache_evicted == 1);

  maps.buffers[0].oncpu = {OnCpuOfA(1, 0x30), OnCpuOfA(2, 0x20), OnCpuOfA(3, 0x10)};
  WindowData w3 = collector.Collect(kT3, kT4, 0, false);
  REQUIRE(w3.oncpu.size() == 3);
  for (const OnCpuRecord& r : w3.oncpu) {
    if (r.tid == 1) CHECK(r.stacks.kernel_ips == std::vector<uint64_t>{0x3});
    if (r.tid == 2) CHECK(r.stacks.kernel_stack_err == -ENOENT);
    if (r.tid == 3) CHECK(r.stacks.kernel_ips == std::vector<uint64_t>{0x1});
  }
  CHECK(collector.map_stats().stacks_missing == 1);

  collector.Collect(kT4, kT5, 1, false);
  CHECK(collector.map_stats().stack_cache == 2);
  collector.Collect(kT5, kT6, 0, false);
  CHECK(collector.map_stats().stack_cache == 0);
  CHECK(collector.map_stats().stack_cache_evicted == 1);
}

TEST_CASE("collector: cached stacks keep their ips when their pool is compacted", "[collect]") {
  // Ground truth: stacks 0x10 {1, 2, 3}, 0x20 {4, 5, 6, 7, 8} and 0x30 {9, 10} are drained in
  // every window (each drain appends a new copy and drops the last) and used by a record each;
  // 0x40 {11} is drained in window 1 only and dropped by age at the end of window 3. The pool is
  // compacted whenever dropped copies outweigh the live ips (11, then 10 from window 3 on), so
  // it never holds more than twice as many. Without compaction it would hold 10 more each
  // window (51 after five). The third and fifth windows end with a compaction (dropped copies 21
  // and 20, live 10); every record still resolves its own stack's ips, also in a sixth window
  // that reads the stacks where the fifth's compaction moved them.
  FakeMapReader maps;
  Collector collector(&maps, Collector::Options{});
  const std::map<uint32_t, std::vector<uint64_t>> truth = {
      {1, {1, 2, 3}}, {2, {4, 5, 6, 7, 8}}, {3, {9, 10}}};
  for (uint32_t w = 0; w < 5; ++w) {
    FakeMapReader::Buffer& buffer = maps.buffers[w % 2];
    buffer.stacks[0x10] = Stack(truth.at(1));
    buffer.stacks[0x20] = Stack(truth.at(2));
    buffer.stacks[0x30] = Stack(truth.at(3));
    if (w == 0) buffer.stacks[0x40] = Stack({11});
    buffer.oncpu = {OnCpuOfA(1, 0x10), OnCpuOfA(2, 0x20), OnCpuOfA(3, 0x30)};
    const int64_t start = kT1 + w * (kT2 - kT1);
    WindowData data = collector.Collect(start, start + (kT2 - kT1), w % 2, false);
    REQUIRE(data.oncpu.size() == 3);
    for (const OnCpuRecord& r : data.oncpu) CHECK(r.stacks.kernel_ips == truth.at(r.tid));
    CHECK(collector.map_stats().stack_cache == (w < 2 ? 4 : 3));
    CHECK(collector.map_stats().stack_cache_ips <= 2 * (w < 2 ? 11 : 10));
  }
  // The next window drains only a new stack, 0x50 with 30 ips, appended over the room the last
  // compaction freed; the others resolve from where compaction moved them.
  std::vector<uint64_t> long_stack(30);
  for (size_t i = 0; i < long_stack.size(); ++i) long_stack[i] = 100 + i;
  maps.buffers[1].stacks[0x50] = Stack(long_stack);
  maps.buffers[1].oncpu = {OnCpuOfA(1, 0x10), OnCpuOfA(2, 0x20), OnCpuOfA(3, 0x30),
                           OnCpuOfA(4, 0x50)};
  WindowData last = collector.Collect(kT1 + 5 * (kT2 - kT1), kT1 + 6 * (kT2 - kT1), 1, false);
  REQUIRE(last.oncpu.size() == 4);
  for (const OnCpuRecord& r : last.oncpu) {
    CHECK(r.stacks.kernel_ips == (r.tid == 4 ? long_stack : truth.at(r.tid)));
  }
  CHECK(collector.map_stats().stacks_missing == 0);
}

TEST_CASE("collector: the default stack cache bound is 65536 stacks", "[collect]") {
  // Ground truth: one window drains 65537 stacks (hashes 1..65537), all last used in it; the
  // bound (Collector::kMaxCachedStacks) evicts one, the smallest hash among equals: in window 2
  // a record using stack 1 finds it missing, one using stack 2 resolves it.
  FakeMapReader maps;
  Collector collector(&maps, {});
  for (uint64_t h = 1; h <= 65537; ++h) maps.buffers[0].stacks[h] = Stack({h});
  collector.Collect(kT1, kT2, 0, false);
  CHECK(Collector::kMaxCachedStacks == 65536);
  CHECK(collector.map_stats().stack_cache == 65536);
  CHECK(collector.map_stats().stack_cache_evicted == 1);

  ps_oncpu_key k = KeyOfA<ps_oncpu_key>(1);
  k.kernel_stack = 1;
  k.user_stack = 2;
  ps_oncpu_value v{};
  v.count = 1;
  maps.buffers[1].oncpu = {{k, v}};
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  REQUIRE(w2.oncpu.size() == 1);
  CHECK(w2.oncpu[0].stacks.kernel_stack_err == -ENOENT);
  CHECK(w2.oncpu[0].stacks.user_ips == std::vector<uint64_t>{2});
}

namespace {

// A ps_offcpu<N> record of thread `tid` (sleeping unless told) under `user_stack`: intervals of
// `raw_ns` in all that counted `weight` times each, as ps_add_offcpu adds them.
std::pair<ps_offcpu_key, ps_offcpu_value> Weighted(uint32_t tid, uint64_t user_stack,
                                                   uint64_t raw_ns, uint64_t weight,
                                                   uint64_t intervals,
                                                   uint32_t state = PS_STATE_SLEEPING) {
  ps_offcpu_key k = KeyOfA<ps_offcpu_key>(tid);
  k.user_stack = user_stack;
  k.kernel_stack = kKernelStack;
  k.state = state;
  ps_offcpu_value v{};
  v.ns = raw_ns * weight;
  v.count = intervals * weight;
  if (weight > 1) {
    v.sampled_ns = raw_ns * weight;
    v.sampled_raw_ns = raw_ns;
  }
  SetComm(v.comm, "worker");
  return {k, v};
}

uint64_t OffCpuNsUnder(const WindowData& w, uint32_t tid, uint64_t user_stack_first_ip,
                       uint32_t state = PS_STATE_SLEEPING) {
  uint64_t ns = 0;
  for (const OffCpuRecord& r : OffCpuOf(w, tid)) {
    if (r.state == state && !r.stacks.user_ips.empty() &&
        r.stacks.user_ips[0] == user_stack_first_ip) {
      ns += r.ns;
    }
  }
  return ns;
}

}  // namespace

TEST_CASE("collector: sampled off-CPU intervals are scaled to the thread's exact total per state",
          "[collect]") {
  // Ground truth, window 1 (buffer 0), thread 11 of A, sleeping: 1 ms in short intervals whose
  // stacks were sampled, plus one exact 5 ms interval. Captured: 45 us under stack P and 60 us
  // under stack Q, each counting 10 times (1.05 ms estimated); not captured: 895 us, summed by
  // BPF in the thread's slot for buffer 0 (bpf/abi.h ps_uncaptured). So P and Q are scaled by
  // 1 ms / 1.05 ms to 428'571 and 571'429 ns (rounded so that they sum to 1 ms), the exact
  // interval stays, and the thread's sleeping total is 6'000'000 ns. It also waited runnable
  // 7 us, none of it captured: that comes under uncaptured stacks. Thread 12 has a sampled
  // record but no sums (its slot is of another window): its estimate stays as it is.
  FakeMapReader maps;
  Collector collector(&maps, {});
  constexpr uint64_t kP = 0x7070, kQ = 0x7171, kExact = 0x7272;
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.buffers[0].stacks[kP] = Stack({0x1000});
  maps.buffers[0].stacks[kQ] = Stack({0x2000});
  maps.buffers[0].stacks[kExact] = Stack({0x3000});
  maps.buffers[0].offcpu.push_back(Weighted(11, kP, 45'000, 10, 2));
  maps.buffers[0].offcpu.push_back(Weighted(11, kQ, 60'000, 10, 1));
  maps.buffers[0].offcpu.push_back(Weighted(11, kExact, 5'000'000, 1, 1));
  maps.buffers[0].offcpu.push_back(Weighted(12, kP, 30'000, 4, 1));
  ps_thread_state t11 = SwitchedOut(kProcA, 0, 0, 0);
  t11.out_ns = 0;  // on a CPU at the boundary
  t11.uncaptured[0].ws_ns = kT1;
  t11.uncaptured[0].ns[PS_STATE_SLEEPING - PS_STATE_RUNNABLE] = 895'000;
  t11.uncaptured[0].ns[PS_STATE_RUNNABLE - PS_STATE_RUNNABLE] = 7'000;
  t11.uncaptured[1].ws_ns = kT1 - 1'000'000'000;  // the other buffer's slot: an older window
  t11.uncaptured[1].ns[PS_STATE_SLEEPING - PS_STATE_RUNNABLE] = 123'456'789;
  maps.threads[11] = t11;
  ps_thread_state t12 = SwitchedOut(kProcA, 0, 0, 0);
  t12.out_ns = 0;
  t12.uncaptured[0].ws_ns = kT1 - 1'000'000'000;
  t12.uncaptured[0].ns[PS_STATE_SLEEPING - PS_STATE_RUNNABLE] = 999'000;
  maps.threads[12] = t12;

  WindowData w = collector.Collect(kT1, kT2, 0, false);
  CHECK(OffCpuNsUnder(w, 11, 0x1000) == 428'571);
  CHECK(OffCpuNsUnder(w, 11, 0x2000) == 571'429);
  CHECK(OffCpuNsUnder(w, 11, 0x3000) == 5'000'000);
  uint64_t runnable = 0, sleeping = 0;
  for (const OffCpuRecord& r : OffCpuOf(w, 11)) {
    (r.state == PS_STATE_RUNNABLE ? runnable : sleeping) += r.ns;
    CHECK(r.sampled_ns == 0);
    if (r.state == PS_STATE_RUNNABLE) {
      CHECK(r.stacks.kernel_stack_err == PS_ERR_NOT_CAPTURED);
      CHECK(r.stacks.user_stack_err == PS_ERR_NOT_CAPTURED);
      CHECK(r.process == kProcA);
      CHECK(r.thread_name == "worker");
    }
  }
  CHECK(sleeping == 6'000'000);
  CHECK(runnable == 7'000);
  CHECK(OffCpuNs(w, 12) == 120'000);

  // Window 2 fills buffer 1: its slot is uncaptured[1]. 40 us captured under P counting 5 times
  // and 160 us not captured: 200 us in all, all under P.
  maps.buffers[1].offcpu.push_back(Weighted(11, kP, 40'000, 5, 1));
  t11.uncaptured[1] = {};
  t11.uncaptured[1].ws_ns = kT2;
  t11.uncaptured[1].ns[PS_STATE_SLEEPING - PS_STATE_RUNNABLE] = 160'000;
  maps.threads[11] = t11;
  WindowData w2 = collector.Collect(kT2, kT3, 1, false);
  CHECK(OffCpuNs(w2, 11) == 200'000);

  // The last window (buffer 0, final): 10 us captured counting 5 times; 30 us not captured;
  // and the thread is off-CPU since 3.9999 s in an interval captured with weight 10 (100 us so
  // far, under PS_EXACT_OFFCPU_NS), cut at the end by its weight so far and then scaled: 140 us.
  maps.buffers[0].offcpu.push_back(Weighted(11, kP, 10'000, 5, 1));
  ps_thread_state t11_last = SwitchedOut(kProcA, kT4 - 100'000, 0, kP);
  t11_last.stack_weight = 10;
  t11_last.uncaptured[0].ws_ns = kT3;
  t11_last.uncaptured[0].ns[PS_STATE_SLEEPING - PS_STATE_RUNNABLE] = 30'000;
  maps.threads[11] = t11_last;
  WindowData w3 = collector.Collect(kT3, kT4, 0, true);
  CHECK(OffCpuNs(w3, 11) == 140'000);
}

TEST_CASE("collector: an exited thread's uncaptured sums come as a record and are not profiled",
          "[collect]") {
  // Ground truth, window 1: thread 13 exited; ps_hand_over_uncaptured wrote its sums as one
  // PS_ERR_UNCAPTURED_SUM record (runnable in ns, sleeping in sampled_ns, uninterruptible in
  // sampled_raw_ns): 300 us runnable, 1.9 ms sleeping. Its captured sleeping intervals, 100 us
  // counting 5 times, are scaled to 100 us + 1.9 ms; its runnable time, none of it captured,
  // comes under uncaptured stacks. Thread 14 exited with under PS_EXACT_OFFCPU_NS of sums, so BPF
  // wrote none: its 50 us counting 3 times stay 150 us.
  FakeMapReader maps;
  Collector collector(&maps, {});
  constexpr uint64_t kP = 0x7070;
  maps.buffers[0].stacks[kKernelStack] = Stack(kKernelIps);
  maps.buffers[0].stacks[kP] = Stack({0x1000});
  maps.buffers[0].offcpu.push_back(Weighted(13, kP, 100'000, 5, 1));
  maps.buffers[0].offcpu.push_back(Weighted(14, kP, 50'000, 3, 1));
  auto sums = Weighted(13, 0, 0, 1, 1, 0);
  sums.first.kernel_stack = 0;
  sums.first.user_stack_err = PS_ERR_UNCAPTURED_SUM;
  sums.first.kernel_stack_err = PS_ERR_UNCAPTURED_SUM;
  sums.second.ns = 300'000;
  sums.second.sampled_ns = 1'900'000;
  sums.second.sampled_raw_ns = 0;
  maps.buffers[0].offcpu.push_back(sums);
  WindowData w = collector.Collect(kT1, kT2, 0, false);
  uint64_t sleeping = 0, runnable = 0;
  for (const OffCpuRecord& r : OffCpuOf(w, 13)) {
    (r.state == PS_STATE_RUNNABLE ? runnable : sleeping) += r.ns;
    CHECK(r.state != 0);
  }
  CHECK(OffCpuOf(w, 13).size() == 2);
  CHECK(sleeping == 2'000'000);
  CHECK(runnable == 300'000);
  REQUIRE(OffCpuOf(w, 14).size() == 1);
  CHECK(OffCpuOf(w, 14)[0].ns == 150'000);
}

TEST_CASE("collector: the final window drains both buffers", "[collect]") {
  // Ground truth: at the final drain the programs are detached and the buffer was not flipped;
  // ps_offcpu0 (closed) holds 10 ms of thread 11 and ps_offcpu1 (filled since the last flip,
  // before it was detached) 20 ms of thread 12: both are this window's, and so are the 5 ms of
  // ps_runtime1.
  FakeMapReader maps;
  Collector collector(&maps, {});
  ps_thread_state t11 = SwitchedOut(kProcA, 2'100'000'000, 0, 0);
  ps_thread_state t12 = SwitchedOut(kProcA, 2'200'000'000, 0, 0);
  maps.buffers[0].offcpu.push_back(SwitchIn(11, &t11, 2'110'000'000, kT2));
  maps.buffers[1].offcpu.push_back(SwitchIn(12, &t12, 2'220'000'000, kT2));
  maps.buffers[1].runtime.push_back(
      {ps_runtime_key{kProcA.tgid, kProcA.exec_id, kProcA.start_boot_ns}, 5'000'000});
  WindowData w = collector.Collect(kT2, kT3, 0, true);
  CHECK(OffCpuNs(w, 11) == 10'000'000);
  CHECK(OffCpuNs(w, 12) == 20'000'000);
  CHECK(RuntimeOf(w, kProcA) == std::vector<uint64_t>{5'000'000});
  CHECK(maps.stack_drains == 2);
}

TEST_CASE("collector: without sched only the on-CPU maps are read", "[collect]") {
  // Ground truth: without sched.bpf.o there are no off-CPU, runtime or thread maps to read
  // (and ps_cpu_state has no scheduler view); a stale-looking thread state is not consulted.
  FakeMapReader maps;
  Collector::Options options;
  options.sched = false;
  Collector collector(&maps, options);
  maps.threads[1] = SwitchedOut(kProcA, 1'500'000'000, 0, 0);
  maps.cpus = {Running(2, kProcA, 1'500'000'000)};
  WindowData w = collector.Collect(kT1, kT2, 0, false);
  CHECK(w.offcpu.empty());
  CHECK(w.runtime.empty());
  CHECK(maps.stack_drains == 1);
  CHECK(maps.oncpu_drains == 1);
  CHECK(maps.offcpu_drains == 0);
  CHECK(maps.runtime_drains == 0);
  CHECK(maps.thread_visits == 0);
  CHECK(maps.cpu_reads == 0);
}

}  // namespace parascope::collect
