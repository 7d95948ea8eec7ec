#!/usr/bin/env python3
"""Paired A/B of two agent builds' sched_switch program cost on one event stream.

Usage: sudo python3 bench/switch_ab.py BIN_A BIN_B [threads|pingpong] [ROUNDS=2] [-- AGENT_ARGS...]

On this project's VMs one agent's `sched_switch` mean (kernel.bpf_stats_enabled: run_time_ns /
run_cnt of its ps_sched_switch* program) swings 20-40% between runs of the same binary, more
than most changes to the program are worth. Here both builds are attached at once, so both
programs run on every switch of the same workload (scenario 4's 500 threads, or scenario 2's
pinned pipe ping-pong, bench/workloads). The program attached first runs first and takes the
cache misses on what both read (the tasks' identity fields, measured: +30-80% for the first of
two identical builds), so each round runs both orders and a build's figure is the mean of its
two positions. Prints figures and asserts nothing (bench/README.md).
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORTS = (19420, 19421)


def usage():
    print(__doc__.strip().splitlines()[2], file=sys.stderr)
    sys.exit(2)


def workload_binary(name, tmp):
    """bench/workloads/NAME.c built with gcc -O2 (as make bench does) into tmp."""
    out = os.path.join(tmp, name)
    subprocess.run(["gcc", "-O2", "-pthread", "-o", out,
                    os.path.join(ROOT, "bench", "workloads", name + ".c")], check=True)
    return out


def metrics_up(port):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1).read()
        return True
    except OSError:
        return False


def switch_stats():
    """(run_time_ns, run_cnt) of each loaded ps_sched_switch* program, by program id."""
    progs = json.loads(subprocess.run(["bpftool", "prog", "show", "-j"], check=True,
                                      capture_output=True, text=True).stdout)
    return {p["id"]: (p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in progs
            if p.get("name", "").startswith("ps_sched_switch")}


def start_agent(binary, port, tmp, args):
    out = os.path.join(tmp, f"out{port}")
    log = open(os.path.join(tmp, f"agent{port}.log"), "w")
    before = set(switch_stats())
    p = subprocess.Popen([binary, f"--output-dir={out}", f"--http-address=127.0.0.1:{port}"]
                         + args, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while not metrics_up(port):
        if p.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{binary} did not start: see {log.name}")
        time.sleep(0.2)
    new = set(switch_stats()) - before
    if len(new) != 1:
        raise SystemExit(f"{binary}: expected one new ps_sched_switch program, found {len(new)}")
    return p, new.pop()


def one_order(first, second, run_workload, tmp, args):
    """Both agents attached, `first` then `second` ((label, binary) each); returns
    {label: (ns per event, events)}."""
    agents = []
    try:
        for (label, binary), port in ((first, PORTS[0]), (second, PORTS[1])):
            agents.append((label,) + start_agent(binary, port, tmp, args))
        time.sleep(1)
        s0 = switch_stats()
        run_workload()
        s1 = switch_stats()
    finally:
        for _, p, _ in agents:
            p.terminate()
        for _, p, _ in agents:
            p.wait(timeout=60)
    result = {}
    for label, _, prog in agents:
        dt = s1[prog][0] - s0[prog][0]
        dn = s1[prog][1] - s0[prog][1]
        result[label] = (dt / dn if dn else float("nan"), dn)
    return result


def main():
    argv = sys.argv[1:]
    args = []
    if "--" in argv:
        args = argv[argv.index("--") + 1:]
        argv = argv[:argv.index("--")]
    if len(argv) < 2 or len(argv) > 4:
        usage()
    a, b = (os.path.abspath(x) for x in argv[:2])
    kind = argv[2] if len(argv) > 2 else "threads"
    rounds = int(argv[3]) if len(argv) > 3 else 2
    if kind not in ("threads", "pingpong") or rounds < 1:
        usage()
    if os.geteuid() != 0:
        print("switch_ab: needs root (BPF, kernel.bpf_stats_enabled)", file=sys.stderr)
        sys.exit(1)
    tmp = tempfile.mkdtemp(prefix="switch_ab_")
    stats_path = "/proc/sys/kernel/bpf_stats_enabled"
    old_stats = open(stats_path).read().strip()
    open(stats_path, "w").write("1")
    try:
        if kind == "threads":
            w = workload_binary("many_threads", tmp)
            run = lambda: subprocess.run([w, "3", "500"], check=True, stdout=subprocess.DEVNULL)
        else:
            w = workload_binary("pingpong", tmp)
            cpu = str(os.cpu_count() - 1)
            run = lambda: subprocess.run([w, "3", cpu], check=True, stdout=subprocess.DEVNULL)
        sums = {"A": [], "B": []}
        print(f"{kind}, {rounds} round(s); A = {a}; B = {b}; agent args {args or 'none'}")
        for r in range(rounds):
            for first, second in ((("A", a), ("B", b)), (("B", b), ("A", a))):
                res = one_order(first, second, run, tmp, args)
                for label in sums:
                    sums[label].append(res[label][0])
                f, s2 = first[0], second[0]
                print(f"  round {r + 1}, {f} attached first: {f} {res[f][0]:.0f} ns, "
                      f"{s2} {res[s2][0]:.0f} ns ({res[f][1]} events)")
        ma = sum(sums["A"]) / len(sums["A"])
        mb = sum(sums["B"]) / len(sums["B"])
        print(f"mean of both positions: A {ma:.0f} ns, B {mb:.0f} ns per event; "
              f"B - A = {mb - ma:+.0f} ns ({(mb - ma) / ma * 100:+.1f}%)")
    finally:
        open(stats_path, "w").write(old_stats)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
