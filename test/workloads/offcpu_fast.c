// Ground truth for sampled off-CPU stacks (--off-cpu-stack-rate): a thread that blocks tens of
// thousands of times per second, alternately in wait_20us() and wait_60us(). Each wait writes a
// request to a helper thread and blocks reading the answer; the helper, pinned to the same CPU,
// spins 20 or 60 us before answering. So the measured thread switches out ~20k times/s, far over
// the default stack-capture rate, and its off-CPU time splits about 1:3 between the two functions.
// A third thread, pinned there too, sleeps 250 ms at a time in stall_250ms() for as long: long
// intervals on a CPU that switches tens of thousands of times a second (--off-cpu-stack-budget).
//
// usage: offcpu_fast SECONDS
//   prints "ready <pid>", waits for a line on stdin, runs the measured thread for SECONDS, then
//   prints
//     done tid=T helper_tid=H cpu_ns=C life_ns=L wait20_ns=A wait60_ns=B waits=N cpu=K
//          stall_tid=S stall_cpu_ns=SC stall_life_ns=SL stalls=SN
//   (T's CPU time C from CLOCK_THREAD_CPUTIME_ID and lifetime L from CLOCK_MONOTONIC, so its
//   off-CPU total is L - C; A and B are CLOCK_MONOTONIC sums around the blocking reads of each
//   function; K is the CPU the threads were pinned to; SC, SL and SN the same of the sleeping
//   thread S, its sleeps), then idles until stdin closes.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

#include "workload_util.h"

static int req_pipe[2], resp_pipe[2];
static double seconds;
static int cpu, tid, helper_tid;
static long long cpu_ns, life_ns, wait20_ns, wait60_ns, waits;
static int stall_tid;
static long long stall_cpu_ns, stall_life_ns, stalls;
static volatile int measured_done;

static void pin(void) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  sched_setaffinity(0, sizeof(set), &set);
}

// Sends `what` to the helper and blocks until it answers; returns the blocked wall time.
static inline long long ask(char what) {
  raw_syscall4(SYS_write, req_pipe[1], (long)&what, 1, 0);
  long long t0 = now_ns(CLOCK_MONOTONIC);
  if (raw_syscall4(SYS_read, resp_pipe[0], (long)&what, 1, 0) != 1) abort();
  return now_ns(CLOCK_MONOTONIC) - t0;
}

__attribute__((noinline, noclone)) void wait_20us(void) { wait20_ns += ask(20); }
__attribute__((noinline, noclone)) void wait_60us(void) { wait60_ns += ask(60); }

static void* helper(void* arg) {
  (void)arg;
  helper_tid = (int)syscall(SYS_gettid);
  pin();
  char c;
  while (raw_syscall4(SYS_read, req_pipe[0], (long)&c, 1, 0) == 1) {
    long long until = now_ns(CLOCK_MONOTONIC) + c * 1000LL;
    while (now_ns(CLOCK_MONOTONIC) < until) {
    }
    raw_syscall4(SYS_write, resp_pipe[1], (long)&c, 1, 0);
  }
  return NULL;
}

__attribute__((noinline, noclone)) void stall_250ms(void) {
  struct timespec d = {0, 250000000L};
  raw_syscall4(SYS_nanosleep, (long)&d, 0, 0, 0);
}

static void* staller(void* arg) {
  (void)arg;
  stall_tid = (int)syscall(SYS_gettid);
  pin();
  long long cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  long long mono0 = now_ns(CLOCK_MONOTONIC);
  while (!measured_done) {
    stall_250ms();
    stalls++;
  }
  stall_life_ns = now_ns(CLOCK_MONOTONIC) - mono0;
  stall_cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  return NULL;
}

static void* measured(void* arg) {
  (void)arg;
  tid = (int)syscall(SYS_gettid);
  pin();
  long long cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  long long mono0 = now_ns(CLOCK_MONOTONIC);
  long long end = mono0 + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) {
    wait_20us();
    wait_60us();
    waits += 2;
  }
  life_ns = now_ns(CLOCK_MONOTONIC) - mono0;
  cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  measured_done = 1;
  return NULL;
}

int main(int argc, char** argv) {
  seconds = argc > 1 ? atof(argv[1]) : 4.0;
  cpu = (int)sysconf(_SC_NPROCESSORS_ONLN) - 1;
  char line[64];
  if (pipe(req_pipe) != 0 || pipe(resp_pipe) != 0) return 1;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  pthread_t h, m, st;
  pthread_create(&h, NULL, helper, NULL);
  pthread_setname_np(h, "fast_helper");
  pthread_create(&st, NULL, staller, NULL);
  pthread_setname_np(st, "fast_staller");
  pthread_create(&m, NULL, measured, NULL);
  pthread_setname_np(m, "fast_measured");
  pthread_join(m, NULL);
  close(req_pipe[1]);  // the helper reads EOF and exits
  pthread_join(h, NULL);
  pthread_join(st, NULL);
  printf(
      "done tid=%d helper_tid=%d cpu_ns=%lld life_ns=%lld wait20_ns=%lld wait60_ns=%lld "
      "waits=%lld cpu=%d stall_tid=%d stall_cpu_ns=%lld stall_life_ns=%lld stalls=%lld\n",
      tid, helper_tid, cpu_ns, life_ns, wait20_ns, wait60_ns, waits, cpu, stall_tid, stall_cpu_ns,
      stall_life_ns, stalls);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
