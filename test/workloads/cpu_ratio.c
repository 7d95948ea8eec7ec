// Ground truth for on-CPU shares: one thread spends CPU in spin_a and spin_b in a 3:1 ratio.
//
// usage: cpu_ratio SECONDS
//   prints "ready <pid>", waits for a line on stdin (so the profiler can attach first), spins for
//   SECONDS of wall time, prints "done <cpu ns spent spinning>", then idles until stdin closes
//   (the process stays alive, so its maps can still be read for symbolization).
// Both functions call the same noinline burn() with a 3:1 iteration count, so their CPU times
// are 3:1 by construction; their inclusive shares are 0.75 and 0.25.
// Build: gcc -O2 with its defaults (no frame pointers; CMakeLists.txt). spin_a and spin_b use
// burn's result after the call, so the calls stay real calls (not sibling calls, which would
// take spin_a/spin_b off the stack); noinline/noclone keep every function under its own name.
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

__attribute__((noinline, noclone)) unsigned long burn(unsigned long n) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < n; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  return x;
}

__attribute__((noinline, noclone)) void spin_a(unsigned long n) { sink = burn(3 * n) + 1; }
__attribute__((noinline, noclone)) void spin_b(unsigned long n) { sink = burn(n) + 2; }

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  unsigned long rng = 0x9e3779b97f4a7c15UL; /* xorshift64 */
  while (now_ns(CLOCK_MONOTONIC) < end) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    unsigned long n = UNIT_MIN + rng % UNIT_SPAN;
    spin_a(n);
    spin_b(n);
  }
  printf("done %lld\n", now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
