// Scenario 4, many threads: NTHREADS threads each sleep a random 1-10 ms (nanosleep), wake, count
// the wake-up and sleep again, for DURATION seconds.
// Usage: many_threads DURATION_S [NTHREADS=500]
// Prints: wakeups_per_s=<all threads> threads=<N>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static atomic_int stop;
static atomic_ullong wakeups;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *sleeper(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg * 2654435761u + 1;
  unsigned long long n = 0;
  while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
    long ms = 1 + rand_r(&seed) % 10;
    struct timespec d = {0, ms * 1000000L};
    nanosleep(&d, NULL);
    n++;
  }
  atomic_fetch_add(&wakeups, n);
  return NULL;
}

int main(int argc, char **argv) {
  double duration = argc > 1 ? atof(argv[1]) : 5;
  int n = argc > 2 ? atoi(argv[2]) : 500;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 64 * 1024);
  pthread_t *th = calloc(n, sizeof *th);
  double t0 = now_s();
  for (int i = 0; i < n; i++)
    if (pthread_create(&th[i], &attr, sleeper, (void *)(uintptr_t)i)) return 1;
  struct timespec d = {(time_t)duration, (long)((duration - (time_t)duration) * 1e9)};
  nanosleep(&d, NULL);
  atomic_store(&stop, 1);
  for (int i = 0; i < n; i++) pthread_join(th[i], NULL);
  double secs = now_s() - t0;
  printf("wakeups_per_s=%.1f wakeups=%llu seconds=%.3f threads=%d\n",
         atomic_load(&wakeups) / secs, atomic_load(&wakeups), secs, n);
  return 0;
}
