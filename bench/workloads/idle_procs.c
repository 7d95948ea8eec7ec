// Footprint helper: forks COUNT processes that each wake every PERIOD_MS milliseconds, touch a
// little CPU and sleep again, until the parent gets SIGTERM/SIGINT (which it forwards). Used for
// "agent CPU with 200 processes" and "RSS with 1000 live processes".
// Usage: idle_procs COUNT [PERIOD_MS=100]
// Prints "ready <COUNT>" on stdout once every child has been started.
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

__attribute__((noinline)) static uint64_t tick(uint64_t x) {
  for (int i = 0; i < 20000; i++) x = x * 6364136223846793005ull + 1442695040888963407ull;
  return x;
}

int main(int argc, char **argv) {
  int count = argc > 1 ? atoi(argv[1]) : 200;
  long period_ms = argc > 2 ? atol(argv[2]) : 100;
  pid_t *kids = calloc(count, sizeof *kids);
  for (int i = 0; i < count; i++) {
    pid_t p = fork();
    if (p < 0) return 1;
    if (p == 0) {
      signal(SIGTERM, SIG_DFL);
      uint64_t x = (uint64_t)i;
      struct timespec d = {period_ms / 1000, (period_ms % 1000) * 1000000L};
      for (;;) {
        nanosleep(&d, NULL);
        x = tick(x);
        if (x == 42) printf("!");  // keep the work
      }
    }
    kids[i] = p;
  }
  struct sigaction sa = {.sa_handler = on_signal};
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  printf("ready %d\n", count);
  fflush(stdout);
  while (!stop) pause();
  for (int i = 0; i < count; i++) kill(kids[i], SIGTERM);
  for (int i = 0; i < count; i++) waitpid(kids[i], NULL, 0);
  return 0;
}
