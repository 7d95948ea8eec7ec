// Ground truth for process lifecycles: short-lived children, an exec into a second image, and
// two "programs" (distinct burn functions) that a test runs one after the other under one pid.
//
// usage:
//   lifecycle spawn N MS   for i in 0..N-1: fork, exec this binary as `lifecycle child MS` and
//                          wait for it; prints each child's pid (one line each, flushed) right
//                          after the fork, then "done" once all have exited
//   lifecycle child MS     burns MS ms of CPU in short_lived_burn and exits
//   lifecycle exec MS      prints its pid, burns MS ms in first_image_burn, then execs this
//                          binary as `lifecycle second MS` (same pid, new image)
//   lifecycle second MS    burns MS ms in second_image_burn and exits
//   lifecycle burn_a MS    burns MS ms in program_a_burn and exits
//   lifecycle burn_b MS    burns MS ms in program_b_burn and exits
// MS counts CPU time of the calling thread (CLOCK_THREAD_CPUTIME_ID), so a burn takes MS ms of
// on-CPU samples whatever else shares the CPU. The binary re-executes itself through the path
// /proc/self/exe resolves to, so every image maps the same file.
// Build: gcc -O2 with its defaults (no frame pointers; CMakeLists.txt). Every burn function is
// noinline/noclone/no_icf with its own constants, so -O2 keeps each a real function under its own
// name (not merged with another of identical code) with nothing inlined into it but its loop;
// each checks the clock only every ~10^5 iterations, so almost all of its samples have it as
// the leaf.
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define CHUNK 100000UL /* iterations between clock checks (~100 us) */

static volatile unsigned long sink;
static char self_path[PATH_MAX];

/* This thread's CPU time in ns. A real function, so a sample inside the clock read has the
 * burn function itself (not an inlined copy of now_ns) as its caller frame. */
__attribute__((noinline, noclone)) static long long cpu_ns(void) {
  return now_ns(CLOCK_THREAD_CPUTIME_ID);
}

#define BURN_BODY(mul, add)                                          \
  long long end = cpu_ns() + ms * 1000000LL;                         \
  unsigned long x = sink;                                            \
  do {                                                               \
    for (unsigned long i = 0; i < CHUNK; i++) x = x * (mul) + (add); \
    sink = x;                                                        \
  } while (cpu_ns() < end)

__attribute__((noinline, noclone, no_icf)) void short_lived_burn(long ms) {
  BURN_BODY(6364136223846793005UL, 1442695040888963407UL);
}

__attribute__((noinline, noclone, no_icf)) void first_image_burn(long ms) {
  BURN_BODY(2862933555777941757UL, 3037000493UL);
}

__attribute__((noinline, noclone, no_icf)) void second_image_burn(long ms) {
  BURN_BODY(3202034522624059733UL, 4354685564936845319UL);
}

__attribute__((noinline, noclone, no_icf)) void program_a_burn(long ms) {
  BURN_BODY(1181783497276652981UL, 7046029254386353131UL);
}

__attribute__((noinline, noclone, no_icf)) void program_b_burn(long ms) {
  BURN_BODY(7664345821815920749UL, 1013904223UL);
}

// Resolves /proc/self/exe into self_path (once); 0 on success.
static int resolve_self(void) {
  if (self_path[0] != '\0') return 0;
  ssize_t len = readlink("/proc/self/exe", self_path, sizeof(self_path) - 1);
  if (len <= 0) {
    perror("lifecycle: readlink /proc/self/exe");
    return -1;
  }
  self_path[len] = '\0';
  return 0;
}

// Replaces this process's image with `lifecycle MODE MS`; returns only on failure.
static void exec_self(const char* mode, const char* ms) {
  if (resolve_self() != 0) return;
  char* const args[] = {"lifecycle", (char*)mode, (char*)ms, NULL};
  execv(self_path, args);
  fprintf(stderr, "lifecycle: execv %s: %s\n", self_path, strerror(errno));
}

// The path is resolved before the first fork: a child only forks, execs and burns.
static int spawn(int n, const char* ms) {
  if (resolve_self() != 0) return 1;
  for (int i = 0; i < n; i++) {
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
      perror("lifecycle: fork");
      return 1;
    }
    if (pid == 0) {
      exec_self("child", ms);
      _exit(127);
    }
    printf("%d\n", (int)pid);
    fflush(stdout);
    int status;
    if (waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      fprintf(stderr, "lifecycle: child %d failed (status %d)\n", (int)pid, status);
      return 1;
    }
  }
  printf("done\n");
  fflush(stdout);
  return 0;
}

// Argument handling without libc calls: a child's run before its burn is then its own code
// only. With atol and strcmp there, the first call of each (lazy PLT binding, first touch of
// their pages and of the locale tables) took 0.3% of a 20 ms child's samples here and 0.8% on
// a fresh machine: real time outside the burn, which the short-lived test counts against the
// burn's share (it asks 99%) although the profiler placed it right.
static int same(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) a++, b++;
  return *a == *b;
}

// The non-negative decimal `s` (digits only; stops at the first other character).
static long parse_long(const char* s) {
  long v = 0;
  for (; *s >= '0' && *s <= '9'; s++) v = v * 10 + (*s - '0');
  return v;
}

int main(int argc, char** argv) {
  if (argc != 3 && !(argc == 4 && same(argv[1], "spawn"))) {
    fprintf(stderr,
            "usage: lifecycle spawn N MS | child MS | exec MS | second MS | burn_a MS | "
            "burn_b MS\n");
    return 2;
  }
  const char* mode = argv[1];
  const char* ms_arg = argv[argc - 1];
  long ms = parse_long(ms_arg);
  if (same(mode, "spawn")) return spawn((int)parse_long(argv[2]), ms_arg);
  if (same(mode, "child")) {
    short_lived_burn(ms);
  } else if (same(mode, "exec")) {
    printf("%d\n", (int)getpid());
    fflush(stdout);
    first_image_burn(ms);
    exec_self("second", ms_arg);
    return 1;
  } else if (same(mode, "second")) {
    second_image_burn(ms);
  } else if (same(mode, "burn_a")) {
    program_a_burn(ms);
  } else if (same(mode, "burn_b")) {
    program_b_burn(ms);
  } else {
    fprintf(stderr, "lifecycle: unknown mode %s\n", mode);
    return 2;
  }
  return 0;
}
