// Ground truth for unwinding through a signal frame: an interval timer (setitimer ITIMER_REAL,
// every 10 ms) sends SIGALRM to a process whose main thread spins in interrupted_work(); the
// handler on_alarm() is CPU-bound (spins about 3 ms per delivery). So about 30% of the CPU
// samples are in on_alarm, and their stacks are on_alarm -> __restore_rt (libc's signal return
// trampoline, the handler's return address; not in libc's .dynsym, so it may show as an address
// in libc.so.6) -> interrupted_work (the interrupted function) -> main.
//
// usage: sigalrm_spin SECONDS
//   prints "ready <pid>", waits for a line on stdin, spins for SECONDS of wall time, stops the
//   timer, prints "done cpu_ns=<process CPU ns> alarms=<handler runs> handler_ns=<CLOCK_MONOTONIC
//   ns spent in the handler>", then idles until stdin closes.
// Built with gcc -O2 and its defaults (no frame pointers). interrupted_work() spins in its own
// body (no calls), so the signal interrupts it and not a callee.
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define HANDLER_NS 3000000LL

static volatile unsigned long sink;
static volatile long alarms;
static volatile long long handler_ns;

__attribute__((noinline, noclone)) void on_alarm(int sig) {
  (void)sig;
  long long t0 = now_ns(CLOCK_MONOTONIC);  // clock_gettime is async-signal-safe
  unsigned long x = sink;
  do {
    for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  } while (now_ns(CLOCK_MONOTONIC) - t0 < HANDLER_NS);
  sink = x;
  alarms = alarms + 1;
  handler_ns = handler_ns + (now_ns(CLOCK_MONOTONIC) - t0);
}

// About 1 ms of integer work with no calls in the loop.
__attribute__((noinline, noclone)) unsigned long interrupted_work(unsigned long n) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  return x;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  struct sigaction sa;
  memset(&sa, 0, sizeof(sa));
  sa.sa_handler = on_alarm;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGALRM, &sa, NULL) != 0) return 1;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
  struct itimerval it = {{0, 10000}, {0, 10000}};
  if (setitimer(ITIMER_REAL, &it, NULL) != 0) return 1;
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) sink = interrupted_work(1000000) + 1;
  struct itimerval off = {{0, 0}, {0, 0}};
  setitimer(ITIMER_REAL, &off, NULL);
  printf("done cpu_ns=%lld alarms=%ld handler_ns=%lld\n", now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0,
         alarms, handler_ns);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
