// Ground truth for unwinding without frame pointers: one thread spends CPU in a shared leaf,
// shared_leaf(), called from caller_a() and caller_b() in a 3:1 ratio, so the two callers'
// inclusive shares are 0.75 and 0.25 by construction, and every sample's stack is
// shared_leaf -> caller_a|caller_b -> main -> libc's start code.
//
// usage: unwind_ratio SECONDS
//   prints "ready <pid>", waits for a line on stdin (so the profiler can attach first), spins for
//   SECONDS of wall time, prints "done cpu_ns=<process CPU ns spent spinning> rounds=<R>", then
//   idles until stdin closes (the process stays alive, so its maps can still be read for
//   symbolization).
// Built with gcc -O2 and its defaults (no frame pointers, CMakeLists.txt); a stripped copy
// (unwind_ratio-stripped: no .symtab, no debug info) is the same code. The callers use the leaf's
// result after the call, so the calls are real calls, not sibling calls (a `jmp` that would take
// the caller off the stack); noinline/noclone keep each function a real function under its own
// name (no .constprop/.isra clone). Rounds have random lengths (below), so the 3:1 split cannot
// alias with the sampling period: with fixed ~0.5 ms rounds, 999 Hz sampling hit the same phase
// of the round for long stretches and measured shares were up to 0.03 off.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

/* Iterations of the leaf per unit are drawn afresh each round from [UNIT_MIN, UNIT_MIN +
 * UNIT_SPAN) (~25-275 us a unit): rounds of random length, so the sampling period cannot alias
 * with them (fixed rounds near a multiple of the period biased the shares by up to 0.06). Both
 * callers use the same draw, which keeps their ratio exactly 3:1. */
#define UNIT_MIN 20000UL
#define UNIT_SPAN 200000UL

static volatile unsigned long sink;

__attribute__((noinline, noclone)) unsigned long shared_leaf(unsigned long n) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  return x;
}

__attribute__((noinline, noclone)) void caller_a(unsigned long n) { sink = shared_leaf(3 * n) + 1; }
__attribute__((noinline, noclone)) void caller_b(unsigned long n) { sink = shared_leaf(n) + 2; }

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  long rounds = 0;
  unsigned long rng = 0x9e3779b97f4a7c15UL; /* xorshift64 */
  while (now_ns(CLOCK_MONOTONIC) < end) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    unsigned long n = UNIT_MIN + rng % UNIT_SPAN;
    caller_a(n);
    caller_b(n);
    rounds++;
  }
  printf("done cpu_ns=%lld rounds=%ld\n", now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0, rounds);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
