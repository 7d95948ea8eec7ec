// Ground truth for run-queue delay: two CPU-bound threads share CPU 0 (both pinned to it), so
// each one waits runnable about as long as the other runs: its "runnable" off-CPU time is about
// its own CPU time.
//
// usage: pinned_pair SECONDS
//   prints "ready <pid>", waits for a line on stdin, runs both threads for SECONDS of wall time,
//   then prints
//     done tid1=T1 cpu1_ns=C1 wait1_ns=W1 tid2=T2 cpu2_ns=C2 wait2_ns=W2 start_unix_ns=A
//          end_unix_ns=E
//   (C from CLOCK_THREAD_CPUTIME_ID over each thread's life; W is the kernel's own run-queue wait
//   from /proc/self/task/TID/schedstat over the same span, -1 if unavailable), then idles until
//   stdin closes.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

static volatile unsigned long sink;

__attribute__((noinline, noclone)) void burn(void) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < 20000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

__attribute__((noinline, noclone)) void spin_pinned(long long deadline) {
  while (now_ns(CLOCK_MONOTONIC) < deadline) burn();
}

struct result {
  int tid;
  long long cpu_ns, wait_ns;
};
static long long deadline;
static pthread_barrier_t barrier;

static void* worker(void* arg) {
  struct result* r = arg;
  r->tid = (int)syscall(SYS_gettid);
  long long w0 = runqueue_wait_ns(r->tid);
  long long c0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  pthread_barrier_wait(&barrier);
  spin_pinned(deadline);
  r->cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - c0;
  long long w1 = runqueue_wait_ns(r->tid);
  r->wait_ns = w0 < 0 || w1 < 0 ? -1 : w1 - w0;
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (pthread_attr_setaffinity_np(&attr, sizeof(set), &set) != 0) return 1;
  pthread_barrier_init(&barrier, NULL, 2);
  deadline = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  long long start_unix = now_ns(CLOCK_REALTIME);
  struct result r1 = {0}, r2 = {0};
  pthread_t t1, t2;
  pthread_create(&t1, &attr, worker, &r1);
  pthread_setname_np(t1, "pinned_1");
  pthread_create(&t2, &attr, worker, &r2);
  pthread_setname_np(t2, "pinned_2");
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
  printf("done tid1=%d cpu1_ns=%lld wait1_ns=%lld tid2=%d cpu2_ns=%lld wait2_ns=%lld "
         "start_unix_ns=%lld end_unix_ns=%lld\n",
         r1.tid, r1.cpu_ns, r1.wait_ns, r2.tid, r2.cpu_ns, r2.wait_ns, start_unix,
         now_ns(CLOCK_REALTIME));
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
