// Scenario 1, CPU-bound: one busy thread per online CPU, each doing the same fixed unit of work
// (a xorshift loop of WORK_ITERS steps) over and over for DURATION seconds.
// Usage: cpu_bound DURATION_S
// Prints: work_per_s=<units per second, all threads> units=<N> seconds=<S> threads=<T>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define WORK_ITERS 100000  // one unit of work: about 0.1 ms on a 2020s core

static atomic_int stop;
static volatile uint64_t sink;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

__attribute__((noinline)) static uint64_t work_unit(uint64_t x) {
  for (int i = 0; i < WORK_ITERS; i++) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
  }
  return x;
}

static void *busy(void *arg) {
  uint64_t *units = arg, x = (uintptr_t)arg | 1;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    x = work_unit(x);
    (*units)++;
  }
  sink = x;
  return NULL;
}

int main(int argc, char **argv) {
  double duration = argc > 1 ? atof(argv[1]) : 5;
  int n = (int)sysconf(_SC_NPROCESSORS_ONLN);
  pthread_t *th = calloc(n, sizeof *th);
  uint64_t *units = calloc((size_t)n * 8, sizeof *units);  // 64-byte stride: no false sharing
  double t0 = now_s();
  for (int i = 0; i < n; i++) pthread_create(&th[i], NULL, busy, &units[i * 8]);
  struct timespec d = {(time_t)duration, (long)((duration - (time_t)duration) * 1e9)};
  nanosleep(&d, NULL);
  atomic_store(&stop, 1);
  uint64_t total = 0;
  for (int i = 0; i < n; i++) {
    pthread_join(th[i], NULL);
    total += units[i * 8];
  }
  double secs = now_s() - t0;
  printf("work_per_s=%.1f units=%llu seconds=%.3f threads=%d\n", total / secs,
         (unsigned long long)total, secs, n);
  return 0;
}
