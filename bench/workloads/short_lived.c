// Lifecycle benchmark: a steady stream of short-lived, freshly exec'd processes.
// Usage:
//   short_lived burn MS
//       burns MS ms of this thread's CPU in lifecycle_burn and exits.
//   short_lived spawn SECONDS PERIOD_MS BURN_MS SH_EVERY BIN...
//       every PERIOD_MS (an absolute schedule: a late start does not shift the later ones) forks
//       a child that execs BIN[i % count] `burn BURN_MS` (the copies of this binary at different
//       paths, so processes map different files); every SH_EVERY-th child (0: none) instead
//       execs `/bin/sh -c 'exec "$0" burn BURN_MS' BIN`, an exec chain (sh, then the burner,
//       same pid). Runs for SECONDS or until SIGTERM/SIGINT, then waits for its children.
//       Prints one line per child, "<pid> <start time in clock ticks since boot> <sh|exec>"
//       (proc(5) stat field 22, read before the child is reaped), then
//       "started=N via_sh=M late=L seconds=S" (late: starts more than one period behind).
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile unsigned long sink;
static volatile sig_atomic_t stop;

static void on_signal(int sig) {
  (void)sig;
  stop = 1;
}

static long long now_ns(clockid_t clock) {
  struct timespec ts;
  clock_gettime(clock, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The function the profiles should name: checks the clock only every ~10^5 iterations, so
// nearly every sample has it as the leaf.
__attribute__((noinline, noclone)) void lifecycle_burn(long ms) {
  long long end = now_ns(CLOCK_THREAD_CPUTIME_ID) + ms * 1000000LL;
  unsigned long x = sink;
  do {
    for (unsigned long i = 0; i < 100000UL; i++) {
      x = x * 6364136223846793005UL + 1442695040888963407UL;
    }
    sink = x;
  } while (now_ns(CLOCK_THREAD_CPUTIME_ID) < end);
}

static unsigned long long start_ticks(pid_t pid) {
  char path[64], buf[1024];
  snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
  FILE* f = fopen(path, "r");
  if (!f) return 0;
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  char* p = strrchr(buf, ')');  // comm may hold spaces; fields 3.. follow the last ')'
  if (!p) return 0;
  unsigned long long v = 0;
  // after ')': field 3 (state) is the first; starttime is field 22
  for (int field = 3; field <= 22 && p; field++) {
    p = strchr(p + 1, ' ');
    if (p && field == 22) v = strtoull(p + 1, NULL, 10);
  }
  return v;
}

static int spawn(double seconds, long period_ms, long burn_ms, int sh_every, char** bins,
                 int nbins) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  char burn_arg[32], sh_cmd[64];
  snprintf(burn_arg, sizeof burn_arg, "%ld", burn_ms);
  snprintf(sh_cmd, sizeof sh_cmd, "exec \"$0\" burn %ld", burn_ms);
  const long long period = period_ms * 1000000LL;
  const long long t0 = now_ns(CLOCK_MONOTONIC);
  const long long end = t0 + (long long)(seconds * 1e9);
  long started = 0, via_sh = 0, late = 0;
  for (long i = 0; !stop; i++) {
    long long due = t0 + i * period;
    if (due >= end) break;
    struct timespec ts = {due / 1000000000LL, due % 1000000000LL};
    while (!stop && clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR) {
    }
    if (stop) break;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
    if (now_ns(CLOCK_MONOTONIC) - due > period) late++;
    char* bin = bins[i % nbins];
    int use_sh = sh_every > 0 && i % sh_every == sh_every - 1;
    pid_t pid = fork();
    if (pid < 0) {
      perror("fork");
      continue;
    }
    if (pid == 0) {
      signal(SIGTERM, SIG_DFL);
      signal(SIGINT, SIG_DFL);
      if (use_sh) {
        execl("/bin/sh", "sh", "-c", sh_cmd, bin, (char*)NULL);
      } else {
        execl(bin, bin, "burn", burn_arg, (char*)NULL);
      }
      _exit(127);
    }
    started++;
    via_sh += use_sh;
    printf("%d %llu %s\n", (int)pid, start_ticks(pid), use_sh ? "sh" : "exec");
  }
  while (wait(NULL) > 0 || errno == EINTR) {
  }
  printf("started=%ld via_sh=%ld late=%ld seconds=%.1f\n", started, via_sh, late,
         (now_ns(CLOCK_MONOTONIC) - t0) / 1e9);
  return 0;
}

int main(int argc, char** argv) {
  if (argc == 3 && strcmp(argv[1], "burn") == 0) {
    lifecycle_burn(atol(argv[2]));
    return 0;
  }
  if (argc >= 7 && strcmp(argv[1], "spawn") == 0) {
    return spawn(atof(argv[2]), atol(argv[3]), atol(argv[4]), atoi(argv[5]), argv + 6, argc - 6);
  }
  fprintf(stderr,
          "usage: short_lived burn MS | short_lived spawn SECONDS PERIOD_MS BURN_MS SH_EVERY "
          "BIN...\n");
  return 2;
}
