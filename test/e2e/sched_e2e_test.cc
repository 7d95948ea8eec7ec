// Root end-to-end tests of the scheduler-based profiles (off_cpu, wall, latency; issue: sched_switch
// tracing): the agent binary against ground-truth workloads in test/workloads/, every profile read
// back through the real pprof tool. Each workload measures its own truth (thread CPU time from
// CLOCK_THREAD_CPUTIME_ID, sleep and block times from CLOCK_MONOTONIC, thread lifetimes) over a
// phase that starts after the agent logged "attached:" and ends before the agent stops.
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

// Parses "key=N" out of the agent's "stopped:" log line.
uint64_t StoppedStat(const std::string& log, const std::string& key) {
  std::smatch m;
  std::regex re("[ (]" + key + "=([0-9]+)");
  INFO("looking for " << key << "=N in the agent log");
  REQUIRE(std::regex_search(log, m, re));
  return std::stoull(m[1]);
}

bool Has(const std::vector<std::string>& frames, const std::string& fn) {
  return std::find(frames.begin(), frames.end(), fn) != frames.end();
}

const std::map<std::string, std::vector<std::string>>& SampleTypes() {
  static const auto* types = new std::map<std::string, std::vector<std::string>>{
      {"process_cpu", {"samples/count", "cpu/nanoseconds"}},
      {"off_cpu", {"off_cpu/nanoseconds"}},
      {"wall", {"wall/nanoseconds"}},
      {"latency", {"latency/nanoseconds"}},
  };
  return *types;
}

// One profile file, read with the real pprof.
struct Window {
  std::string path;
  RawProfile p;
  int64_t t0 = 0;  // unix ns
};

// Every "<name>-*.pb.gz" file of pid, each read with pprof (acceptance 7: no error, exact sample
// types, label values from the spec's sets).
std::vector<Window> Load(const std::string& dir, int pid, const std::string& name) {
  static const std::set<std::string> kOffStates = {"runnable", "sleeping", "uninterruptible"};
  static const std::set<std::string> kWallStates = {"running", "runnable", "sleeping",
                                                    "uninterruptible"};
  static const std::set<std::string> kParallelism = {"1", "2", "3", "4", "5", "6", "7", "8",
                                                     "9-16", "17-32", "33-64", "65+"};
  std::vector<Window> out;
  for (const std::string& f : ProfileFiles(dir, pid, name + "-")) {
    Window w;
    w.path = f;
    w.p = ReadWithPprof(f);
    INFO(f);
    CHECK(w.p.sample_types == SampleTypes().at(name));
    std::string stem = std::filesystem::path(f).filename();
    stem = stem.substr(name.size() + 1, stem.size() - name.size() - 1 - strlen(".pb.gz"));
    int64_t ms = 0;
    CHECK(absl::SimpleAtoi(stem, &ms));
    w.t0 = w.p.time_nanos != 0 ? w.p.time_nanos : ms * 1000000;
    CHECK(std::llabs(w.t0 / 1000000 - ms) <= 1);
    for (const auto& s : w.p.samples) {
      if (name == "off_cpu") {
        CHECK(kOffStates.count(s.labels.count("state") ? s.labels.at("state") : "") == 1);
      } else if (name == "wall") {
        CHECK(kWallStates.count(s.labels.count("state") ? s.labels.at("state") : "") == 1);
      } else if (name == "latency") {
        CHECK(kParallelism.count(s.labels.count("parallelism") ? s.labels.at("parallelism") : "") ==
              1);
      }
    }
    out.push_back(std::move(w));
  }
  return out;
}

using Pred = std::function<bool(const RawProfile&, const RawProfile::Sample&)>;

// Sum of value `type` over the samples of one profile that satisfy pred.
int64_t SumOf(const RawProfile& p, const std::string& type, const Pred& pred) {
  int vi = p.ValueIndex(type);
  REQUIRE(vi >= 0);
  int64_t t = 0;
  for (const auto& s : p.samples) {
    if (pred(p, s)) t += s.values.at(vi);
  }
  return t;
}

int64_t SumOf(const std::vector<Window>& ws, const std::string& type, const Pred& pred) {
  int64_t t = 0;
  for (const auto& w : ws) t += SumOf(w.p, type, pred);
  return t;
}

std::string Label(const RawProfile::Sample& s, const std::string& key) {
  auto it = s.labels.find(key);
  return it == s.labels.end() ? "" : it->second;
}

Pred TidIs(int64_t tid) {
  std::string t = std::to_string(tid);
  return [t](const RawProfile&, const RawProfile::Sample& s) { return Label(s, "tid") == t; };
}

Pred And(Pred a, Pred b) {
  return [a, b](const RawProfile& p, const RawProfile::Sample& s) { return a(p, s) && b(p, s); };
}

Pred InFunction(const std::string& fn) {
  return [fn](const RawProfile& p, const RawProfile::Sample& s) { return Has(p.Frames(s), fn); };
}

Pred LabelIs(const std::string& key, const std::string& value) {
  return [key, value](const RawProfile&, const RawProfile::Sample& s) {
    return Label(s, key) == value;
  };
}

Pred All() {
  return [](const RawProfile&, const RawProfile::Sample&) { return true; };
}

// A workload run under the agent: the workload prints "ready <pid>", the agent starts with
// --pid=<pid> --output-dir=<dir> plus agent_args, the workload's phase starts once the agent
// logged "attached:" and must end (its "done ..." line) while the agent still runs.
struct Session {
  std::unique_ptr<Child> work;
  int pid = 0;
  std::map<std::string, std::string> done;
  std::string agent_log;
  // With RunSession's `metrics`: the agent's /metrics once the workload's phase was done (the
  // agent still ran), and the seconds from the agent's start to that scrape.
  std::string metrics;
  double metrics_after_s = 0;

  int64_t Done(const std::string& key) const {
    auto it = done.find(key);
    INFO("workload done line lacks " << key);
    REQUIRE(it != done.end());
    int64_t v = 0;
    REQUIRE(absl::SimpleAtoi(it->second, &v));
    return v;
  }
};

// `metrics`: the agent serves /metrics on a free port, scraped into s->metrics once the
// workload's phase is done.
void RunSession(Session* s, const std::vector<std::string>& workload,
                const std::vector<std::string>& agent_args, const std::string& out_dir,
                int phase_timeout_s, const std::vector<std::string>& agent_prefix = {},
                bool metrics = false) {
  s->work = std::make_unique<Child>(workload);
  std::string line;
  REQUIRE(s->work->ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  s->pid = std::stoi(line.substr(6));

  std::vector<std::string> argv = agent_prefix;
  argv.push_back(PS_AGENT_BIN);
  argv.push_back(absl::StrCat("--pid=", s->pid));
  argv.push_back("--output-dir=" + out_dir);
  argv.insert(argv.end(), agent_args.begin(), agent_args.end());
  if (metrics) argv.push_back("--http-address=127.0.0.1:0");
  const auto agent_start = std::chrono::steady_clock::now();
  Child agent(argv);
  INFO("agent: " << absl::StrJoin(argv, " "));
  bool attached = agent.WaitForStderr("attached:", &line);
  INFO("agent stderr so far:\n" << agent.stderr_text());
  REQUIRE(attached);
  int port = 0;
  if (metrics) {
    port = MetricsPort(agent.stderr_text());
    REQUIRE(port > 0);
  }
  s->work->WriteStdin("go\n");
  bool done = s->work->ReadStdoutLine(&line, phase_timeout_s);
  INFO("workload stdout: " << s->work->stdout_text());
  REQUIRE(done);
  REQUIRE(absl::StartsWith(line, "done "));
  s->done = KeyValues(line);
  if (metrics) {
    s->metrics = Scrape(port);
    s->metrics_after_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - agent_start).count();
  }
  // The ground truth is only comparable if the whole measured phase lay inside the agent's run.
  bool agent_ran_through_phase = agent.Running();
  int status = agent.Wait(120);
  s->agent_log = agent.stderr_text();
  INFO("agent stderr:\n" << s->agent_log);
  REQUIRE(agent_ran_through_phase);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

// The measured figures: shown on failure (INFO) and, so a passing run reports them too, as a
// warning.
#define FIGURES(msg) \
  INFO(msg);         \
  WARN(msg)

double Ratio(int64_t a, int64_t b) { return b == 0 ? 0.0 : double(a) / double(b); }

std::string Ms(int64_t ns) { return absl::StrCat(ns / 1000000.0, "ms"); }

}  // namespace

// Acceptance 1 (and 7): off-CPU shares by function, state, and the exact off-CPU total.
TEST_CASE("sched e2e: off-CPU splits 3:1 between sleep_30ms and pipe_wait_10ms and sums to the "
          "thread's off-CPU time",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/offcpu_mix", "4"},
             {"--profiles=off_cpu,wall", "--duration=6s"}, out.path(), 30);
  const int64_t tid = s.Done("tid");
  const int64_t life = s.Done("life_ns"), cpu = s.Done("cpu_ns");
  const int64_t measured_wait = s.Done("sleep_ns") + s.Done("block_ns");

  // Only the requested profile types were written.
  CHECK(ProfileFiles(out.path(), 0, "process_cpu-").empty());
  CHECK(ProfileFiles(out.path(), 0, "latency-").empty());
  std::vector<Window> off = Load(out.path(), s.pid, "off_cpu");
  std::vector<Window> wall = Load(out.path(), s.pid, "wall");
  REQUIRE(!off.empty());
  REQUIRE(!wall.empty());
  CHECK(ProfileFiles(out.path(), 0, "").size() == off.size() + wall.size());

  Pred me = TidIs(tid);
  int64_t total = SumOf(off, "off_cpu", me);
  int64_t in_sleep = SumOf(off, "off_cpu", And(me, InFunction("sleep_30ms")));
  int64_t in_pipe = SumOf(off, "off_cpu", And(me, InFunction("pipe_wait_10ms")));
  int64_t sleep_sleeping =
      SumOf(off, "off_cpu", And(And(me, InFunction("sleep_30ms")), LabelIs("state", "sleeping")));
  int64_t pipe_sleeping = SumOf(
      off, "off_cpu", And(And(me, InFunction("pipe_wait_10ms")), LabelIs("state", "sleeping")));
  // The stack is the one at the switch: kernel frames (the scheduler) above the user frames.
  int64_t in_sleep_with_sched = SumOf(
      off, "off_cpu",
      And(And(me, InFunction("sleep_30ms")), [](const RawProfile& p, const RawProfile::Sample& x) {
        if (x.location_ids.empty() || !p.IsKernelFrame(x.location_ids[0])) return false;
        for (const auto& fn : p.Frames(x)) {
          if (absl::StrContains(fn, "schedule")) return true;
        }
        return false;
      }));
  int64_t wall_total = SumOf(wall, "wall", me);
  int64_t wall_running = SumOf(wall, "wall", And(me, LabelIs("state", "running")));
  int64_t wall_sleeping = SumOf(wall, "wall", And(me, LabelIs("state", "sleeping")));

  FIGURES("tid " << tid << ": off-CPU total " << Ms(total) << " (truth life-cpu "
              << Ms(life - cpu) << ", sleep+block " << Ms(measured_wait) << "), sleep_30ms "
              << Ms(in_sleep) << " share " << Ratio(in_sleep, total) << " sleeping "
              << Ratio(sleep_sleeping, in_sleep) << " with scheduler frames "
              << Ratio(in_sleep_with_sched, in_sleep) << ", pipe_wait_10ms " << Ms(in_pipe)
              << " share " << Ratio(in_pipe, total) << " sleeping "
              << Ratio(pipe_sleeping, in_pipe) << "; wall " << Ms(wall_total) << " (life "
              << Ms(life) << ", running " << Ms(wall_running) << ", sleeping "
              << Ms(wall_sleeping) << ")");
  REQUIRE(total > 0);
  CHECK(Ratio(in_sleep, total) == Approx(0.75).margin(0.05));
  CHECK(Ratio(in_pipe, total) == Approx(0.25).margin(0.05));
  CHECK(Ratio(sleep_sleeping, in_sleep) >= 0.95);
  CHECK(Ratio(pipe_sleeping, in_pipe) >= 0.95);
  CHECK(Ratio(in_sleep_with_sched, in_sleep) >= 0.95);
  CHECK(Ratio(total, life - cpu) == Approx(1.0).margin(0.05));
  CHECK(Ratio(in_sleep + in_pipe, measured_wait) == Approx(1.0).margin(0.05));
  // The thread lived inside the one window: its wall total is its lifetime, nearly all asleep.
  CHECK(Ratio(wall_total, life) == Approx(1.0).margin(0.05));
  CHECK(Ratio(wall_sleeping, life - cpu) == Approx(1.0).margin(0.05));
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

namespace {

// The wall profile of offcpu_fast's measured thread is its off-CPU intervals plus its on-CPU
// samples (SPEC section 2): the part labelled state=running must be the thread's process_cpu
// samples exactly, the rest its off-CPU profile exactly (the off-CPU total itself is checked
// against the thread's clocks by the caller). Those exact checks carry wall's meaning: samples
// missing from wall, or counted in wall twice, fail them. The running part is sampled, and for this
// thread its relation to the thread's CLOCK_THREAD_CPUTIME_ID time is loose in both directions: the
// thread runs ~4 us at a time, much of it in the scheduler with interrupts off, and a cpu-clock
// tick (an hrtimer) that expires there is taken after the switch, in whichever task comes next:
// ticks of this thread land in its helper or the idle task, the helper's in this thread.
// perf record -e cpu-clock -F 499 -a measured 0.88-0.92 of the thread's CPU time alone and
// 0.60-0.78 beside the agent (whose sched_switch program lengthens that interrupts-off path).
// The agent's own samples: 0.30 and 0.43 in two CI runs (40 samples), 0.63-1.25 in 16 runs on
// the development VM (75-105 samples), and 0.76-1.15 of perf's count in the same runs (~120
// samples each: no loss of the agent's own). So the band against the clock is wide: it only
// catches a sampler that loses most of the thread's samples (a filter or drain bug), or counts
// them a large multiple of times (above 2 / the true ratio: a double count passes it). The
// sampler's accuracy, double counts included, is asserted where it is measurable, on CPU-bound
// threads ("3:1 CPU workload gives 0.75/0.25 shares and its exact CPU total").
void CheckWallOfFastThread(int64_t wall_total, int64_t wall_running, int64_t sampled_cpu,
                           int64_t off_total, int64_t cpu_ns) {
  CHECK(wall_running == sampled_cpu);
  CHECK(Ratio(wall_total - wall_running, off_total) == Approx(1.0).margin(0.001));
  CHECK(Ratio(wall_running, cpu_ns) >= 0.15);
  CHECK(Ratio(wall_running, cpu_ns) <= 2.0);
}

// offcpu_fast (4 s) under the agent with off-CPU stack sampling on (agent_args): the measured
// thread's off-CPU figures from its profiles, against the workload's own clocks.
struct FastRun {
  TempDir out;
  Session s;
  int64_t tid = 0, life = 0, cpu = 0, w20 = 0, w60 = 0, waits = 0;
  std::vector<Window> off, wall, oncpu;
  int64_t total = 0, in20 = 0, in60 = 0, wall_total = 0, wall_running = 0, sampled_cpu = 0;
  uint64_t not_captured = 0, over_budget = 0, weighted = 0;

  explicit FastRun(const std::vector<std::string>& agent_args) {
    std::vector<std::string> args = {"--profiles=cpu,off_cpu,wall", "--duration=6s",
                                     "--sampling-frequency=499"};
    args.insert(args.end(), agent_args.begin(), agent_args.end());
    RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/offcpu_fast", "4"}, args, out.path(), 30, {},
               /*metrics=*/true);
    tid = s.Done("tid");
    life = s.Done("life_ns");
    cpu = s.Done("cpu_ns");
    w20 = s.Done("wait20_ns");
    w60 = s.Done("wait60_ns");
    waits = s.Done("waits");
    // Counted from the agent's start to the end of the workload's phase.
    not_captured = Sampling("not_captured");
    over_budget = Sampling("over_budget");
    weighted = Sampling("weighted");
    off = Load(out.path(), s.pid, "off_cpu");
    wall = Load(out.path(), s.pid, "wall");
    oncpu = Load(out.path(), s.pid, "process_cpu");
    Pred me = TidIs(tid);
    total = SumOf(off, "off_cpu", me);
    in20 = SumOf(off, "off_cpu", And(me, InFunction("wait_20us")));
    in60 = SumOf(off, "off_cpu", And(me, InFunction("wait_60us")));
    wall_total = SumOf(wall, "wall", me);
    wall_running = SumOf(wall, "wall", And(me, LabelIs("state", "running")));
    sampled_cpu = SumOf(oncpu, "cpu", me);
  }

  // parascope_offcpu_stack_sampling_total{event=...} in the /metrics scraped after the phase.
  uint64_t Sampling(const std::string& event) const {
    const double v = MetricValue(
        s.metrics, absl::StrCat("parascope_offcpu_stack_sampling_total{event=\"", event, "\"}"));
    INFO("/metrics after the phase:\n" << s.metrics);
    REQUIRE(v >= 0);
    return static_cast<uint64_t>(v);
  }

  std::string Figures() const {
    std::ostringstream o;
    o << "tid " << tid << ": " << waits << " waits in " << Ms(life) << "; switch-outs not "
      << "captured (rate) " << not_captured << ", over budget " << over_budget
      << ", weighted intervals " << weighted << "; off-CPU total " << Ms(total)
      << " (truth life-cpu " << Ms(life - cpu) << ", ratio " << Ratio(total, life - cpu)
      << "), wait_20us share " << Ratio(in20, total) << " (truth " << Ratio(w20, w20 + w60)
      << "), wait_60us " << Ratio(in60, total) << " (truth " << Ratio(w60, w20 + w60) << "); wall "
      << Ms(wall_total) << " (life " << Ms(life) << "), of it running " << Ms(wall_running)
      << " (process_cpu " << Ms(sampled_cpu) << ", truth cpu " << Ms(cpu) << ", ratio "
      << Ratio(wall_running, cpu) << ") and not running " << Ms(wall_total - wall_running);
    return o.str();
  }

  // The weighted captured intervals, scaled to the thread's exact total (Collector::
  // ExactOffCpuTotals), sum to its off-CPU time and split it between its two wait sites as
  // measured; its wall profile is those intervals plus its on-CPU samples. The totals are measured,
  // so their margin is the switch's own time (about +0.5% here: the tracepoint runs on the time the
  // kernel charges to the next task); weights alone gave 0.96-1.04x. The split is sampled (its
  // margin: about 1,500 captures of each wait site).
  void CheckMeasuredThread() const {
    // The premise: the thread switched far more often than any capture limit.
    REQUIRE(waits * 1e9 / life > 5000);
    REQUIRE(!off.empty());
    REQUIRE(!wall.empty());
    CHECK(weighted > 0);
    REQUIRE(total > 0);
    CHECK(Ratio(total, life - cpu) == Approx(1.0).margin(0.02));
    CHECK(Ratio(in20, total) == Approx(Ratio(w20, w20 + w60)).margin(0.05));
    CHECK(Ratio(in60, total) == Approx(Ratio(w60, w20 + w60)).margin(0.05));
    CheckWallOfFastThread(wall_total, wall_running, sampled_cpu, total, cpu);
  }
};

}  // namespace

// Off-CPU stack sampling (--off-cpu-stack-rate, default 1000/s per thread): a thread blocking
// ~20k times/s has most switch-outs uncaptured, and the weighted captured ones must still sum to
// its off-CPU time and split it between its two wait sites as measured.
TEST_CASE("sched e2e: sampled off-CPU stacks of a thread blocking 20k times a second keep the "
          "total and the split",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  FastRun f({});
  FIGURES(f.Figures());
  CHECK(f.not_captured > 0);
  f.CheckMeasuredThread();
  f.s.work->CloseStdin();
  CHECK(f.s.work->Wait(10) == 0);
}

// The machine-wide capture budget (--off-cpu-stack-budget, bpf/abi.h PS_BUDGET_EXACT_OFFCPU_NS):
// with the per-thread rate off, the CPU the workload's threads are pinned to sees ~40k
// switch-outs a second against a budget of 2000, so most are not captured. The captured short
// intervals, weighted, must still sum to the measured thread's off-CPU time and split it between
// its two wait sites as measured; the 250 ms sleeps of the third thread must count once each,
// exactly, not be dropped or multiplied, also those that cross one of the 1 s window boundaries
// (bpf/abi.h ps_offcpu_weight_final), and with their stacks: a thread whose last wait was that long
// is captured outside the budget (ps_thread_state.last_long), so only its first sleep may lack
// them.
TEST_CASE(
    "sched e2e: a CPU over its off-CPU capture budget keeps the total, the split and the "
    "long waits exact",
    "[root][e2e]") {
  if (!RequireRoot()) return;
  FastRun f({"--collect-interval=1s", "--off-cpu-stack-rate=0", "--off-cpu-stack-budget=2000"});
  const int64_t stall_tid = f.s.Done("stall_tid"), stalls = f.s.Done("stalls");
  const int64_t stall_truth = f.s.Done("stall_life_ns") - f.s.Done("stall_cpu_ns");
  Pred staller = TidIs(stall_tid);
  int64_t stalled = SumOf(f.off, "off_cpu", staller);
  int64_t stalled_in_kernel =
      SumOf(f.off, "off_cpu", And(staller, InFunction("hrtimer_nanosleep")));
  int64_t stalled_in_user = SumOf(f.off, "off_cpu", And(staller, InFunction("stall_250ms")));
  FIGURES(f.Figures() << "; staller " << stalls << " sleeps, off-CPU " << Ms(stalled) << " (truth "
                      << Ms(stall_truth) << ", ratio " << Ratio(stalled, stall_truth) << "), "
                      << Ratio(stalled_in_kernel, stalled) << " of it under hrtimer_nanosleep, "
                      << Ratio(stalled_in_user, stalled) << " under stall_250ms");
  // The premise: the CPU switched far more often than its budget, so the budget bound.
  CHECK(f.over_budget > 0);
  CHECK(f.not_captured == 0);
  f.CheckMeasuredThread();
  // About 16 sleeps: sampled with the CPU's weight (~20) they would be 0 or many times the truth.
  REQUIRE(stalls >= 8);
  // The premise: boundaries fell inside the staller's run (its time spread over 4 windows or more).
  int staller_windows = 0;
  for (const Window& w : f.off) {
    if (SumOf(w.p, "off_cpu", staller) > 0) ++staller_windows;
  }
  REQUIRE(staller_windows >= 4);
  CHECK(Ratio(stalled, stall_truth) == Approx(1.0).margin(0.05));
  CHECK(Ratio(stalled_in_kernel, stalled) >= 0.85);
  CHECK(Ratio(stalled_in_user, stalled) >= 0.85);
  f.s.work->CloseStdin();
  CHECK(f.s.work->Wait(10) == 0);
}

// The capture budget in CPU time (--off-cpu-stack-cpu-budget, bpf/abi.h): with the per-thread
// rate and the budget in captures off, each of the ~40k switch-outs a second on the workload's
// CPU would be captured, at about 8-30 us each here (most of that CPU). The time limit alone must
// hold the captures' CPU time, as the agent measures it (the clock around each capture,
// parascope_offcpu_stack_capture_seconds_total, summed over CPUs), to the machine's allowance:
// P% of each CPU for the candidates and as much again for the exempt captures, over all CPUs
// (the metric has no per-CPU split; on this 2-CPU VM the workload's CPU takes most). Slack: 50 ms
// for the two rate periods (100 ms) the limit lags behind on the workload's CPU, the first (no
// capture measured yet) and the one the workload starts in (its weight from the idle period
// before). The sampled stacks must still keep the total and the split.
TEST_CASE(
    "sched e2e: the off-CPU capture budget in CPU time bounds the captures' CPU time and keeps "
    "the total and the split",
    "[root][e2e]") {
  if (!RequireRoot()) return;
  const double percent = 0.25;
  FastRun f({"--off-cpu-stack-rate=0", "--off-cpu-stack-budget=0",
             absl::StrCat("--off-cpu-stack-cpu-budget=", percent)});
  const double seconds = MetricValue(f.s.metrics, "parascope_offcpu_stack_capture_seconds_total");
  const double captures = MetricValue(f.s.metrics, "parascope_offcpu_stack_captures_total");
  const long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  const double allowance = 2 * percent / 100 * f.s.metrics_after_s * double(ncpu);
  FIGURES(f.Figures() << "; by " << f.s.metrics_after_s << " s on " << ncpu << " CPUs: " << captures
                      << " captures took " << seconds << " s (allowance " << allowance << " s)");
  // The premise: the limit bound (the rate stage and the budget in captures are off).
  CHECK(f.over_budget > 0);
  CHECK(f.not_captured == 0);
  REQUIRE(captures > 0);
  REQUIRE(seconds >= 0);  // -1: not on /metrics
  CHECK(seconds <= allowance + 0.05);
  f.CheckMeasuredThread();
  f.s.work->CloseStdin();
  CHECK(f.s.work->Wait(10) == 0);
}

// A cpuset cgroup limited to CPU 0, made for one test and removed after it: cgroup v2 where the
// cpuset controller is there (a pure v2 host: enabled in the root's cgroup.subtree_control,
// Documentation/admin-guide/cgroup-v2.rst "Cpuset"), else the v1 cpuset hierarchy at
// /sys/fs/cgroup/cpuset (a hybrid host like this VM: cpuset.cpus and cpuset.mems must both be
// set before a task may join, Documentation/admin-guide/cgroup-v1/cpusets.rst).
class CpusetOnCpu0 {
 public:
  CpusetOnCpu0() {
    const std::string name = absl::StrCat("parascope-test-", getpid());
    std::string controllers;
    if (ReadText("/sys/fs/cgroup/cgroup.controllers", &controllers) &&
        absl::StrContains(controllers, "cpuset")) {
      Write("/sys/fs/cgroup/cgroup.subtree_control", "+cpuset");
      dir_ = "/sys/fs/cgroup/" + name;
      REQUIRE(std::filesystem::create_directory(dir_));
      Write(dir_ + "/cpuset.cpus", "0");
    } else {
      INFO("no cpuset controller: neither cgroup v2 (/sys/fs/cgroup/cgroup.controllers) nor v1 "
           "(/sys/fs/cgroup/cpuset) has one");
      REQUIRE(std::filesystem::exists("/sys/fs/cgroup/cpuset/cpuset.cpus"));
      dir_ = "/sys/fs/cgroup/cpuset/" + name;
      REQUIRE(std::filesystem::create_directory(dir_));
      std::string mems;
      REQUIRE(ReadText("/sys/fs/cgroup/cpuset/cpuset.mems", &mems));
      Write(dir_ + "/cpuset.cpus", "0");
      Write(dir_ + "/cpuset.mems", std::string(absl::StripAsciiWhitespace(mems)));
    }
  }
  ~CpusetOnCpu0() {
    if (!dir_.empty()) rmdir(dir_.c_str());  // its only task, the agent, has exited
  }
  // A command prefix that moves the command into the cpuset, then execs it.
  std::vector<std::string> Prefix() const {
    return {"/bin/sh", "-c", "echo $$ > '" + dir_ + "/cgroup.procs' && exec \"$0\" \"$@\""};
  }

 private:
  static bool ReadText(const std::string& path, std::string* out) {
    std::ifstream f(path);
    if (!f) return false;
    std::stringstream ss;
    ss << f.rdbuf();
    *out = ss.str();
    return true;
  }
  static void Write(const std::string& path, const std::string& value) {
    std::ofstream f(path);
    f << value;
    f.flush();
    INFO("writing " << value << " to " << path);
    REQUIRE(f.good());
  }
  std::string dir_;
};

// Issue 11, acceptance 3: the agent confined by a cpuset to CPU 0 while the workload runs on
// CPU 1. The window flip waits for programs in flight on every CPU without running there (bpf/
// abi.h struct ps_progress), so over two windows no sample is lost (samples in the files ==
// samples the BPF program took) and no interval is split wrongly at the boundary (the blocking
// thread's off-CPU and wall totals equal its measured lifetime figures).
TEST_CASE("sched e2e: an agent confined to CPU 0 by a cpuset loses no sample and splits no interval",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  CpusetOnCpu0 cpuset;
  Session s;
  RunSession(&s, {"/usr/bin/taskset", "-c", "1", std::string(PS_WORKLOAD_DIR) + "/offcpu_fast", "4"},
             {"--profiles=cpu,off_cpu,wall", "--collect-interval=3s", "--duration=6s",
              "--sampling-frequency=499"},
             out.path(), 30, cpuset.Prefix());
  const int64_t tid = s.Done("tid");
  const int64_t life = s.Done("life_ns"), cpu = s.Done("cpu_ns");
  const uint64_t windows = StoppedStat(s.agent_log, "windows");
  const uint64_t taken = StoppedStat(s.agent_log, "samples_taken");
  const uint64_t in_profiles = StoppedStat(s.agent_log, "samples_in_profiles");
  const uint64_t timeouts = StoppedStat(s.agent_log, "flip_wait_timeouts");
  std::vector<Window> cpu_files = Load(out.path(), s.pid, "process_cpu");
  std::vector<Window> off = Load(out.path(), s.pid, "off_cpu");
  std::vector<Window> wall = Load(out.path(), s.pid, "wall");
  int64_t samples_in_files = 0;
  for (const Window& w : cpu_files) samples_in_files += SumOf(w.p, "samples", All());
  Pred me = TidIs(tid);
  const int64_t off_total = SumOf(off, "off_cpu", me), wall_total = SumOf(wall, "wall", me);
  const int64_t wall_running = SumOf(wall, "wall", And(me, LabelIs("state", "running")));
  const int64_t sampled_cpu = SumOf(cpu_files, "cpu", me);
  FIGURES(
      "workload on CPU " << s.Done("cpu") << ", agent in a cpuset on CPU 0: " << windows
                         << " windows, samples taken " << taken << ", in profiles " << in_profiles
                         << ", in files " << samples_in_files << ", flip wait timeouts " << timeouts
                         << "; tid " << tid << " off-CPU " << Ms(off_total) << " (truth life-cpu "
                         << Ms(life - cpu) << "), wall " << Ms(wall_total) << " (life " << Ms(life)
                         << "), of it running " << Ms(wall_running) << " (process_cpu "
                         << Ms(sampled_cpu) << ", truth cpu " << Ms(cpu) << ")");
  REQUIRE(s.Done("cpu") == 1);  // the premise: the work ran outside the agent's cpuset
  CHECK(windows == 2);
  CHECK(timeouts == 0);
  REQUIRE(taken > 100);
  CHECK(in_profiles == taken);
  CHECK(samples_in_files == int64_t(in_profiles));
  // The thread's blocking crossed the boundary thousands of times a second; each interval is
  // counted once, in the window it fell in, and each window's total is exact, not a weighted
  // estimate (as in the 20k-blocks test, whose margins these are). With weights alone a window's
  // wall time could exceed the window (3.25 s in 3.15 s, off-CPU +7%).
  CHECK(Ratio(off_total, life - cpu) == Approx(1.0).margin(0.02));
  CheckWallOfFastThread(wall_total, wall_running, sampled_cpu, off_total, cpu);
  for (const Window& w : wall) {
    INFO(w.path);
    if (w.p.duration_nanos > 0) CHECK(SumOf(w.p, "wall", me) <= w.p.duration_nanos * 105 / 100);
  }
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// Acceptance 2 (and 7): CPU vs latency shares, parallelism labels; default --profiles.
TEST_CASE("sched e2e: latency weighs serial_work and parallel_work 1:1 where CPU says 1:2",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  // The premise: B really ran beside A (two CPUs free), so CPU was 1:2 and the parallel phases
  // were parallel. Otherwise the machine was busy and the expected shares do not hold, whatever
  // the agent does. The kernel's own account (schedstat run-queue waits) and B's start delays
  // bound the time the parallel phases were not parallel. A run whose premise failed is
  // repeated (up to 3 runs), so a busy moment of the machine does not fail the suite.
  std::unique_ptr<TempDir> dir;
  Session s;
  bool premise = false;
  for (int attempt = 1; attempt <= 3 && !premise; ++attempt) {
    if (s.work) {
      s.work->CloseStdin();
      s.work->Wait(10);
    }
    dir = std::make_unique<TempDir>();
    s = Session();
    RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/serial_parallel", "4"},
               {"--sampling-frequency=499", "--duration=6s"}, dir->path(), 30);
    const int64_t not_parallel =
        s.Done("b_start_delay_ns") + s.Done("a_runq_wait_ns") + s.Done("b_runq_wait_ns");
    premise = Ratio(s.Done("parallel_cpu_ns"), s.Done("serial_cpu_ns")) >= 1.9 &&
              (s.Done("a_runq_wait_ns") < 0 || s.Done("b_runq_wait_ns") < 0 ||
               Ratio(not_parallel, s.Done("parallel_wall_ns")) <= 0.03);
    FIGURES("premise, run " << attempt << ": serial_work " << Ms(s.Done("serial_cpu_ns"))
                            << " CPU, parallel_work " << Ms(s.Done("parallel_cpu_ns"))
                            << " CPU over both threads; B start delays "
                            << Ms(s.Done("b_start_delay_ns")) << ", run-queue waits A "
                            << Ms(s.Done("a_runq_wait_ns")) << " B "
                            << Ms(s.Done("b_runq_wait_ns")) << ": "
                            << (premise ? "holds" : "does not hold (another process was busy)"));
  }
  REQUIRE(premise);
  const TempDir& out = *dir;
  std::vector<Window> cpu = Load(out.path(), s.pid, "process_cpu");
  std::vector<Window> lat = Load(out.path(), s.pid, "latency");
  // The default --profiles writes all four types.
  std::vector<Window> off = Load(out.path(), s.pid, "off_cpu");
  std::vector<Window> wall = Load(out.path(), s.pid, "wall");
  REQUIRE(!cpu.empty());
  REQUIRE(!lat.empty());
  CHECK(!off.empty());
  CHECK(!wall.empty());
  for (const auto& w : cpu) CHECK(w.p.period == 2004008);  // round(1e9 / 499)

  int64_t cpu_total = SumOf(cpu, "cpu", All());
  int64_t cpu_serial = SumOf(cpu, "cpu", InFunction("serial_work"));
  int64_t cpu_parallel = SumOf(cpu, "cpu", InFunction("parallel_work"));
  int64_t lat_total = SumOf(lat, "latency", All());
  int64_t lat_serial = SumOf(lat, "latency", InFunction("serial_work"));
  int64_t lat_parallel = SumOf(lat, "latency", InFunction("parallel_work"));
  int64_t lat_serial_at1 =
      SumOf(lat, "latency", And(InFunction("serial_work"), LabelIs("parallelism", "1")));
  int64_t lat_parallel_at2 =
      SumOf(lat, "latency", And(InFunction("parallel_work"), LabelIs("parallelism", "2")));
  const int64_t truth_cpu = s.Done("serial_cpu_ns") + s.Done("parallel_cpu_ns");
  const int64_t truth_busy_wall = s.Done("serial_wall_ns") + s.Done("parallel_wall_ns");

  // Diagnostics: how long A and B waited runnable (from the off_cpu profile), and the
  // parallelism of parallel_work's samples per thread.
  std::string diag;
  for (const char* who : {"a_tid", "b_tid"}) {
    Pred me = TidIs(s.Done(who));
    absl::StrAppend(&diag, who, " runnable ",
                    Ms(SumOf(off, "off_cpu", And(me, LabelIs("state", "runnable")))),
                    ", parallel_work latency at 1/2: ",
                    Ms(SumOf(lat, "latency",
                             And(And(me, InFunction("parallel_work")),
                                 LabelIs("parallelism", "1")))),
                    "/",
                    Ms(SumOf(lat, "latency",
                             And(And(me, InFunction("parallel_work")),
                                 LabelIs("parallelism", "2")))),
                    "; ");
  }
  FIGURES(diag);
  FIGURES("cpu total " << Ms(cpu_total) << " (workload " << Ms(truth_cpu) << "): serial_work "
                    << Ratio(cpu_serial, cpu_total) << " parallel_work "
                    << Ratio(cpu_parallel, cpu_total) << "; latency total " << Ms(lat_total)
                    << " (busy wall " << Ms(truth_busy_wall) << "): serial_work "
                    << Ratio(lat_serial, lat_total) << " (at 1: "
                    << Ratio(lat_serial_at1, lat_serial) << ") parallel_work "
                    << Ratio(lat_parallel, lat_total) << " (at 2: "
                    << Ratio(lat_parallel_at2, lat_parallel)
                    << "); mean parallelism " << Ratio(cpu_total, lat_total));
  REQUIRE(cpu_total > 0);
  REQUIRE(lat_total > 0);
  CHECK(Ratio(cpu_serial, cpu_total) == Approx(1.0 / 3).margin(0.07));
  CHECK(Ratio(cpu_parallel, cpu_total) == Approx(2.0 / 3).margin(0.07));
  CHECK(Ratio(lat_serial, lat_total) == Approx(0.5).margin(0.07));
  CHECK(Ratio(lat_parallel, lat_total) == Approx(0.5).margin(0.07));
  CHECK(Ratio(lat_serial_at1, lat_serial) >= 0.90);
  CHECK(Ratio(lat_parallel_at2, lat_parallel) >= 0.90);
  // Spec invariants: sum(latency) is the wall time with at least one thread on a CPU, and the
  // CPU total is the workload's own (sampling error at 499 Hz over 4 s is about 2%).
  CHECK(Ratio(lat_total, truth_busy_wall) == Approx(1.0).margin(0.10));
  CHECK(Ratio(cpu_total, truth_cpu) == Approx(1.0).margin(0.10));
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// Acceptance 3 (and 7): per thread, a whole window of wall time adds up to the window length.
TEST_CASE("sched e2e: wall time of a thread alive for a whole window equals the window length",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  const int64_t kWindow = 2000000000;
  RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/offcpu_mix", "7"},
             {"--profiles=wall", "--collect-interval=2s", "--duration=10s"}, out.path(), 30);
  std::vector<Window> wall = Load(out.path(), s.pid, "wall");
  REQUIRE(wall.size() >= 4);
  CHECK(ProfileFiles(out.path(), 0, "").size() == wall.size());

  struct Thread {
    std::string name;
    int64_t tid, start, end;  // unix ns; the agent saw the thread run from `start` on
  };
  // The main thread blocked in read(2) since before the agent attached; from the measured phase
  // on (it created the other two threads) the agent has seen it switch.
  const std::vector<Thread> threads = {
      {"measured", s.Done("tid"), s.Done("start_unix_ns"), s.Done("end_unix_ns")},
      {"helper", s.Done("helper_tid"), s.Done("helper_start_unix_ns"),
       s.Done("helper_end_unix_ns")},
      {"main", s.Done("main_tid"), s.Done("helper_start_unix_ns"), INT64_MAX},
  };
  for (const Thread& t : threads) {
    int checked = 0;
    int64_t sum_all = 0;
    for (const Window& w : wall) {
      int64_t v = SumOf(w.p, "wall", TidIs(t.tid));
      sum_all += v;
      INFO(t.name << " tid " << t.tid << " window " << w.path << " t0 " << w.t0 << " duration "
                  << w.p.duration_text << " thread [" << t.start << ", " << t.end
                  << "): wall " << Ms(v));
      // Nothing is attributed twice: no window holds more than its length for one thread.
      if (w.p.duration_nanos > 0) CHECK(v <= w.p.duration_nanos * 105 / 100);
      // A whole window (the agent's windows last the collect interval give or take its timer's
      // lateness, and the profile says how long: duration_nanos), not the last partial one.
      if (std::llabs(w.p.duration_nanos - kWindow) > kWindow / 100) continue;
      if (w.t0 < t.start || w.t0 + w.p.duration_nanos > t.end) continue;
      ++checked;
      CHECK(Ratio(v, w.p.duration_nanos) == Approx(1.0).margin(0.05));
    }
    FIGURES(t.name << " tid " << t.tid << ": " << checked << " whole windows checked, wall over all "
                << "windows " << Ms(sum_all) << ", lifetime "
                << (t.end == INT64_MAX ? std::string("-") : Ms(t.end - t.start)));
    CHECK(checked >= (t.name == "main" ? 2 : 1));
    // Split at window boundaries, nothing lost: the measured and helper threads' wall totals over
    // all windows are their lifetimes.
    if (t.end != INT64_MAX) CHECK(Ratio(sum_all, t.end - t.start) == Approx(1.0).margin(0.05));
  }
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// Acceptance 4 (and 7): two threads sharing one CPU wait runnable about as long as they run.
TEST_CASE("sched e2e: run-queue delay of two threads pinned to one CPU matches their CPU time",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  // The agent's own user-space work runs on CPU 1, away from the pair on CPU 0.
  RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/pinned_pair", "4"},
             {"--profiles=off_cpu,cpu", "--duration=6s", "--sampling-frequency=99"}, out.path(),
             30, {"/usr/bin/taskset", "-c", "1"});
  std::vector<Window> off = Load(out.path(), s.pid, "off_cpu");
  std::vector<Window> cpu = Load(out.path(), s.pid, "process_cpu");
  REQUIRE(!off.empty());
  CHECK(!cpu.empty());
  for (int i : {1, 2}) {
    const int64_t tid = s.Done(absl::StrCat("tid", i));
    const int64_t truth_cpu = s.Done(absl::StrCat("cpu", i, "_ns"));
    const int64_t truth_wait = s.Done(absl::StrCat("wait", i, "_ns"));  // schedstat, -1: n/a
    Pred me = TidIs(tid);
    int64_t runnable = SumOf(off, "off_cpu", And(me, LabelIs("state", "runnable")));
    int64_t runnable_in_spin =
        SumOf(off, "off_cpu", And(And(me, LabelIs("state", "runnable")), InFunction("spin_pinned")));
    int64_t other = SumOf(off, "off_cpu", me) - runnable;
    int64_t sampled_cpu = SumOf(cpu, "cpu", me);
    FIGURES("thread " << i << " tid " << tid << ": runnable " << Ms(runnable) << " (in spin_pinned "
                   << Ratio(runnable_in_spin, runnable) << "), other off-CPU " << Ms(other)
                   << "; cpu " << Ms(truth_cpu) << " (profile " << Ms(sampled_cpu)
                   << "), schedstat run-queue wait " << Ms(truth_wait));
    REQUIRE(runnable > 0);
    // The truth is the kernel's own account of the run-queue wait (schedstat), whatever else
    // shared CPU 0 meanwhile. On a quiet machine that wait is also the partner's CPU time; that
    // is the truth only where schedstat is missing, or when its figures say CPU 0 was quiet.
    const bool quiet = truth_wait < 0 || Ratio(truth_wait, truth_cpu) == Approx(1.0).margin(0.10);
    if (truth_wait >= 0) CHECK(Ratio(runnable, truth_wait) == Approx(1.0).margin(0.15));
    if (quiet) CHECK(Ratio(runnable, truth_cpu) == Approx(1.0).margin(0.15));
    CHECK(Ratio(runnable_in_spin, runnable) >= 0.90);
  }
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// Acceptance 5 (and 7): a sleep that ends on another CPU is measured once, at its true length.
TEST_CASE("sched e2e: sleeps that wake on another CPU are counted at their length", "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/migrate_sleeper", "60"},
             {"--profiles=off_cpu", "--duration=6s"}, out.path(), 30);
  const int64_t tid = s.Done("tid"), rounds = s.Done("rounds");
  const int64_t slept = s.Done("sleep_ns"), life = s.Done("life_ns"), cpu = s.Done("cpu_ns");
  // The premise: the sleeper woke on the CPU it was moved to.
  CHECK(s.Done("migrated") >= rounds * 9 / 10);
  std::vector<Window> off = Load(out.path(), s.pid, "off_cpu");
  REQUIRE(!off.empty());
  Pred me = TidIs(tid);
  int64_t sleeping = SumOf(off, "off_cpu", And(me, LabelIs("state", "sleeping")));
  int64_t sleeping_in_fn =
      SumOf(off, "off_cpu", And(And(me, LabelIs("state", "sleeping")), InFunction("sleep_50ms")));
  int64_t total = SumOf(off, "off_cpu", me);
  int64_t largest = 0;
  for (const auto& w : off) {
    int vi = w.p.ValueIndex("off_cpu");
    for (const auto& x : w.p.samples) {
      if (me(w.p, x)) largest = std::max(largest, x.values[vi]);
    }
  }
  FIGURES("tid " << tid << ": sleeping " << Ms(sleeping) << " (in sleep_50ms "
              << Ratio(sleeping_in_fn, sleeping) << ") vs slept " << Ms(slept) << " over "
              << rounds << " rounds (migrated " << s.Done("migrated") << "); all off-CPU "
              << Ms(total) << " vs life-cpu " << Ms(life - cpu) << "; largest sample "
              << Ms(largest));
  REQUIRE(sleeping > 0);
  CHECK(Ratio(sleeping, slept) == Approx(1.0).margin(0.05));
  CHECK(Ratio(sleeping_in_fn, sleeping) >= 0.95);
  // Not inflated: all of the thread's off-CPU time fits in its off-CPU lifetime, and no stack
  // holds more than the thread ever slept.
  CHECK(Ratio(total, life - cpu) <= 1.05);
  CHECK(largest <= slept * 105 / 100);
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// Acceptance 6 (and 7): per-thread BPF state is freed when threads exit.
TEST_CASE("sched e2e: thread churn leaves no per-thread state behind", "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  // 199 Hz: the workload uses ~0.4% of a CPU (200 short threads a second), which at the default
  // 19 Hz gives ~5 on-CPU samples in 60 s, and no process_cpu/latency profile at all in ~1% of
  // runs (seen once on a fresh machine).
  RunSession(&s, {std::string(PS_WORKLOAD_DIR) + "/thread_churn", "60"},
             {"--duration=64s", "--collect-interval=5s", "--sampling-frequency=199"}, out.path(),
             90);
  const int64_t threads = s.Done("threads");
  uint64_t states = StoppedStat(s.agent_log, "thread_states");
  uint64_t states_max = StoppedStat(s.agent_log, "thread_states_max");
  uint64_t map_full = StoppedStat(s.agent_log, "thread_map_full");
  FIGURES("threads created " << threads << "; thread_states=" << states
                          << " thread_states_max=" << states_max
                          << " thread_map_full=" << map_full);
  CHECK(threads >= 11000);  // about 200 a second
  CHECK(states <= 16);
  CHECK(states_max <= 500);
  CHECK(map_full == 0);
  size_t files = 0;
  for (const char* name : {"process_cpu", "off_cpu", "wall", "latency"}) {
    std::vector<Window> ws = Load(out.path(), s.pid, name);
    INFO(name);
    CHECK(!ws.empty());
    files += ws.size();
  }
  CHECK(ProfileFiles(out.path(), 0, "").size() == files);
  s.work->CloseStdin();
  CHECK(s.work->Wait(10) == 0);
}

// ---- Latency per process group (--latency-group, command mode) ----

namespace {

const std::string kFakebuild = std::string(PS_WORKLOAD_DIR) + "/fakebuild";

// The shares fakebuild's ground truth predicts, measured in a set of profiles.
struct StepShares {
  int64_t cpu_total = 0, lat_total = 0;
  double cpu_serial = 0, cpu_parallel = 0, lat_serial = 0, lat_parallel = 0;
  double parallel_at2 = 0;  // share of parallel_step's latency at parallelism 2
  double serial_at1 = 0;
};

StepShares Measure(const std::vector<Window>& cpu, const std::vector<Window>& lat) {
  StepShares m;
  m.cpu_total = SumOf(cpu, "cpu", All());
  m.lat_total = SumOf(lat, "latency", All());
  m.cpu_serial = Ratio(SumOf(cpu, "cpu", InFunction("serial_step")), m.cpu_total);
  m.cpu_parallel = Ratio(SumOf(cpu, "cpu", InFunction("parallel_step")), m.cpu_total);
  const int64_t ls = SumOf(lat, "latency", InFunction("serial_step"));
  const int64_t lp = SumOf(lat, "latency", InFunction("parallel_step"));
  m.lat_serial = Ratio(ls, m.lat_total);
  m.lat_parallel = Ratio(lp, m.lat_total);
  m.parallel_at2 = Ratio(
      SumOf(lat, "latency", And(InFunction("parallel_step"), LabelIs("parallelism", "2"))), lp);
  m.serial_at1 =
      Ratio(SumOf(lat, "latency", And(InFunction("serial_step"), LabelIs("parallelism", "1"))), ls);
  return m;
}

std::string Describe(const StepShares& m) {
  return absl::StrCat("cpu ", Ms(m.cpu_total), ": serial_step ", m.cpu_serial, " parallel_step ",
                      m.cpu_parallel, "; latency ", Ms(m.lat_total), ": serial_step ",
                      m.lat_serial, " (at 1: ", m.serial_at1, ") parallel_step ", m.lat_parallel,
                      " (at 2: ", m.parallel_at2, ")");
}

// The premise of fakebuild's shares: the children really ran at once (two CPUs free), so CPU was
// 1:2. Their run-queue waits bound the time the parallel phases were not parallel.
bool FakebuildPremise(const std::map<std::string, std::string>& done, std::string* why) {
  int64_t serial = 0, parallel = 0, runq = 0;
  absl::SimpleAtoi(done.count("serial_cpu_ns") ? done.at("serial_cpu_ns") : "", &serial);
  absl::SimpleAtoi(done.count("parallel_cpu_ns") ? done.at("parallel_cpu_ns") : "", &parallel);
  absl::SimpleAtoi(done.count("children_runq_wait_ns") ? done.at("children_runq_wait_ns") : "",
                   &runq);
  const bool ok = Ratio(parallel, serial) >= 1.85 && Ratio(runq, parallel) <= 0.08;
  *why = absl::StrCat("serial_step ", Ms(serial), " CPU, parallel_step ", Ms(parallel),
                      " CPU over the children, their run-queue wait ", Ms(runq), ": ",
                      ok ? "holds" : "does not hold (another process was busy)");
  return ok;
}

// The least share of parallel_step's latency at parallelism 2 the scheduler allowed: each ms one
// of the two children waits in the run queue is a ms the step runs at parallelism 1, so the
// share falls about twice as fast as their wait grows (measured in CI: wait 7.4% of their CPU,
// 0.86 at 2). 0.90 on a quiet machine (measured 0.93-0.98), lowered by twice the wait beyond
// 2.5% (what this VM shows when quiet).
double ParallelAt2Bar(const std::map<std::string, std::string>& done) {
  int64_t parallel = 0, runq = 0;
  absl::SimpleAtoi(done.count("parallel_cpu_ns") ? done.at("parallel_cpu_ns") : "", &parallel);
  absl::SimpleAtoi(done.count("children_runq_wait_ns") ? done.at("children_runq_wait_ns") : "",
                   &runq);
  return 0.90 - 2 * std::max(0.0, Ratio(runq, parallel) - 0.025);
}

// The cgroup2 mount: /sys/fs/cgroup on a pure v2 host, /sys/fs/cgroup/unified on a hybrid one.
std::string Cgroup2Mount() {
  std::ifstream mounts("/proc/self/mounts");
  std::string dev, dir, type;
  std::string rest;
  while (mounts >> dev >> dir >> type) {
    std::getline(mounts, rest);
    if (type == "cgroup2") return dir;
  }
  return "";
}

// A cgroup v2 of its own for a test, removed at the end (its processes must have exited).
class TestCgroup {
 public:
  TestCgroup() {
    const std::string mount = Cgroup2Mount();
    REQUIRE(!mount.empty());
    path_ = absl::StrCat(mount, "/parascope-test-", getpid());
    std::filesystem::create_directory(path_);
    struct stat st {};
    REQUIRE(stat(path_.c_str(), &st) == 0);
    id_ = st.st_ino;  // the cgroup's id (kernfs node id = inode number in cgroup2fs)
  }
  ~TestCgroup() { rmdir(path_.c_str()); }
  void Add(pid_t pid) {
    std::ofstream procs(path_ + "/cgroup.procs");
    procs << pid << "\n";
    procs.close();
    REQUIRE(procs.good());
  }
  uint64_t id() const { return id_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  uint64_t id_ = 0;
};

// Every "<name>-*.pb.gz" of cgroup `id` (DIR/cgroup/<id>/), read with pprof.
std::vector<Window> LoadCgroup(const std::string& dir, uint64_t id, const std::string& name) {
  std::vector<Window> out;
  const std::string d = absl::StrCat(dir, "/cgroup/", id);
  if (!std::filesystem::is_directory(d)) return out;
  for (const auto& e : std::filesystem::directory_iterator(d)) {
    const std::string f = e.path().filename();
    if (!absl::StartsWith(f, name + "-") || !absl::EndsWith(f, ".pb.gz")) continue;
    Window w;
    w.path = e.path();
    w.p = ReadWithPprof(w.path);
    CHECK(w.p.sample_types == SampleTypes().at(name));
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

// Issue 13, acceptance 1 and 3: `parascope -- ./fakebuild` counts parallelism over the command's
// tree, so the job's serial bottleneck shows at its share of the time the user waits.
TEST_CASE("latency groups: command mode profiles a fake build as one tree, CPU 1/3 2/3 and "
          "latency 1/2 1/2, and exits with its status",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  std::unique_ptr<TempDir> out;
  std::unique_ptr<Child> agent;
  std::map<std::string, std::string> done;
  int status = -1;
  bool premise = false;
  for (int attempt = 1; attempt <= 3 && !premise; ++attempt) {
    out = std::make_unique<TempDir>();
    agent = std::make_unique<Child>(std::vector<std::string>{
        PS_AGENT_BIN, "--sampling-frequency=499", "--collect-interval=2s",
        "--output-dir=" + out->path(), "--", kFakebuild, "build", "6", "3"});
    status = agent->Wait(120);
    INFO("agent stderr:\n" << agent->stderr_text() << "\nstdout:\n" << agent->stdout_text());
    REQUIRE(WIFEXITED(status));
    std::string done_line;
    for (absl::string_view l : absl::StrSplit(agent->stdout_text(), '\n')) {
      if (absl::StartsWith(l, "done ")) done_line = std::string(l);
    }
    REQUIRE(!done_line.empty());
    done = KeyValues(done_line);
    std::string why;
    premise = FakebuildPremise(done, &why);
    FIGURES("premise, run " << attempt << ": " << why);
  }
  REQUIRE(premise);
  INFO("agent stderr:\n" << agent->stderr_text() << "\nstdout:\n" << agent->stdout_text());
  // The command's exit status is the agent's.
  CHECK(WEXITSTATUS(status) == 3);
  // The summary is the tree's: one entry for the command and its descendants.
  CHECK(std::regex_search(agent->stdout_text(), std::regex("fakebuild +and descendants \\(")));

  std::vector<Window> cpu = Load(out->path(), 0, "process_cpu");
  std::vector<Window> lat = Load(out->path(), 0, "latency");
  REQUIRE(!cpu.empty());
  REQUIRE(!lat.empty());
  // One profile per type and window for the whole tree, all in the root's directory.
  std::set<std::string> dirs;
  for (const std::string& f : ProfileFiles(out->path(), 0, "")) {
    dirs.insert(std::filesystem::path(f).parent_path());
  }
  CHECK(dirs.size() == 1);
  CHECK(cpu.size() == lat.size());
  // Every sample names its process: label process (the comm) and pid; the children are there.
  // The command's process is the agent's fork ("parascope") until its exec, a moment after
  // attach.
  std::set<std::string> pids;
  for (const Window& w : lat) {
    for (const auto& smp : w.p.samples) {
      const std::string process = Label(smp, "process");
      CHECK((process == "fakebuild" || process == "parascope"));
      pids.insert(Label(smp, "pid"));
    }
  }
  CHECK(Ratio(SumOf(lat, "latency", LabelIs("process", "fakebuild")), SumOf(lat, "latency", All())) >=
        0.99);
  int64_t rounds = 0;
  REQUIRE(absl::SimpleAtoi(done.at("rounds"), &rounds));
  CHECK(pids.count("") == 0);
  CHECK(int64_t(pids.size()) >= rounds * 2 * 9 / 10);  // the parent and most children sampled

  const StepShares m = Measure(cpu, lat);
  int64_t busy = 0, truth_cpu = 0, serial = 0, parallel = 0;
  REQUIRE(absl::SimpleAtoi(done.at("busy_wall_ns"), &busy));
  REQUIRE(absl::SimpleAtoi(done.at("serial_cpu_ns"), &serial));
  REQUIRE(absl::SimpleAtoi(done.at("parallel_cpu_ns"), &parallel));
  truth_cpu = serial + parallel;
  FIGURES(Describe(m) << "; truth: CPU " << Ms(truth_cpu) << ", busy wall " << Ms(busy) << ", "
                      << rounds << " rounds, " << pids.size() << " pids in the profiles");
  CHECK(m.cpu_serial == Approx(1.0 / 3).margin(0.07));
  CHECK(m.cpu_parallel == Approx(2.0 / 3).margin(0.07));
  CHECK(m.lat_serial == Approx(0.5).margin(0.07));
  CHECK(m.lat_parallel == Approx(0.5).margin(0.07));
  CHECK(m.parallel_at2 >= ParallelAt2Bar(done));
  // SPEC section 2 per group: sum(latency) is the wall time with at least one of the tree's
  // threads on a CPU (the rounds: the serial step, then the children's parallel step).
  CHECK(Ratio(m.lat_total, busy) == Approx(1.0).margin(0.10));
  CHECK(Ratio(m.cpu_total, truth_cpu) == Approx(1.0).margin(0.10));
}

// Issue 13, acceptance 1: the exit status of the command, whatever it is.
TEST_CASE("latency groups: command mode exits 0, 1, 126, 127 and 128+signal like its command",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  TempDir scratch;
  const std::string not_exec = scratch.path() + "/not-executable";
  std::ofstream(not_exec) << "#!/bin/sh\n";
  struct Case {
    std::vector<std::string> command;
    int status;
  };
  const std::vector<Case> cases = {
      {{"true"}, 0},
      {{"/bin/sh", "-c", "exit 1"}, 1},
      {{not_exec}, 126},
      {{"parascope-no-such-command"}, 127},
      {{"/bin/sh", "-c", "kill -TERM $$"}, 128 + SIGTERM},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {PS_AGENT_BIN, "--profiles=cpu",
                                     "--output-dir=" + out.path(), "--"};
    argv.insert(argv.end(), c.command.begin(), c.command.end());
    Child agent(argv);
    const int status = agent.Wait(60);
    INFO(absl::StrJoin(argv, " ") << "\nagent stderr:\n" << agent.stderr_text());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == c.status);
    if (c.status >= 126 && c.status <= 127) {
      CHECK(absl::StrContains(agent.stderr_text(), c.command[0]));
    }
  }
}

// Issue 13, acceptance 2: the daemon with --latency-group=cgroup writes the cgroup's latency
// profile with the tree's shares; per process (the default) latency equals CPU.
TEST_CASE("latency groups: a cgroup's latency profile shows 1/2 1/2 where per process latency "
          "equals CPU",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  struct Run {
    std::unique_ptr<TempDir> out;
    std::map<std::string, std::string> done;
    uint64_t cgroup = 0;
  };
  // fakebuild in a cgroup of its own, the agent system-wide around it.
  auto run = [](const std::string& group) {
    Run r;
    bool premise = false;
    for (int attempt = 1; attempt <= 3 && !premise; ++attempt) {
      r.out = std::make_unique<TempDir>();
      TestCgroup cg;
      r.cgroup = cg.id();
      Child work({kFakebuild, "build", "6", "0", "wait"});
      std::string line;
      REQUIRE(work.ReadStdoutLine(&line));
      REQUIRE(absl::StartsWith(line, "ready "));
      cg.Add(std::stoi(line.substr(6)));
      Child agent({PS_AGENT_BIN, "--latency-group=" + group, "--profiles=cpu,latency",
                   "--sampling-frequency=499", "--collect-interval=3s", "--duration=11s",
                   "--http-address=", "--output-dir=" + r.out->path()});
      const bool attached = agent.WaitForStderr("attached:", &line);
      INFO("agent stderr:\n" << agent.stderr_text());
      REQUIRE(attached);
      work.WriteStdin("go\n");
      REQUIRE(work.ReadStdoutLine(&line, 60));
      REQUIRE(absl::StartsWith(line, "done "));
      r.done = KeyValues(line);
      const bool ran_through = agent.Running();
      CHECK(work.Wait(10) == 0);
      const int status = agent.Wait(60);
      INFO("agent stderr:\n" << agent.stderr_text());
      REQUIRE(ran_through);
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);
      std::string why;
      premise = FakebuildPremise(r.done, &why);
      FIGURES("--latency-group=" << group << ", premise, run " << attempt << ": " << why);
    }
    REQUIRE(premise);
    return r;
  };

  {
    Run r = run("cgroup");
    std::vector<Window> lat = LoadCgroup(r.out->path(), r.cgroup, "latency");
    REQUIRE(!lat.empty());
    // The cgroup's directory holds its latency profiles only (process_cpu stays per process).
    CHECK(LoadCgroup(r.out->path(), r.cgroup, "process_cpu").empty());
    // Its CPU: the processes' own CPU profiles of the samples in fakebuild's steps.
    std::vector<Window> cpu = Load(r.out->path(), 0, "process_cpu");
    StepShares m = Measure(cpu, lat);
    const int64_t cpu_steps = SumOf(cpu, "cpu", InFunction("serial_step")) +
                              SumOf(cpu, "cpu", InFunction("parallel_step"));
    m.cpu_serial = Ratio(SumOf(cpu, "cpu", InFunction("serial_step")), cpu_steps);
    m.cpu_parallel = Ratio(SumOf(cpu, "cpu", InFunction("parallel_step")), cpu_steps);
    int64_t busy = 0;
    REQUIRE(absl::SimpleAtoi(r.done.at("busy_wall_ns"), &busy));
    FIGURES("cgroup " << r.cgroup << ": " << Describe(m) << "; busy wall " << Ms(busy));
    // Every sample of the cgroup's profile names its process.
    for (const Window& w : lat) {
      for (const auto& smp : w.p.samples) CHECK(Label(smp, "process") == "fakebuild");
    }
    CHECK(m.cpu_serial == Approx(1.0 / 3).margin(0.07));
    CHECK(m.lat_serial == Approx(0.5).margin(0.07));
    CHECK(m.lat_parallel == Approx(0.5).margin(0.07));
    CHECK(m.parallel_at2 >= ParallelAt2Bar(r.done));
    CHECK(Ratio(m.lat_total, busy) == Approx(1.0).margin(0.10));
  }
  {
    Run r = run("process");
    // No cgroup profiles; each of fakebuild's processes has latency == CPU (parallelism 1).
    CHECK(!std::filesystem::exists(r.out->path() + "/cgroup"));
    std::vector<Window> cpu = Load(r.out->path(), 0, "process_cpu");
    std::vector<Window> lat = Load(r.out->path(), 0, "latency");
    Pred steps = [](const RawProfile& p, const RawProfile::Sample& smp) {
      return InFunction("serial_step")(p, smp) || InFunction("parallel_step")(p, smp);
    };
    const int64_t cpu_steps = SumOf(cpu, "cpu", steps), lat_steps = SumOf(lat, "latency", steps);
    const double lat_serial = Ratio(SumOf(lat, "latency", InFunction("serial_step")), lat_steps);
    const double cpu_serial = Ratio(SumOf(cpu, "cpu", InFunction("serial_step")), cpu_steps);
    FIGURES("per process: fakebuild's steps cpu " << Ms(cpu_steps) << " latency "
                                                  << Ms(lat_steps) << ", serial_step cpu "
                                                  << cpu_serial << " latency " << lat_serial);
    REQUIRE(cpu_steps > 0);
    CHECK(Ratio(lat_steps, cpu_steps) == Approx(1.0).margin(0.01));
    CHECK(lat_serial == Approx(1.0 / 3).margin(0.07));
  }
}

// Issue 13, acceptance 4, per process and per cgroup: the daemon's counts of 10,000 exited
// processes, and of 200 removed cgroups, are released (the gauge returns to where it was, give or
// take what the rest of the host did meanwhile).
TEST_CASE("latency groups: the counts of exited processes and removed cgroups are released",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  for (const std::string group : {"process", "cgroup"}) {
    INFO("--latency-group=" << group);
    TempDir out;
    Child agent({PS_AGENT_BIN, "--latency-group=" + group, "--profiles=cpu,latency",
                 "--collect-interval=2s", "--http-address=127.0.0.1:0",
                 "--output-dir=" + out.path()});
    const int port = AttachedMetricsPort(&agent);
    INFO("agent stderr:\n" << agent.stderr_text());
    REQUIRE(port > 0);
    const std::string before = Scrape(port);
    const double groups0 = MetricValue(before, "parascope_parallelism_groups");
    const double made0 =
        MetricValue(before, "parascope_parallelism_group_events_total{event=\"made\"}");
    double expected = 0;
    if (group == "process") {
      Child churn({kFakebuild, "churn", "10000"});
      std::string line;
      REQUIRE(churn.ReadStdoutLine(&line, 180));
      REQUIRE(line == "done children=10000");
      churn.CloseStdin();
      CHECK(churn.Wait(30) == 0);
      expected = 10000;
    } else {
      for (int i = 0; i < 200; ++i) {
        TestCgroup cg;
        // The shell moves itself into the cgroup, then forks /bin/true there: a new task's first
        // switch-in counts it in the cgroup (a task moved while running stays counted where it
        // was until it switches out).
        Child one({"/bin/sh", "-c", "echo $$ >" + cg.path() + "/cgroup.procs && /bin/true; exit"});
        CHECK(one.Wait(30) == 0);
      }  // each cgroup removed here
      expected = 200;
    }
    const std::string after = Scrape(port);
    INFO(after);
    const double made =
        MetricValue(after, "parascope_parallelism_group_events_total{event=\"made\"}") - made0;
    const double groups = MetricValue(after, "parascope_parallelism_groups");
    FIGURES("--latency-group=" << group << ": " << made << " counts made, groups " << groups0
                               << " before and " << groups << " after");
    // Each process, each cgroup had a count (but those whose only switch-in the tracepoint did
    // not report: the sampler makes none, bpf/common.bpf.h).
    CHECK(made >= expected * 0.9);
    CHECK(groups <= groups0 + 20);  // and it was released
    CHECK(MetricValue(after, "parascope_bpf_events_dropped_total{map=\"running\"}") == 0);
    REQUIRE(kill(agent.pid(), SIGTERM) == 0);
    const int status = agent.Wait(60);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
  }
}

// Issue 13, acceptance 4: a tree member's state goes with it. 10,000 processes fork and exit in
// the command's tree; afterwards the kernel tracks the root alone and one parallelism count.
TEST_CASE("latency groups: command mode keeps no state of 10000 exited tree members",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Child agent({PS_AGENT_BIN, "--collect-interval=1s", "--http-address=127.0.0.1:0",
               "--output-dir=" + out.path(), "--", kFakebuild, "churn", "10000"});
  const int port = AttachedMetricsPort(&agent);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(port > 0);
  // The command's stdout is the agent's.
  std::string line;
  REQUIRE(agent.ReadStdoutLine(&line, 180));
  REQUIRE(line == "done children=10000");
  const std::string text = Scrape(port);
  INFO(text);
  CHECK(MetricValue(text, "parascope_tree_forks_total{outcome=\"followed\"}") == 10000);
  CHECK(MetricValue(text, "parascope_tree_forks_total{outcome=\"lost\"}") == 0);
  CHECK(MetricValue(text, "parascope_tree_processes") == 1);
  CHECK(MetricValue(text, "parascope_parallelism_groups") == 1);
  CHECK(MetricValue(text, "parascope_bpf_events_dropped_total{map=\"running\"}") == 0);
  agent.CloseStdin();
  const int status = agent.Wait(60);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace parascope::testing
