// Thread churn: creates and joins about 200 short-lived threads per second (batches of 4 every
// 20 ms; each does ~50 us of work and sleeps 1 ms), so a per-thread table that is not cleaned up
// at thread exit grows by about 200 entries a second.
//
// usage: thread_churn SECONDS
//   prints "ready <pid>", waits for a line on stdin, churns for SECONDS, then prints
//     done threads=N
//   and idles (one thread) until stdin closes.
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define BATCH 4
#define PERIOD_NS 20000000LL

static volatile unsigned long sink;

__attribute__((noinline, noclone)) void short_work(void) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < 30000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  sink = x;
}

static void* short_lived(void* arg) {
  (void)arg;
  short_work();
  struct timespec ts = {0, 1000000};
  nanosleep(&ts, NULL);
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 60.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long start = now_ns(CLOCK_MONOTONIC);
  long long end = start + (long long)(seconds * 1e9);
  long threads = 0;
  for (long long next = start; next < end; next += PERIOD_NS) {
    struct timespec ts = {next / 1000000000LL, next % 1000000000LL};
    clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
    pthread_t t[BATCH];
    for (int i = 0; i < BATCH; i++) {
      if (pthread_create(&t[i], NULL, short_lived, NULL) != 0) abort();
    }
    for (int i = 0; i < BATCH; i++) pthread_join(t[i], NULL);
    threads += BATCH;
  }
  printf("done threads=%ld\n", threads);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
