// Scenario 2, context-switch heavy: two threads pass one byte back and forth over two pipes for
// DURATION seconds; every round trip blocks each thread once (two sleeps, two wake-ups).
// Usage: pingpong DURATION_S [CPU]   (CPU >= 0 pins both threads to that CPU; -1: unpinned)
// Prints: round_trips_per_s=<R> switches_per_s=<context switches of this process per second>
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static int pin_cpu = -1;

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void pin(void) {
  if (pin_cpu < 0) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(pin_cpu, &set);
  pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *echo(void *arg) {
  (void)arg;
  char c;
  pin();
  while (read(ping[0], &c, 1) == 1 && c != 'q')
    if (write(pong[1], &c, 1) != 1) break;
  return NULL;
}

int main(int argc, char **argv) {
  double duration = argc > 1 ? atof(argv[1]) : 5;
  pin_cpu = argc > 2 ? atoi(argv[2]) : -1;
  if (pipe(ping) || pipe(pong)) return 1;
  pthread_t th;
  pthread_create(&th, NULL, echo, NULL);
  pin();
  struct rusage r0, r1;
  getrusage(RUSAGE_SELF, &r0);
  double t0 = now_s(), deadline = t0 + duration, t;
  unsigned long long trips = 0;
  char c = 'p';
  do {
    for (int i = 0; i < 256; i++) {  // check the clock every 256 trips
      if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1) return 1;
    }
    trips += 256;
  } while ((t = now_s()) < deadline);
  getrusage(RUSAGE_SELF, &r1);
  c = 'q';
  if (write(ping[1], &c, 1) != 1) return 1;
  pthread_join(th, NULL);
  double secs = t - t0;
  long sw = (r1.ru_nvcsw + r1.ru_nivcsw) - (r0.ru_nvcsw + r0.ru_nivcsw);
  printf("round_trips_per_s=%.1f switches_per_s=%.1f round_trips=%llu seconds=%.3f\n",
         trips / secs, sw / secs, trips, secs);
  return 0;
}
