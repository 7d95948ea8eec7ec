// Ground truth for the latency profile: rounds of 400 ms in which thread A runs serial_work()
// alone for 200 ms of wall time (B blocks on a condition variable), then A and B both run
// parallel_work() for 200 ms. CPU time is 1:2 between serial_work and parallel_work (shares 1/3
// and 2/3); wall-clock time, and so latency (each sample weighted 1/parallelism), is 1:1.
// Needs two idle CPUs.
//
// usage: serial_parallel SECONDS
//   prints "ready <pid>", waits for a line on stdin, starts A and B, runs whole rounds for about
//   SECONDS, then prints
//     done a_tid=A b_tid=B rounds=R serial_cpu_ns=S parallel_cpu_ns=P serial_wall_ns=SW
//          parallel_wall_ns=PW
//          b_start_delay_ns=D a_runq_wait_ns=WA b_runq_wait_ns=WB
//   (CPU ns from CLOCK_THREAD_CPUTIME_ID around each call, summed over both threads; wall ns
//   from CLOCK_MONOTONIC around A's calls; D: summed time from A's signal to B entering
//   parallel_work; WA, WB: the kernel's run-queue wait of each thread over the run, from
//   /proc/self/task/TID/schedstat, -1 if unavailable. D + WA + WB bound the time the parallel
//   phases were not really parallel), then idles until stdin closes.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
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

// serial_work and parallel_work have identical bodies: no_icf keeps gcc's identical code folding
// (-fipa-icf, on at -O2) from making them one function under one name.
__attribute__((noinline, noclone, no_icf)) void serial_work(long long deadline) {
  while (now_ns(CLOCK_MONOTONIC) < deadline) burn();
}

__attribute__((noinline, noclone, no_icf)) void parallel_work(long long deadline) {
  while (now_ns(CLOCK_MONOTONIC) < deadline) burn();
}

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static long long started_round = -1, parallel_deadline;  // guarded by mu
static int stop;                                           // guarded by mu
static int rounds;
static long long t_start;
static int a_tid, b_tid;
static long long signal_ns;  // guarded by mu: when A let B start the current parallel phase
static long long b_start_delay, a_runq_wait, b_runq_wait;

static long long serial_cpu, parallel_cpu_a, parallel_cpu_b, serial_wall, parallel_wall;

static void* thread_a(void* arg) {
  (void)arg;
  a_tid = (int)syscall(SYS_gettid);
  long long wait0 = runqueue_wait_ns(a_tid);
  for (int r = 0; r < rounds; r++) {
    long long round_start = t_start + r * 2 * PHASE_NS;
    long long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID), w0 = now_ns(CLOCK_MONOTONIC);
    serial_work(round_start + PHASE_NS);
    long long c1 = now_ns(CLOCK_THREAD_CPUTIME_ID), w1 = now_ns(CLOCK_MONOTONIC);
    serial_cpu += c1 - c0;
    serial_wall += w1 - w0;
    pthread_mutex_lock(&mu);
    started_round = r;
    parallel_deadline = round_start + 2 * PHASE_NS;
    signal_ns = now_ns(CLOCK_MONOTONIC);
    pthread_cond_signal(&cv);
    pthread_mutex_unlock(&mu);
    parallel_work(round_start + 2 * PHASE_NS);
    parallel_cpu_a += now_ns(CLOCK_THREAD_CPUTIME_ID) - c1;
    parallel_wall += now_ns(CLOCK_MONOTONIC) - w1;
  }
  long long wait1 = runqueue_wait_ns(a_tid);
  a_runq_wait = wait0 < 0 || wait1 < 0 ? -1 : wait1 - wait0;
  pthread_mutex_lock(&mu);
  stop = 1;
  pthread_cond_signal(&cv);
  pthread_mutex_unlock(&mu);
  return NULL;
}

static void* thread_b(void* arg) {
  (void)arg;
  b_tid = (int)syscall(SYS_gettid);
  long long wait0 = runqueue_wait_ns(b_tid);
  for (long long r = 0;; r++) {
    pthread_mutex_lock(&mu);
    while (started_round < r && !stop) pthread_cond_wait(&cv, &mu);
    long long deadline = parallel_deadline, signaled = signal_ns;
    int done = started_round < r;
    pthread_mutex_unlock(&mu);
    if (done) break;
    b_start_delay += now_ns(CLOCK_MONOTONIC) - signaled;
    long long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
    parallel_work(deadline);
    parallel_cpu_b += now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
  }
  long long wait1 = runqueue_wait_ns(b_tid);
  b_runq_wait = wait0 < 0 || wait1 < 0 ? -1 : wait1 - wait0;
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  rounds = (int)(seconds * 1e9 / (2 * PHASE_NS) + 0.5);
  if (rounds < 1) rounds = 1;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  pthread_t a, b;
  pthread_create(&b, NULL, thread_b, NULL);
  pthread_setname_np(b, "sp_b");
  t_start = now_ns(CLOCK_MONOTONIC) + 1000000;  // B is blocked by then
  pthread_create(&a, NULL, thread_a, NULL);
  pthread_setname_np(a, "sp_a");
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  printf("done a_tid=%d b_tid=%d rounds=%d serial_cpu_ns=%lld parallel_cpu_ns=%lld "
         "serial_wall_ns=%lld parallel_wall_ns=%lld b_start_delay_ns=%lld a_runq_wait_ns=%lld "
         "b_runq_wait_ns=%lld\n",
         a_tid, b_tid, rounds, serial_cpu, parallel_cpu_a + parallel_cpu_b, serial_wall,
         parallel_wall, b_start_delay, a_runq_wait, b_runq_wait);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
