// Ground truth for off-CPU intervals that end on another CPU: a sleeper thread pinned to one CPU
// sleeps 50 ms in sleep_50ms(); 10 ms into each sleep a mover thread re-pins it to the other CPU
// (sched_setaffinity), so it is woken there: it goes to sleep on CPU 0 and wakes on CPU 1, then
// the other way round, ROUNDS times. Its off-CPU time in state "sleeping" is the time it slept.
//
// usage: migrate_sleeper ROUNDS
//   prints "ready <pid>", waits for a line on stdin, runs the rounds, then prints
//     done tid=T rounds=R sleep_ns=S migrated=M cpu_ns=C life_ns=L start_unix_ns=A
//          end_unix_ns=E
//   (S: CLOCK_MONOTONIC summed around each sleep; M: rounds after which the sleeper woke on the
//   CPU it had been moved to; C and L: the sleeper's CPU time and CLOCK_MONOTONIC lifetime), then
//   idles until stdin closes. Needs CPUs 0 and 1.
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

static int rounds, tid, migrated;
static int to_mover[2];
static long long sleep_ns, cpu_ns, life_ns, start_unix, end_unix;

__attribute__((noinline, noclone)) void sleep_50ms(void) {
  struct timespec ts = {0, 50 * 1000 * 1000};
  raw_syscall4(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, (long)&ts, 0);
}

static void pin_thread(int t, int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(t, sizeof(set), &set) != 0) abort();
}

// Reads which CPU to move the sleeper to, waits 10 ms (the sleeper is asleep by then), moves it.
static void* mover(void* arg) {
  (void)arg;
  char cpu;
  while (read(to_mover[0], &cpu, 1) == 1) {
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pin_thread(__atomic_load_n(&tid, __ATOMIC_ACQUIRE), cpu);
  }
  return NULL;
}

__attribute__((noinline, noclone)) void sleeper_loop(void) {
  for (int r = 0; r < rounds; r++) {
    char target = (r % 2 == 0) ? 1 : 0;  // we sit on the other one
    if (write(to_mover[1], &target, 1) != 1) abort();
    long long t0 = now_ns(CLOCK_MONOTONIC);
    sleep_50ms();
    sleep_ns += now_ns(CLOCK_MONOTONIC) - t0;
    if (sched_getcpu() == target) migrated++;
  }
}

static void* sleeper(void* arg) {
  (void)arg;
  long long cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID), mono0 = now_ns(CLOCK_MONOTONIC);
  start_unix = now_ns(CLOCK_REALTIME);
  // Published before the first request to the mover, which is the only reader.
  __atomic_store_n(&tid, (int)syscall(SYS_gettid), __ATOMIC_RELEASE);
  sleeper_loop();
  end_unix = now_ns(CLOCK_REALTIME);
  life_ns = now_ns(CLOCK_MONOTONIC) - mono0;
  cpu_ns = now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0;
  return NULL;
}

int main(int argc, char** argv) {
  rounds = argc > 1 ? atoi(argv[1]) : 60;
  char line[64];
  if (pipe(to_mover) != 0) return 1;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(0, &set);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  if (pthread_attr_setaffinity_np(&attr, sizeof(set), &set) != 0) return 1;
  pthread_t s, m;
  pthread_create(&m, NULL, mover, NULL);
  pthread_setname_np(m, "mover");
  pthread_create(&s, &attr, sleeper, NULL);
  pthread_setname_np(s, "sleeper");
  pthread_join(s, NULL);
  close(to_mover[1]);
  pthread_join(m, NULL);
  printf("done tid=%d rounds=%d sleep_ns=%lld migrated=%d cpu_ns=%lld life_ns=%lld "
         "start_unix_ns=%lld end_unix_ns=%lld\n",
         tid, rounds, sleep_ns, migrated, cpu_ns, life_ns, start_unix, end_unix);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
