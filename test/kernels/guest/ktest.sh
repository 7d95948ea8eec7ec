#!/bin/sh
# Runs inside the guest (from /ktest.sh, PID 1), from the read-only payload disk /payload:
# records kernel facts, runs the agent on the burn workload, prints its log, then writes every
# result as a tar archive onto the raw results disk /dev/vdc for the host to read.
# Settings come from /payload/ktest.conf (DURATION, FREQ, AGENT_ARGS, RETRY_CPU_ONLY).
P=/payload
DURATION=6 FREQ=99 AGENT_ARGS="" RETRY_CPU_ONLY=1
. $P/ktest.conf
export HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin
R=/r
mkdir -p $R /tmp && mount -t tmpfs tmpfs $R && mount -t tmpfs tmpfs /tmp
mountpoint -q /sys/kernel/debug || mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
[ -d /sys/kernel/tracing ] && ! mountpoint -q /sys/kernel/tracing && mount -t tracefs tracefs /sys/kernel/tracing 2>/dev/null
mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf 2>/dev/null
mountpoint -q /sys/fs/cgroup || mount -t cgroup2 cgroup2 /sys/fs/cgroup 2>/dev/null
mountpoint -q /sys/kernel/security || mount -t securityfs securityfs /sys/kernel/security 2>/dev/null
ip link set lo up 2>/dev/null

fact() { echo "$1=$2" >>$R/facts; echo "KTEST $1=$2"; }
echo "KTEST-BEGIN"
fact kernel "$(uname -r)"
fact proc_version "$(cat /proc/version)"
fact cmdline "$(cat /proc/cmdline)"
fact cpus "$(nproc)"
fact perf_event_paranoid "$(cat /proc/sys/kernel/perf_event_paranoid)"
fact unprivileged_bpf_disabled "$(cat /proc/sys/kernel/unprivileged_bpf_disabled 2>/dev/null)"
fact memlock_limit "$(ulimit -l)"
fact btf_vmlinux_bytes "$(stat -c %s /sys/kernel/btf/vmlinux 2>/dev/null || echo missing)"
fact event_sources "$(ls /sys/bus/event_source/devices | tr '\n' ' ')"
fact cpu_cycles_sysfs "$(cat /sys/bus/event_source/devices/cpu/events/cpu-cycles 2>/dev/null || echo none)"
fact perf_open "$($P/pmuprobe | tr '\n' ';')"
fact pmu_dmesg "$(dmesg | grep -m1 'Performance Events' | sed 's/^\[[^]]*\] //')"
fact lsm "$(cat /sys/kernel/security/lsm 2>/dev/null)"

# run_agent NAME ARGS...: agent on a fresh burn process; results in $R/NAME/.
run_agent() {
  name=$1; shift
  d=$R/$name
  mkdir -p $d/out
  $P/burn $((DURATION + 8)) >/dev/null &
  b=$!
  sleep 0.5
  echo "KTEST ---- $name: parascope --pid=$b --duration=${DURATION}s --sampling-frequency=$FREQ $*"
  t0=$(date +%s.%N)
  timeout $((DURATION + 90)) $P/parascope --pid=$b --duration=${DURATION}s \
    --sampling-frequency=$FREQ --output-dir=$d/out "$@" >$d/stdout 2>$d/agent.log
  echo $? >$d/rc
  echo "$(date +%s.%N) $t0" | awk '{printf "%.1f\n", $1 - $2}' >$d/seconds
  kill $b 2>/dev/null; wait $b 2>/dev/null
  echo "KTEST ---- $name: agent exit status $(cat $d/rc) after $(cat $d/seconds) s; log without debug lines:"
  grep -v ' D ' $d/agent.log
  (cd $d/out && find . -type f | sort) >$d/files
  echo "KTEST ---- $name: $(wc -l <$d/files) files written:"
  cat $d/files
  f=$(find $d/out -name 'process_cpu-*.pb.gz' -o -name 'cpu-*.pb.gz' | sort | head -1)
  if [ -n "$f" ] && [ -x $P/pprof ]; then
    $P/pprof -top -nodecount=8 -symbolize=none "$f" >$d/cpu-top.txt 2>&1
    echo "KTEST ---- $name: pprof -top $(basename "$f")"
    cat $d/cpu-top.txt
  fi
}

run_agent full $AGENT_ARGS
if ! grep -q 'attached:' $R/full/agent.log && [ "$RETRY_CPU_ONLY" = 1 ]; then
  run_agent cpu_only --profiles=cpu $AGENT_ARGS
fi

# system: the agent system-wide with every profile type while offcpu_mix (off-CPU ground truth:
# its measured thread waits 3:1 in sleep_30ms and pipe_wait_10ms) and lifecycle spawn (exec,
# 20 ms children, exit) run, so every program (sampler, sched_switch, exec, exit, the seeding
# iterator, the unwinder's ring buffer) and every profile type is exercised.
if [ -x $P/offcpu_mix ] && [ -x $P/lifecycle ]; then
  d=$R/system
  mkdir -p $d/out
  echo "KTEST ---- system: parascope --duration=${DURATION}s --profiles=cpu,off_cpu,wall,latency"
  timeout $((DURATION + 90)) $P/parascope --duration=${DURATION}s --sampling-frequency=499 \
    --profiles=cpu,off_cpu,wall,latency --collect-interval=$((DURATION / 2))s --http-address= \
    --output-dir=$d/out $AGENT_ARGS >$d/stdout 2>$d/agent.log &
  a=$!
  i=0
  while [ $i -lt 900 ] && kill -0 $a 2>/dev/null && ! grep -q 'attached:' $d/agent.log; do
    sleep 0.1; i=$((i + 1))
  done
  (echo go; sleep $((DURATION + 5))) | $P/offcpu_mix 2 >$d/offcpu_mix.out 2>&1 &
  m=$!
  $P/lifecycle spawn 30 20 >$d/lifecycle.out 2>&1
  wait $a; echo $? >$d/rc
  kill $m 2>/dev/null; wait $m 2>/dev/null
  echo "KTEST ---- system: agent exit status $(cat $d/rc); log without debug lines:"
  grep -v ' D ' $d/agent.log | tail -20
  (cd $d/out && find . -type f | sort) >$d/files
  echo "KTEST ---- system: $(wc -l <$d/files) files written"
fi

# tree: command mode on fakebuild (each round a parent's serial_step, then two forked children's
# parallel_step at once): the fork and tree-exit hooks, parallelism over the tree, the
# command's exit status (3) passed through.
if [ -x $P/fakebuild ]; then
  d=$R/tree
  mkdir -p $d/out
  echo "KTEST ---- tree: parascope -- fakebuild build 4 3"
  timeout 120 $P/parascope --sampling-frequency=499 --collect-interval=2s --output-dir=$d/out \
    $AGENT_ARGS -- $P/fakebuild build 4 3 >$d/stdout 2>$d/agent.log
  echo $? >$d/rc
  echo "KTEST ---- tree: exit status $(cat $d/rc); log without debug lines:"
  grep -v ' D ' $d/agent.log | tail -8
  cat $d/stdout
  (cd $d/out && find . -type f | sort) >$d/files
fi

# cgroup: the agent system-wide with --latency-group=cgroup while fakebuild runs in a cgroup of
# its own: the cgroup-keyed counts and the cgroup release hook (the cgroup is removed after).
if [ -x $P/fakebuild ] && [ -f /sys/fs/cgroup/cgroup.procs ]; then
  d=$R/cgroup
  mkdir -p $d/out
  cg=/sys/fs/cgroup/ps-fakebuild
  mkdir -p $cg
  stat -c %i $cg >$d/cgroup_id
  echo "KTEST ---- cgroup: parascope --latency-group=cgroup (cgroup id $(cat $d/cgroup_id))"
  timeout $((DURATION + 90)) $P/parascope --latency-group=cgroup --duration=$((DURATION + 2))s \
    --sampling-frequency=499 --collect-interval=$((DURATION / 2 + 1))s --http-address= \
    --output-dir=$d/out $AGENT_ARGS >$d/stdout 2>$d/agent.log &
  a=$!
  i=0
  while [ $i -lt 900 ] && kill -0 $a 2>/dev/null && ! grep -q 'attached:' $d/agent.log; do
    sleep 0.1; i=$((i + 1))
  done
  sh -c "echo \$\$ >$cg/cgroup.procs && exec $P/fakebuild build 4" >$d/fakebuild.out 2>&1
  rmdir $cg
  wait $a; echo $? >$d/rc
  echo "KTEST ---- cgroup: agent exit status $(cat $d/rc); log without debug lines:"
  grep -v ' D ' $d/agent.log | tail -5
  (cd $d/out && find . -type f | sort) >$d/files
  echo "KTEST ---- cgroup: $(grep -c '^./cgroup/' $d/files) cgroup files written"
fi

# nobtf: a kernel without BTF (CONFIG_DEBUG_INFO_BTF=n): the agent must exit 1 naming it.
d=$R/nobtf
mkdir -p $d
if mount -t tmpfs tmpfs /sys/kernel/btf 2>/dev/null; then
  timeout 60 $P/parascope --duration=2s --http-address= --output-dir=$d >$d/stdout 2>$d/agent.log
  echo $? >$d/rc
  umount /sys/kernel/btf
  echo "KTEST ---- nobtf: agent exit status $(cat $d/rc): $(grep -v ' D ' $d/agent.log | tail -1)"
fi
dmesg >$R/dmesg.txt
echo "KTEST ---- kernel messages about bpf/perf or warnings during the run:"
grep -iE 'bpf|perf|WARNING|BUG|Oops|call trace' $R/dmesg.txt | grep -v 'Performance Events' | tail -20
tar -C $R -cf /dev/vdc . && sync
echo "KTEST-DONE"
