// Ground truth for latency over a process tree (command mode, --latency-group=tree|cgroup): a
// build-like job of single-threaded processes. Each round, the parent runs serial_step() alone
// for 200 ms of wall time, then forks two children that run parallel_step() at once until a
// common deadline 200 ms later, and waits for both. Per process the parallelism is always 1, so
// per process latency equals CPU; over the tree CPU is 1:2 between serial_step and
// parallel_step (shares 1/3 and 2/3) and latency 1:1. Needs two idle CPUs.
//
// usage: fakebuild build SECONDS [STATUS [wait]]
//   runs whole rounds for about SECONDS, prints
//     done rounds=R serial_cpu_ns=S parallel_cpu_ns=P busy_wall_ns=B children_runq_wait_ns=W
//   (S: the parent's CPU time in serial_step, CLOCK_THREAD_CPUTIME_ID; P: the children's CPU
//   time, getrusage(RUSAGE_CHILDREN); B: wall time of the rounds, CLOCK_MONOTONIC, during which
//   some process of the tree was meant to be on a CPU; W: the children's run-queue wait from
//   /proc/<pid>/schedstat, read by each child before it exits and summed) and exits with STATUS
//   (default 0). With "wait" it first prints "ready <pid>" and waits for a line on stdin.
// usage: fakebuild churn N
//   forks N children one after another, each exiting at once, prints "done children=N", then
//   waits until stdin closes.
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define PHASE_NS 200000000LL

static volatile unsigned long sink;

// About 20 us of integer work: the clock is read between calls.
__attribute__((noinline, noclone)) void burn(void) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < 20000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

// Identical bodies: no_icf keeps gcc from folding them into one function under one name.
__attribute__((noinline, noclone, no_icf)) void serial_step(long long deadline) {
  while (now_ns(CLOCK_MONOTONIC) < deadline) burn();
}

__attribute__((noinline, noclone, no_icf)) void parallel_step(long long deadline) {
  while (now_ns(CLOCK_MONOTONIC) < deadline) burn();
}

// This process's run-queue wait so far (schedstat field 2), 0 if unreadable.
static long long own_runq_wait_ns(void) {
  FILE* f = fopen("/proc/self/schedstat", "r");
  if (!f) return 0;
  long long run = 0, wait = 0;
  if (fscanf(f, "%lld %lld", &run, &wait) != 2) wait = 0;
  fclose(f);
  return wait;
}

static int build(double seconds, int status) {
  int report[2];
  if (pipe(report) != 0) return 1;
  long long serial_cpu = 0, busy = 0, runq = 0;
  int rounds = 0;
  const long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) {
    const long long t0 = now_ns(CLOCK_MONOTONIC);
    const long long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    serial_step(t0 + PHASE_NS);
    serial_cpu += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
    const long long deadline = now_ns(CLOCK_MONOTONIC) + PHASE_NS;
    for (int i = 0; i < 2; i++) {
      pid_t pid = fork();
      if (pid < 0) return 1;
      if (pid == 0) {
        parallel_step(deadline);
        long long w = own_runq_wait_ns();
        if (write(report[1], &w, sizeof(w)) != sizeof(w)) _exit(1);
        _exit(0);
      }
    }
    for (int i = 0; i < 2; i++) {
      int st;
      if (wait(&st) < 0) return 1;
      long long w = 0;
      if (read(report[0], &w, sizeof(w)) == sizeof(w)) runq += w;
    }
    busy += now_ns(CLOCK_MONOTONIC) - t0;
    rounds++;
  }
  struct rusage ru;
  getrusage(RUSAGE_CHILDREN, &ru);
  const long long parallel_cpu =
      (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1000000000LL +
      (ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1000LL;
  printf("done rounds=%d serial_cpu_ns=%lld parallel_cpu_ns=%lld busy_wall_ns=%lld "
         "children_runq_wait_ns=%lld\n",
         rounds, serial_cpu, parallel_cpu, busy, runq);
  fflush(stdout);
  return status;
}

static int churn(long n) {
  for (long i = 0; i < n; i++) {
    pid_t pid = fork();
    if (pid < 0) return 1;
    if (pid == 0) _exit(0);
    int st;
    if (waitpid(pid, &st, 0) < 0) return 1;
  }
  printf("done children=%ld\n", n);
  fflush(stdout);
  char buf[64];
  while (read(0, buf, sizeof(buf)) > 0) {
  }
  return 0;
}

int main(int argc, char** argv) {
  setvbuf(stdout, NULL, _IOLBF, 0);
  if (argc >= 3 && strcmp(argv[1], "churn") == 0) return churn(atol(argv[2]));
  if (argc < 3 || strcmp(argv[1], "build") != 0) {
    fprintf(stderr, "usage: fakebuild build SECONDS [STATUS [wait]] | fakebuild churn N\n");
    return 2;
  }
  const int status = argc >= 4 ? atoi(argv[3]) : 0;
  if (argc >= 5 && strcmp(argv[4], "wait") == 0) {
    printf("ready %d\n", getpid());
    char line[64];
    if (!fgets(line, sizeof(line), stdin)) return 1;
  }
  return build(atof(argv[2]), status);
}
