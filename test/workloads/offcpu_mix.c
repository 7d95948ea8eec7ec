// Ground truth for off-CPU shares: one thread waits in sleep_30ms() (nanosleep, 30 ms) and in
// pipe_wait_10ms() (a blocking pipe read that a helper thread answers 10 ms after being asked),
// alternately, so its off-CPU time is 3:1 between them (inclusive shares 0.75 and 0.25), all of
// it in TASK_INTERRUPTIBLE (state "sleeping").
//
// usage: offcpu_mix SECONDS
//   prints "ready <pid>", waits for a line on stdin, then starts the helper and the measured
//   thread; the measured thread alternates for SECONDS of wall time and exits, the helper exits
//   after it. Then prints
//     done tid=T helper_tid=H main_tid=M cpu_ns=C life_ns=L sleep_ns=S block_ns=B sleeps=N
//          waits=W start_unix_ns=A end_unix_ns=E helper_start_unix_ns=HA helper_end_unix_ns=HE
//   (T's own figures: C from CLOCK_THREAD_CPUTIME_ID, L = CLOCK_MONOTONIC lifetime from its first
//   to its last instruction, so its off-CPU total is L - C; S and B are CLOCK_MONOTONIC sums
//   around each nanosleep and each blocking read; A/E and HA/HE are CLOCK_REALTIME bounds of the
//   measured and helper threads' lifetimes), then idles until stdin closes (the process stays
//   alive, so its maps can still be read for symbolization).
// The waiting system calls are issued inline (workload_util.h), so each wait's user stack starts
// in the measured function itself; offcpu_libc waits through glibc's wrappers instead.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

static int req_pipe[2], resp_pipe[2];
static double seconds;
static int tid, helper_tid;
static long long cpu_ns, life_ns, sleep_ns, block_ns, sleeps, waits;
static long long start_unix, end_unix, helper_start_unix, helper_end_unix;

__attribute__((noinline, noclone)) void sleep_30ms(void) {
  struct timespec ts = {0, 30 * 1000 * 1000};
  raw_syscall4(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&ts, 0);
}

// Asks the helper for a byte and blocks reading it; the helper answers 10 ms later.
__attribute__((noinline, noclone)) long pipe_wait_10ms(void) {
  char c = 'r';
  raw_syscall4(SYS_write, req_pipe[1], (long)&c, 1, 0);
  long long t0 = now_ns(CLOCK_MONOTONIC);
  long n = raw_syscall4(SYS_read, resp_pipe[0], (long)&c, 1, 0);
  block_ns += now_ns(CLOCK_MONOTONIC) - t0;
  return n;
}

__attribute__((noinline, noclone)) void helper_sleep_10ms(void) {
  struct timespec ts = {0, 10 * 1000 * 1000};
  raw_syscall4(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&ts, 0);
}

__attribute__((noinline, noclone)) long helper_wait_request(char* c) {
  return raw_syscall4(SYS_read, req_pipe[0], (long)c, 1, 0);
}

static void* helper(void* arg) {
  (void)arg;
  helper_start_unix = now_ns(CLOCK_REALTIME);
  helper_tid = (int)syscall(SYS_gettid);
  char c;
  while (helper_wait_request(&c) == 1) {
    helper_sleep_10ms();
    raw_syscall4(SYS_write, resp_pipe[1], (long)&c, 1, 0);
  }
  helper_end_unix = now_ns(CLOCK_REALTIME);
  return NULL;
}

__attribute__((noinline, noclone)) void offcpu_loop(void) {
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) {
    long long t0 = now_ns(CLOCK_MONOTONIC);
    sleep_30ms();
    sleep_ns += now_ns(CLOCK_MONOTONIC) - t0;
    sleeps++;
    if (pipe_wait_10ms() != 1) abort();
    waits++;
  }
}

static void* measured(void* arg) {
  (void)arg;
  long long cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  long long mono0 = now_ns(CLOCK_MONOTONIC);
  start_unix = now_ns(CLOCK_REALTIME);
  tid = (int)syscall(SYS_gettid);
  offcpu_loop();
  end_unix = now_ns(CLOCK_REALTIME);
  life_ns = now_ns(CLOCK_MONOTONIC) - mono0;
  cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  return NULL;
}

int main(int argc, char** argv) {
  seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  if (pipe(req_pipe) != 0 || pipe(resp_pipe) != 0) return 1;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  pthread_t h, m;
  pthread_create(&h, NULL, helper, NULL);
  pthread_setname_np(h, "mix_helper");
  pthread_create(&m, NULL, measured, NULL);
  pthread_setname_np(m, "mix_measured");
  pthread_join(m, NULL);
  close(req_pipe[1]);  // the helper reads EOF and exits
  pthread_join(h, NULL);
  printf("done tid=%d helper_tid=%d main_tid=%d cpu_ns=%lld life_ns=%lld sleep_ns=%lld "
         "block_ns=%lld sleeps=%lld waits=%lld start_unix_ns=%lld end_unix_ns=%lld "
         "helper_start_unix_ns=%lld helper_end_unix_ns=%lld\n",
         tid, helper_tid, (int)getpid(), cpu_ns, life_ns, sleep_ns, block_ns, sleeps, waits,
         start_unix, end_unix, helper_start_unix, helper_end_unix);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
