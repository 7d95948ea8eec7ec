#!/usr/bin/env python3
"""parascope benchmark harness: overhead, cost per event and footprint, side by side with peers.

Runs each scenario with no profiler, with parascope at its defaults (writing to a local dir) and
with the peers users would otherwise run (perf record, libbpf-tools offcputime, bpftrace),
interleaved run by run, then measures the agent's footprint. Prints one report and writes it as
JSON and Markdown under build/bench/. Figures only: a missed budget is reported, never fatal.
Exit status: 0 when every measurement was taken, 1 when some could not be (a profiler or workload
failed; the report lists which), 2 on a usage or environment problem (not root, missing tools).

Settings come from the environment (see bench/README.md): BENCH_RUNS, BENCH_SECONDS,
BENCH_CHURN_PROCS, BENCH_THREADS, BENCH_PINGPONG_CPU, BENCH_SCENARIOS, BENCH_TOOLS,
BENCH_FOOTPRINT_SECONDS, BENCH_CPU_PROCS, BENCH_LIVE_PROCS, BENCH_MEMORY_MINUTES, BENCH_OUT,
PARASCOPE.
"""

import datetime
import json
import os
import platform
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def env_int(name, default):
    return int(os.environ.get(name, default))


def env_float(name, default):
    return float(os.environ.get(name, default))


SETTINGS = {
    "runs": env_int("BENCH_RUNS", 3),  # runs per scenario and tool
    "seconds": env_float("BENCH_SECONDS", 4),  # length of scenarios 1, 2 and 4
    "churn_procs": env_int("BENCH_CHURN_PROCS", 1000),  # processes per scenario-3 run
    "threads": env_int("BENCH_THREADS", 500),  # scenario 4
    # scenario 2: both threads on this CPU (default: the last one; -1: unpinned). Unpinned,
    # the figure swings 2-3x with where the scheduler puts the two threads.
    "pingpong_cpu": env_int("BENCH_PINGPONG_CPU", os.cpu_count() - 1),
    "scenarios": os.environ.get("BENCH_SCENARIOS", "cpu,switch,churn,threads").split(","),
    "tools": os.environ.get("BENCH_TOOLS", "parascope,perf,offcputime,bpftrace").split(","),
    # footprint: agent CPU with BENCH_CPU_PROCS processes (also for each peer) and RSS with
    # BENCH_LIVE_PROCS live processes, each for BENCH_FOOTPRINT_SECONDS (two default windows);
    # RSS after BENCH_MEMORY_MINUTES of continuous process churn (0 skips it)
    "footprint_seconds": env_float("BENCH_FOOTPRINT_SECONDS", 30),
    "cpu_procs": env_int("BENCH_CPU_PROCS", 200),
    "live_procs": env_int("BENCH_LIVE_PROCS", 1000),
    "memory_minutes": env_float("BENCH_MEMORY_MINUTES", 2),
    # other work on the machine: before each run wait (at most quiet_wait_s per run, at most
    # quiet_budget_s in all) until the CPUs were less than quiet_cores busy for half a second
    "quiet_cores": env_float("BENCH_QUIET_CORES", 0.2),
    "quiet_wait_s": env_float("BENCH_QUIET_WAIT", 10),
    "quiet_budget_s": env_float("BENCH_QUIET_BUDGET", 60),
}
OUT = os.path.abspath(os.environ.get("BENCH_OUT", os.path.join(ROOT, "build", "bench")))
PARASCOPE = os.path.abspath(os.environ.get("PARASCOPE", os.path.join(ROOT, "build/bin/parascope")))
# parascope's default window (--collect-interval), for the steady-state footprint measurement.
PARASCOPE_WINDOW_S = 15
WORKLOADS = os.path.join(ROOT, "bench", "workloads")
TMP = os.path.join(OUT, "tmp")
LOGS = os.path.join(OUT, "logs")
NCPU = os.cpu_count()
CLK_TCK = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024

BUDGET_SCENARIO1_SLOWDOWN = 0.01
BUDGET_SCHED_SWITCH_NS = 500
BUDGET_PERF_EVENT_NS = 5000
BUDGET_AGENT_CPU = 0.01  # fraction of one core
BUDGET_RSS_MIB = 64


def log(msg):
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    """A measurement that could not be taken (a profiler or workload failed)."""


# ---------------------------------------------------------------------------------------------
# /proc and bpftool readers


def proc_cpu_seconds(pid):
    """utime + stime of a live process, in seconds (proc(5): fields 14 and 15 of stat)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def machine_cpu_seconds():
    """(busy, steal) CPU seconds of the whole machine so far, from /proc/stat's cpu line."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


def children_cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


class CpuMeter:
    """CPU the machine spent during an interval, split into the workload's (our reaped
    children), the profiler's and the rest ("other": other users of the machine, plus kernel
    threads working for the workload), in cores; and steal (the hypervisor's)."""

    def __init__(self, profiler_pid=None):
        self.profiler_pid = profiler_pid
        self.t0 = time.monotonic()
        self.busy0, self.steal0 = machine_cpu_seconds()
        self.children0 = children_cpu_seconds()
        self.prof0 = proc_cpu_seconds(profiler_pid) if profiler_pid else 0.0

    def read(self):
        secs = time.monotonic() - self.t0
        busy, steal = machine_cpu_seconds()
        workload = children_cpu_seconds() - self.children0
        prof = (proc_cpu_seconds(self.profiler_pid) - self.prof0) if self.profiler_pid else 0.0
        busy -= self.busy0
        return {"seconds": secs, "busy_cores": busy / secs, "workload_cores": workload / secs,
                "profiler_cores": prof / secs,
                "other_cores": max(0.0, busy - workload - prof) / secs,
                "steal_cores": (steal - self.steal0) / secs}


QUIET_SPENT = [0.0]  # seconds waited for a quiet machine so far


def wait_quiet():
    """Waits until the machine was nearly idle for half a second (bounded); returns the seconds
    waited beyond that half second."""
    t0 = time.monotonic()
    while True:
        busy0, _ = machine_cpu_seconds()
        time.sleep(0.5)
        busy = (machine_cpu_seconds()[0] - busy0) / 0.5
        waited = time.monotonic() - t0 - 0.5
        if (busy < SETTINGS["quiet_cores"] or waited >= SETTINGS["quiet_wait_s"]
                or QUIET_SPENT[0] + waited >= SETTINGS["quiet_budget_s"]):
            QUIET_SPENT[0] += waited
            return waited


def bpf_fdinfo_field(pid, kinds, field):
    """Integer `field` from the fdinfo of each fd of a process whose link target contains one of
    `kinds` (e.g. "bpf-prog", "bpf_link"); fds that vanish or lack the field are skipped."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return []
    values = []
    for fd in fds:
        try:
            target = os.readlink(f"{fd_dir}/{fd}")
            if not any(k in target for k in kinds):
                continue
            with open(f"/proc/{pid}/fdinfo/{fd}") as f:
                m = re.search(rf"^{field}:\s*(\d+)", f.read(), re.M)
            if m:
                values.append(int(m.group(1)))
        except OSError:
            pass
    return values


def owned_prog_ids(pid):
    """Ids of the BPF programs a process holds (prog and link fds; fdinfo has prog_id)."""
    return set(bpf_fdinfo_field(pid, ("bpf-prog", "bpf_link"), "prog_id"))


def prog_run_cnt_total(pid):
    """Sum of run_cnt over the bpf-prog fds of a process (fdinfo); > 0 once a probe has fired."""
    return sum(bpf_fdinfo_field(pid, ("bpf-prog",), "run_cnt"))


def perf_event_fds(pid):
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += "[perf_event]" in os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            pass
    return n


def bpf_prog_stats(pid, name_prefix=""):
    """run_time_ns and run_cnt of each program the process holds, from `bpftool prog show -j`."""
    ids = owned_prog_ids(pid)
    out = subprocess.run(["bpftool", "prog", "show", "-j"], capture_output=True, text=True,
                         check=True).stdout
    stats = []
    for p in json.loads(out):
        if p["id"] in ids and p.get("name", "").startswith(name_prefix):
            stats.append({"id": p["id"], "name": p.get("name", "?"), "type": p.get("type", "?"),
                          "run_time_ns": p.get("run_time_ns", 0), "run_cnt": p.get("run_cnt", 0)})
    return stats


# ---------------------------------------------------------------------------------------------
# Profilers: start, wait until they sample, snapshot, stop


class Profiler:
    """One profiler process for one run. Subclasses give argv and a readiness test."""

    name = "?"
    bpf_name_prefix = ""

    def __init__(self, tag):
        self.tag = tag  # unique per run: names log and output files
        self.proc = None
        self.t_ready = None
        self.cpu_at_ready = 0.0
        self.snapshot = {}

    def argv(self):
        raise NotImplementedError

    def ready(self):
        raise NotImplementedError

    def start(self, timeout=60):
        self.stdout_path = os.path.join(LOGS, f"{self.tag}.{self.name}.out")
        self.stderr_path = os.path.join(LOGS, f"{self.tag}.{self.name}.err")
        with open(self.stdout_path, "wb") as out, open(self.stderr_path, "wb") as err:
            self.proc = subprocess.Popen(self.argv(), stdout=out, stderr=err,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        deadline = time.monotonic() + timeout
        while not self.ready():
            if self.proc.poll() is not None:
                raise BenchError(f"{self.name} exited with {self.proc.returncode} before it "
                                 f"was ready; see {self.stderr_path}")
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{self.name} not ready after {timeout}s; see {self.stderr_path}")
            time.sleep(0.05)
        self.t_ready = time.monotonic()
        self.cpu_at_ready = proc_cpu_seconds(self.proc.pid)

    def mark(self):
        """Starts the steady-state CPU measurement that take_snapshot() ends."""
        self.t_mark = time.monotonic()
        self.cpu_at_mark = proc_cpu_seconds(self.proc.pid)

    def take_snapshot(self):
        """While the profiler still runs: its programs' counters and its memory."""
        pid = self.proc.pid
        self.snapshot = {
            "progs": bpf_prog_stats(pid, self.bpf_name_prefix),
            "rss_kib": proc_status_kib(pid, "VmRSS"),
            "hwm_kib": proc_status_kib(pid, "VmHWM"),
        }
        if getattr(self, "t_mark", None) is not None:
            seconds = time.monotonic() - self.t_mark
            self.snapshot["steady_seconds"] = seconds
            self.snapshot["steady_cpu_fraction"] = \
                (proc_cpu_seconds(pid) - self.cpu_at_mark) / seconds

    def stop(self, timeout=180):
        """SIGINT, then reap with wait4 for the total CPU time and peak RSS."""
        t_stop = time.monotonic()
        os.kill(self.proc.pid, signal.SIGINT)
        deadline = t_stop + timeout
        while True:
            pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                self.kill()
                raise BenchError(f"{self.name} did not exit {timeout}s after SIGINT")
            time.sleep(0.02)
        t_exit = time.monotonic()
        self.proc.returncode = os.waitstatus_to_exitcode(status)
        cpu_total = rusage.ru_utime + rusage.ru_stime
        result = dict(self.snapshot)
        result.update({
            "exit_code": self.proc.returncode,
            "cpu_s_total": cpu_total,
            # steady cost: CPU after it was ready (start-up excluded, exit-time work included)
            # over the wall time from ready to exit
            "cpu_s_after_ready": cpu_total - self.cpu_at_ready,
            "seconds_after_ready": t_exit - self.t_ready,
            "stop_seconds": t_exit - t_stop,
            # peak resident set: VmHWM read before the stop, or ru_maxrss at exit if higher
            "maxrss_kib": max(rusage.ru_maxrss, self.snapshot.get("hwm_kib", 0)),
        })
        result["cpu_fraction"] = result["cpu_s_after_ready"] / result["seconds_after_ready"]
        if self.proc.returncode not in (0, -signal.SIGINT, 130):
            raise BenchError(f"{self.name} exited with {self.proc.returncode}; "
                             f"see {self.stderr_path}")
        result.update(self.parse_logs())
        return result

    def parse_logs(self):
        return {}

    def kill(self):
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


class Parascope(Profiler):
    name = "parascope"
    bpf_name_prefix = "ps_"

    def argv(self):
        self.output_dir = os.path.join(TMP, f"{self.tag}.profiles")
        return [PARASCOPE, f"--output-dir={self.output_dir}"]

    def ready(self):
        with open(self.stderr_path, errors="replace") as f:
            return "attached:" in f.read()

    def parse_logs(self):
        with open(self.stderr_path, errors="replace") as f:
            text = f.read()
        shutil.rmtree(self.output_dir, ignore_errors=True)
        info = {}
        m = re.search(r"attached: .*? with (\S+) at", text)
        if m:
            info["event"] = m.group(1)
        m = re.search(r"stopped: (.*)", text)
        if m:
            counters = dict(re.findall(r"([a-z_]+)=(\d+)", m.group(1)))
            info["counters"] = {k: int(v) for k, v in counters.items()}
            info["windows"] = int(counters.get("windows", 0))
        return info


class Perf(Profiler):
    name = "perf"

    def argv(self):
        self.data = os.path.join(TMP, f"{self.tag}.perf.data")
        return ["perf", "record", "-F", "19", "-a", "-g", "-o", self.data]

    def ready(self):
        # one sampling event per CPU opened; give it a moment to enable them
        if perf_event_fds(self.proc.pid) < NCPU:
            return False
        time.sleep(0.2)
        return True

    def parse_logs(self):
        size = os.path.getsize(self.data) if os.path.exists(self.data) else 0
        if os.path.exists(self.data):
            os.unlink(self.data)
        return {"output_bytes": size}


class BpfPeer(Profiler):
    """A peer built on BPF: ready once one of its programs has run (needs bpf_stats)."""

    def ready(self):
        return prog_run_cnt_total(self.proc.pid) > 0

    def parse_logs(self):
        size = os.path.getsize(self.stdout_path)
        os.unlink(self.stdout_path)  # the stacks it printed: large, not needed
        return {"output_bytes": size}


class OffCpuTime(BpfPeer):
    name = "offcputime"

    def argv(self):
        return [shutil.which("offcputime") or "/usr/sbin/offcputime"]


class Bpftrace(BpfPeer):
    name = "bpftrace"

    def argv(self):
        return ["bpftrace", "-e", "profile:hz:19 { @[kstack, ustack] = count(); }"]


PROFILERS = {"parascope": Parascope, "perf": Perf, "offcputime": OffCpuTime,
             "bpftrace": Bpftrace}

# ---------------------------------------------------------------------------------------------
# Scenarios


def workload(name):
    return os.path.join(OUT, name)


def build_workloads():
    for src in sorted(os.listdir(WORKLOADS)):
        if src.endswith(".c"):
            subprocess.run(["gcc", "-O2", "-Wall", "-o", workload(src[:-2]),
                            os.path.join(WORKLOADS, src), "-lpthread"], check=True)


def run_parsed(argv, key, timeout):
    out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise BenchError(f"{argv[0]} exited with {out.returncode}: {out.stderr.strip()}")
    fields = dict(re.findall(r"(\w+)=([\d.]+)", out.stdout))
    return float(fields[key]), {k: float(v) for k, v in fields.items()}


def churn_script(n):
    # /bin/true by path: dash's `true` builtin would start no process
    return f"i=0; while [ $i -lt {n} ]; do /bin/true; i=$((i+1)); done"


class Scenario:
    key = name = metric = unit = "?"
    higher_is_better = True

    def run(self):
        """Returns (metric value, extra figures)."""
        raise NotImplementedError


class CpuBound(Scenario):
    key, name = "cpu", "1. CPU-bound"
    metric, unit = "work units/s", "units/s"

    def describe(self):
        return f"{NCPU} busy threads (one per CPU), {SETTINGS['seconds']:g} s"

    def run(self):
        s = SETTINGS["seconds"]
        return run_parsed([workload("cpu_bound"), str(s)], "work_per_s", s + 60)


class ContextSwitch(Scenario):
    key, name = "switch", "2. Context-switch heavy"
    metric, unit = "round trips/s", "trips/s"

    def describe(self):
        pin = SETTINGS["pingpong_cpu"]
        where = "unpinned" if pin < 0 else f"both on CPU {pin}"
        return f"2 threads ping-ponging a byte over pipes ({where}), {SETTINGS['seconds']:g} s"

    def run(self):
        s = SETTINGS["seconds"]
        return run_parsed([workload("pingpong"), str(s), str(SETTINGS["pingpong_cpu"])],
                          "round_trips_per_s", s + 60)


class Churn(Scenario):
    key, name = "churn", "3. Process churn"
    metric, unit = "wall time", "s"
    higher_is_better = False

    def describe(self):
        return f"sh loop starting {SETTINGS['churn_procs']} x /bin/true"

    def run(self):
        t0 = time.monotonic()
        subprocess.run(["/bin/sh", "-c", churn_script(SETTINGS["churn_procs"])], check=True,
                       timeout=600)
        secs = time.monotonic() - t0
        return secs, {"procs_per_s": SETTINGS["churn_procs"] / secs}


class ManyThreads(Scenario):
    key, name = "threads", "4. Many threads"
    metric, unit = "wakeups/s", "wakeups/s"

    def describe(self):
        return (f"{SETTINGS['threads']} threads sleeping 1-10 ms and waking, "
                f"{SETTINGS['seconds']:g} s")

    def run(self):
        s = SETTINGS["seconds"]
        return run_parsed([workload("many_threads"), str(s), str(SETTINGS["threads"])],
                          "wakeups_per_s", s + 60)


SCENARIOS = {s.key: s for s in (CpuBound(), ContextSwitch(), Churn(), ManyThreads())}

# ---------------------------------------------------------------------------------------------
# Runs


def one_run(scenario, tool, tag):
    """One scenario run under one tool (None: no profiler). Returns a run record."""
    record = {"scenario": scenario.key, "tool": tool or "none", "tag": tag,
              "loadavg": loadavg()}
    prof = PROFILERS[tool](tag) if tool else None
    try:
        record["quiet_wait_s"] = wait_quiet()
        if prof:
            prof.start()
        time.sleep(0.5)  # settle: start-up work of the profiler is not the workload's cost
        meter = CpuMeter(prof.proc.pid if prof else None)
        value, extra = scenario.run()
        record.update(value=value, extra=extra, cpu=meter.read())
        if prof:
            prof.take_snapshot()
            record["profiler"] = prof.stop()
    except (BenchError, subprocess.SubprocessError, OSError, KeyError, ValueError) as e:
        if prof:
            prof.kill()
        record["error"] = str(e) or type(e).__name__
        log(f"  ERROR {scenario.key}/{record['tool']}: {record['error']}")
    return record


def run_scenarios(tools):
    runs = []
    for key in SETTINGS["scenarios"]:
        scenario = SCENARIOS[key]
        log(f"{scenario.name}: {scenario.describe()}; {SETTINGS['runs']} runs x "
            f"{len(tools)} configurations, interleaved")
        for r in range(SETTINGS["runs"]):
            # A B C A B C ..., each round starting one further along so no tool always
            # follows the same one
            order = tools[r % len(tools):] + tools[:r % len(tools)]
            for tool in order:
                rec = one_run(scenario, tool, f"{key}-{r}-{tool or 'none'}")
                rec["round"] = r
                runs.append(rec)
                if "error" not in rec:
                    log(f"  run {r + 1} {rec['tool']:<10} {scenario.metric} = "
                        f"{rec['value']:.4g}")
    return runs


def summarize(runs, tools):
    """Median and min-max per (scenario, tool); slowdown vs no profiler from the medians."""
    summary = {}
    for key in SETTINGS["scenarios"]:
        scenario = SCENARIOS[key]
        rows = {}
        for tool in tools:
            name = tool or "none"
            vals = [r["value"] for r in runs
                    if r["scenario"] == key and r["tool"] == name and "error" not in r]
            if not vals:
                rows[name] = {"n": 0}
                continue
            rows[name] = {"n": len(vals), "median": statistics.median(vals), "min": min(vals),
                          "max": max(vals), "values": vals}
        # slowdown: each round's run against the same round's no-profiler run (the runs closest
        # in time), median over rounds; robust to a load change on the machine between rounds
        def slowdown(value, base):
            return (1 - value / base) if scenario.higher_is_better else (value / base - 1)

        ok = [r for r in runs if r["scenario"] == key and "error" not in r]
        base = {r["round"]: r["value"] for r in ok if r["tool"] == "none"}
        for name, row in rows.items():
            mine = [r for r in ok if r["tool"] == name]
            paired = [slowdown(r["value"], base[r["round"]]) for r in mine if r["round"] in base]
            if name != "none" and paired:
                row["slowdown"] = statistics.median(paired)
                row["slowdown_per_round"] = paired
            if mine:
                row["other_cores_max"] = max(r["cpu"]["other_cores"] for r in mine)
                row["steal_cores_max"] = max(r["cpu"]["steal_cores"] for r in mine)
        # per-event cost and agent CPU per window, pooled over the runs of this scenario
        for name in rows:
            progs = {}
            agent = []
            for r in runs:
                if r["scenario"] != key or r["tool"] != name or "profiler" not in r:
                    continue
                p = r["profiler"]
                for s in p.get("progs", []):
                    acc = progs.setdefault(s["name"], {"type": s["type"], "run_time_ns": 0,
                                                       "run_cnt": 0})
                    acc["run_time_ns"] += s["run_time_ns"]
                    acc["run_cnt"] += s["run_cnt"]
                agent.append(p)
            for acc in progs.values():
                acc["mean_ns"] = acc["run_time_ns"] / acc["run_cnt"] if acc["run_cnt"] else None
            rows[name]["progs"] = progs
            if agent:
                rows[name]["cpu_fraction_median"] = statistics.median(
                    a["cpu_fraction"] for a in agent)
                rows[name]["peak_rss_mib_max"] = max(a["maxrss_kib"] for a in agent) / 1024
                if name == "parascope":
                    per_window = [a["cpu_s_total"] / a["windows"] for a in agent
                                  if a.get("windows")]
                    if per_window:
                        rows[name]["cpu_s_per_window_median"] = statistics.median(per_window)
        summary[key] = rows
    return summary


# ---------------------------------------------------------------------------------------------
# Footprint


def start_procs(count, period_ms):
    proc = subprocess.Popen([workload("idle_procs"), str(count), str(period_ms)],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    line = proc.stdout.readline()
    if not line.startswith("ready"):
        raise BenchError(f"idle_procs {count}: {line!r}")
    return proc


def stop_procs(proc):
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


BPF_STATS_PATH = "/proc/sys/kernel/bpf_stats_enabled"


def set_bpf_stats(on):
    with open(BPF_STATS_PATH, "w") as f:
        f.write("1" if on else "0")


def footprint_with_procs(label, count, period_ms, tools):
    """Each tool for footprint_seconds with `count` live processes waking every period_ms."""
    secs = SETTINGS["footprint_seconds"]
    log(f"footprint: {count} processes waking every {period_ms} ms; "
        f"{', '.join(tools)} for {secs:g} s each")
    results = {}
    procs = start_procs(count, period_ms)
    try:
        for tool in tools:
            prof = PROFILERS[tool](f"{label}-{tool}")
            try:
                set_bpf_stats(True)  # a BPF peer's readiness test counts its program runs
                prof.start()
                # Footprints are measured as deployed: kernel.bpf_stats_enabled adds clock reads
                # to every BPF program run and, measured here, doubled the agent's own CPU per
                # window (its file writes took 3-4x longer), so it is off from here on.
                set_bpf_stats(False)
                if tool == "parascope":
                    # Steady state for an always-on agent: from just after its first window
                    # (which pays one-time costs: ELF symbol tables, output directories) over
                    # the next two windows (default 15 s each).
                    time.sleep(PARASCOPE_WINDOW_S + 1.5)
                    prof.mark()
                    time.sleep(2 * PARASCOPE_WINDOW_S)
                else:
                    time.sleep(secs)
                prof.take_snapshot()
                results[tool] = prof.stop()
                r = results[tool]
                steady = r.get("steady_cpu_fraction")
                log(f"  {tool:<10} CPU {100 * r['cpu_fraction']:.2f}% of a core"
                    + ("" if steady is None else f" (steady windows {100 * steady:.2f}%)")
                    + f", RSS {r['rss_kib'] / 1024:.1f} MiB (peak {r['maxrss_kib'] / 1024:.1f})")
            except (BenchError, OSError) as e:
                prof.kill()
                results[tool] = {"error": str(e)}
                log(f"  ERROR {tool}: {e}")
    finally:
        stop_procs(procs)
    return {"procs": count, "period_ms": period_ms, "seconds": secs, "tools": results}


def footprint_churn():
    """parascope's RSS over memory_minutes of continuous process churn, sampled every 5 s."""
    minutes = SETTINGS["memory_minutes"]
    log(f"footprint: parascope during {minutes:g} min of process churn")
    prof = Parascope("memory-churn")
    set_bpf_stats(False)
    loop = ("trap 'echo started=$i; exit 0' TERM; i=0; "
            "while :; do /bin/true; i=$((i+1)); done")
    result = {"minutes": minutes}
    try:
        prof.start()
        churn = subprocess.Popen(["/bin/sh", "-c", loop], stdout=subprocess.PIPE, text=True,
                                 start_new_session=True)
        t0 = time.monotonic()
        samples = []
        while (t := time.monotonic() - t0) < minutes * 60:
            samples.append([round(t, 1), proc_status_kib(prof.proc.pid, "VmRSS")])
            time.sleep(min(5, max(0.1, minutes * 60 - t)))
        churn.send_signal(signal.SIGTERM)
        out, _ = churn.communicate(timeout=30)
        m = re.search(r"started=(\d+)", out)
        prof.take_snapshot()
        result.update(prof.stop())
        result.update(rss_samples_kib=samples, processes_started=int(m.group(1)) if m else None)
        log(f"  RSS {result['rss_kib'] / 1024:.1f} MiB after {minutes:g} min "
            f"({result['processes_started']} processes), peak {result['maxrss_kib'] / 1024:.1f}")
    except (BenchError, OSError, subprocess.SubprocessError) as e:
        prof.kill()
        result["error"] = str(e)
        log(f"  ERROR: {e}")
    return result


# ---------------------------------------------------------------------------------------------
# Report


def fmt_value(v, unit):
    if v is None:
        return "n/a"
    if unit == "s":
        return f"{v:.3f}"
    return f"{v:,.0f}"


def pct(v, signed=True):
    if v is None:
        return "n/a"
    return f"{100 * v:+.1f}%" if signed else f"{100 * v:.2f}%"


def ns(v):
    return "n/a" if v is None else f"{v:,.0f} ns"


def mib(kib):
    return "n/a" if kib is None else f"{kib / 1024:.1f}"


def find_prog(progs, want):
    """The program of a kind: 'sched_switch' by name, 'perf_event' by type."""
    for name, p in progs.items():
        if (want == "perf_event" and p["type"] == "perf_event") or \
           (want == "sched_switch" and "sched_switch" in name):
            return p
    return None


def pooled_prog(summary, tool, want):
    """Mean cost of one kind of program, pooled over every scenario run of a tool."""
    t = c = 0
    for rows in summary.values():
        p = find_prog(rows.get(tool, {}).get("progs", {}), want)
        if p:
            t, c = t + p["run_time_ns"], c + p["run_cnt"]
    return t / c if c else None


def budgets(summary, footprint):
    lines = []

    def verdict(ok):
        return "n/a" if ok is None else ("PASS" if ok else "MISS")

    def slow(key, tool):
        return summary.get(key, {}).get(tool, {}).get("slowdown")

    s1 = slow("cpu", "parascope")
    lines.append({
        "budget": "Scenario 1 slowdown", "figure": pct(s1), "limit": "<= +1.0%",
        "peer": f"perf {pct(slow('cpu', 'perf'))}, bpftrace {pct(slow('cpu', 'bpftrace'))}",
        "verdict": verdict(None if s1 is None else s1 <= BUDGET_SCENARIO1_SLOWDOWN)})
    s2, s2_peer = slow("switch", "parascope"), slow("switch", "offcputime")
    lines.append({
        "budget": "Scenario 2 slowdown", "figure": pct(s2),
        "limit": "<= offcputime's (aim: half)" + ("" if s2_peer is None
                                                  else f", aim {pct(s2_peer / 2)}"),
        "peer": f"offcputime {pct(s2_peer)}",
        "verdict": verdict(None if s2 is None or s2_peer is None else s2 <= s2_peer)})
    sw, sw_peer = pooled_prog(summary, "parascope", "sched_switch"), \
        pooled_prog(summary, "offcputime", "sched_switch")
    lines.append({
        "budget": "sched_switch program, mean per event (all scenario runs)", "figure": ns(sw),
        "limit": f"<= {BUDGET_SCHED_SWITCH_NS} ns", "peer": f"offcputime {ns(sw_peer)}",
        "verdict": verdict(None if sw is None else sw <= BUDGET_SCHED_SWITCH_NS)})
    pe, pe_peer = pooled_prog(summary, "parascope", "perf_event"), \
        pooled_prog(summary, "bpftrace", "perf_event")
    lines.append({
        "budget": "perf_event program, mean per sample (all scenario runs)", "figure": ns(pe),
        "limit": f"<= {BUDGET_PERF_EVENT_NS:,} ns", "peer": f"bpftrace {ns(pe_peer)}",
        "verdict": verdict(None if pe is None else pe <= BUDGET_PERF_EVENT_NS)})
    cpu = footprint.get("cpu_procs", {}).get("tools", {})
    a = cpu.get("parascope", {}).get("steady_cpu_fraction",
                                      cpu.get("parascope", {}).get("cpu_fraction"))
    peers = ", ".join(f"{t} {pct(r.get('cpu_fraction'), False)}" for t, r in cpu.items()
                      if t != "parascope")
    lines.append({
        "budget": f"Agent CPU, {SETTINGS['cpu_procs']} processes (steady windows)",
        "figure": pct(a, False),
        "limit": "<= 1.00% of a core", "peer": peers or "n/a",
        "verdict": verdict(None if a is None else a <= BUDGET_AGENT_CPU)})
    # steady RSS: the agent's resident set at the end of each footprint run; the worst counts
    rss = {}
    if "rss_kib" in cpu.get("parascope", {}):
        rss[f"{SETTINGS['cpu_procs']} procs"] = cpu["parascope"]["rss_kib"]
    live = footprint.get("live_procs", {}).get("tools", {}).get("parascope", {})
    if "rss_kib" in live:
        rss[f"{SETTINGS['live_procs']} live procs"] = live["rss_kib"]
    churn = footprint.get("churn", {})
    if "rss_kib" in churn:
        rss[f"{SETTINGS['memory_minutes']:g} min churn"] = churn["rss_kib"]
    worst = max(rss.items(), key=lambda kv: kv[1]) if rss else None
    peaks = [r["maxrss_kib"] for r in (cpu.get("parascope", {}), live, churn)
             if "maxrss_kib" in r]
    peers = ", ".join(f"{t} {mib(r.get('rss_kib'))} MiB" for t, r in cpu.items()
                      if t != "parascope")
    lines.append({
        "budget": "Agent RSS, steady (worst footprint run)",
        "figure": "n/a" if not worst else (f"{mib(worst[1])} MiB ({worst[0]}; "
                                           f"peak {mib(max(peaks))} MiB)"),
        "limit": f"<= {BUDGET_RSS_MIB} MiB", "peer": peers or "n/a",
        "verdict": verdict(None if not worst else worst[1] / 1024 <= BUDGET_RSS_MIB)})
    return lines


def table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(report):
    m = report["machine"]
    s = SETTINGS
    parts = [
        f"### parascope benchmarks, {report['date']}",
        "",
        f"Machine: {m['cpu_model']}, {m['cpus']} CPUs, {m['mem_gib']:.0f} GiB, Linux "
        f"{m['kernel']}, sampling event `{m['event']}`; load average "
        f"{m['loadavg_start']} at start, {m['loadavg_end']} at end. Settings: "
        f"{s['runs']} runs per configuration, interleaved; scenarios 1, 2, 4 run "
        f"{s['seconds']:g} s; scenario 3 starts {s['churn_procs']} processes; "
        f"the harness took {report['elapsed_s'] / 60:.1f} min, of which "
        f"{report['quiet_waited_s']:.0f} s waiting for other work on the machine to pause "
        f"(at most {s['quiet_wait_s']:g} s before a run).",
        "",
        "**Scenarios** (median of the runs and min-max; slowdown: + is slower, each run "
        "against the no-profiler run of the same round, median over rounds; tool CPU: the "
        "profiler's own CPU after start-up, % of one core; other: the most CPU, in cores, "
        "the machine spent during a run of that row beyond what the workload and the profiler "
        "were charged, i.e. other users of the machine plus kernel work charged to no task; "
        "compare with the none row):",
        "",
    ]
    rows = []
    for key in s["scenarios"]:
        sc = SCENARIOS[key]
        for tool, r in report["summary"][key].items():
            if not r.get("n"):
                rows.append([sc.name, sc.metric, tool, "failed", "", "", "", ""])
                continue
            slow = "" if tool == "none" else pct(r.get("slowdown"))
            cpu = "" if "cpu_fraction_median" not in r else pct(r["cpu_fraction_median"], False)
            rows.append([sc.name, f"{sc.metric} ({sc.unit})", tool, fmt_value(r["median"], sc.unit),
                         f"{fmt_value(r['min'], sc.unit)} - {fmt_value(r['max'], sc.unit)}",
                         slow, cpu, f"{r['other_cores_max']:.2f}"])
    parts += [table(["scenario", "metric", "profiler", "median", "min - max", "slowdown",
                     "tool CPU", "other"], rows), ""]
    base = [r["extra"]["switches_per_s"] for r in report["runs"]
            if r["scenario"] == "switch" and r["tool"] == "none" and "error" not in r]
    if base:
        parts += [f"Scenario 2 without a profiler: {statistics.median(base):,.0f} context "
                  "switches/s of the workload itself (getrusage), median.", ""]

    parts += ["**Per-event cost of BPF programs** (`kernel.bpf_stats_enabled=1`: bpftool "
              "run_time_ns / run_cnt, pooled over the runs of each scenario; events include "
              "the rest of the machine):", ""]
    rows = []
    for key in s["scenarios"]:
        for tool, r in report["summary"][key].items():
            for name, p in sorted(r.get("progs", {}).items()):
                rows.append([SCENARIOS[key].name, tool, f"`{name}`", p["type"],
                             f"{p['run_cnt']:,}", ns(p["mean_ns"])])
    parts += [table(["scenario", "tool", "program", "type", "events", "mean"], rows), ""]

    parts += ["**Agent footprint** (parascope at defaults: 19 Hz, 15 s windows, all four "
              "profiles, files; CPU = utime+stime after start-up / wall time, including the "
              "first window's one-time costs and the final flush; steady = utime+stime over the "
              "two windows after the first; per window = all CPU / windows; RSS = VmRSS at the "
              "end, peak = VmHWM):", ""]
    rows = []
    for key in s["scenarios"]:
        r = report["summary"][key].get("parascope", {})
        if r.get("n"):
            rows.append([SCENARIOS[key].name + " (median run)",
                         pct(r.get("cpu_fraction_median"), False),
                         "n/a" if "cpu_s_per_window_median" not in r
                         else f"{r['cpu_s_per_window_median']:.3f} s", "",
                         f"{r['peak_rss_mib_max']:.1f}"])
    fp = report["footprint"]

    def fp_row(label, r):
        if not r or "error" in r:
            return [label, "failed", "", "", ""]
        win = r.get("windows")
        steady = r.get("steady_cpu_fraction")
        return [label, pct(r["cpu_fraction"], False)
                + ("" if steady is None else f" (steady {pct(steady, False)})"),
                f"{r['cpu_s_total'] / win:.3f} s" if win else "n/a",
                mib(r["rss_kib"]), mib(r["maxrss_kib"])]

    for key in ("cpu_procs", "live_procs"):
        f = fp.get(key)
        if f:
            for tool, r in f["tools"].items():
                rows.append(fp_row(f"{f['procs']} processes waking every {f['period_ms']} ms, "
                                   f"{f['seconds']:g} s: {tool}", r))
    if fp.get("churn"):
        c = fp["churn"]
        rows.append(fp_row(f"{c['minutes']:g} min of process churn "
                           f"({c.get('processes_started')} processes): parascope", c))
    parts += [table(["measurement", "CPU (% of a core)", "CPU per window", "RSS MiB",
                     "peak RSS MiB"], rows), ""]

    if report.get("unwind_tables"):
        parts += ["**Unwind tables** (`build/bin/unwind_table_bench`: building a file's table "
                  "from its `.eh_frame`, median of 5; 16 bytes a row in BPF array memory):", ""]
        parts += [table(["file", "build ms", "rows", "bytes", "FDEs"],
                        [[u["file"], u["ms"], f"{int(u['rows']):,}", f"{int(u['bytes']):,}",
                          u["fdes"]] for u in report["unwind_tables"]]), ""]

    parts += ["**Budgets**:", ""]
    parts += [table(["budget", "figure", "budget", "peer", "verdict"],
                    [[b["budget"], b["figure"], b["limit"], b["peer"], b["verdict"]]
                     for b in report["budgets"]]), ""]
    if report["errors"]:
        parts += ["**Measurements that failed**:", ""]
        parts += [f"- {e}" for e in report["errors"]] + [""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------------------------


def machine_info():
    model = "?"
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem_kib = 0
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                mem_kib = int(line.split()[1])
    return {"cpu_model": model, "cpus": NCPU, "mem_gib": mem_kib / 1024 / 1024,
            "kernel": platform.release(), "hostname": platform.node(), "loadavg_start": loadavg()}


def loadavg():
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


def preflight(tools):
    if os.geteuid() != 0:
        sys.exit("bench: must run as root (BPF, perf and bpf_stats need it): sudo make bench")
    need = {"parascope": PARASCOPE, "perf": "perf", "offcputime": "offcputime",
            "bpftrace": "bpftrace"}
    for tool in tools:
        if tool not in need:
            sys.exit(f"bench: unknown tool {tool!r} in BENCH_TOOLS")
        if not shutil.which(need[tool]) and not os.access(need[tool], os.X_OK):
            sys.exit(f"bench: {need[tool]} not found; run scripts/bench-setup (and make build)")
    for key in SETTINGS["scenarios"]:
        if key not in SCENARIOS:
            sys.exit(f"bench: unknown scenario {key!r} in BENCH_SCENARIOS "
                     f"(known: {', '.join(SCENARIOS)})")
    if not shutil.which("bpftool"):
        sys.exit("bench: bpftool not found; run scripts/bench-setup")


def main():
    tools = [t for t in SETTINGS["tools"] if t]
    preflight(tools)
    t_start = time.monotonic()
    for d in (OUT, TMP, LOGS):
        os.makedirs(d, exist_ok=True)
    build_workloads()
    stats_path = BPF_STATS_PATH
    with open(stats_path) as f:
        stats_before = f.read().strip()
    report = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
              "machine": machine_info(), "settings": SETTINGS, "errors": []}
    try:
        with open(stats_path, "w") as f:
            f.write("1")
        runs = run_scenarios([None] + tools)
        summary = summarize(runs, [None] + tools)
        footprint = {}
        if SETTINGS["footprint_seconds"] > 0:
            footprint["cpu_procs"] = footprint_with_procs("cpu-procs", SETTINGS["cpu_procs"],
                                                          100, tools)
            if "parascope" in tools:
                footprint["live_procs"] = footprint_with_procs(
                    "live-procs", SETTINGS["live_procs"], 1000, ["parascope"])
        if SETTINGS["memory_minutes"] > 0 and "parascope" in tools:
            footprint["churn"] = footprint_churn()
    finally:
        with open(stats_path, "w") as f:
            f.write(stats_before)
    shutil.rmtree(TMP, ignore_errors=True)

    event = next((r["profiler"].get("event") for r in runs
                  if r["tool"] == "parascope" and "profiler" in r), "?")
    report["machine"].update(event=event, loadavg_end=loadavg())
    report["errors"] = [f"{r['scenario']} / {r['tool']} run {r['round'] + 1}: {r['error']}"
                        for r in runs if "error" in r]
    for key, f in footprint.items():
        for tool, r in (f.get("tools") or {"parascope": f}).items():
            if "error" in r:
                report["errors"].append(f"footprint {key} / {tool}: {r['error']}")
    report["unwind_tables"] = unwind_tables()
    report.update(runs=runs, summary=summary, footprint=footprint,
                  budgets=budgets(summary, footprint),
                  elapsed_s=time.monotonic() - t_start, quiet_waited_s=QUIET_SPENT[0])
    md = markdown(report)
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump(report, f, indent=1)
    with open(os.path.join(OUT, "results.md"), "w") as f:
        f.write(md)
    print(md)
    print(f"written: {os.path.join(OUT, 'results.md')}, {os.path.join(OUT, 'results.json')}; "
          f"logs in {LOGS}")
    return 1 if report["errors"] else 0


def unwind_tables():
    """Table-build cost for libc, libstdc++ and python3 (bench/unwind_table_bench.cc)."""
    tool = os.path.join(os.path.dirname(PARASCOPE), "unwind_table_bench")
    files = ["/lib/x86_64-linux-gnu/libc.so.6", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6",
             os.path.realpath("/usr/bin/python3")]
    files = [f for f in files if os.path.exists(f)]
    if not os.access(tool, os.X_OK) or not files:
        return []
    out = subprocess.run([tool] + files, capture_output=True, text=True, timeout=120).stdout
    lines = [l.split("\t") for l in out.splitlines()]
    if not lines:
        return []
    head = lines[0]
    return [dict(zip(head, l)) for l in lines[1:] if len(l) == len(head)]


def paste_readme():
    """Copies the last run's Markdown into bench/README.md between the result markers."""
    readme = os.path.join(ROOT, "bench", "README.md")
    with open(os.path.join(OUT, "results.md")) as f:
        results = f.read().strip()
    with open(readme) as f:
        text = f.read()
    begin, end = "<!-- bench-results:begin -->", "<!-- bench-results:end -->"
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    with open(readme, "w") as f:
        f.write(f"{head}{begin}\n{results}\n{end}{tail}")
    print(f"pasted {os.path.join(OUT, 'results.md')} into {readme}")
    return 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--paste-readme"]:
        sys.exit(paste_readme())
    if sys.argv[1:]:
        sys.exit("usage: bench.py [--paste-readme]   (settings: BENCH_* environment variables)")
    sys.exit(main())
