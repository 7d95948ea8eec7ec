// Ground truth for symbolization from debug info: one thread spins in debuginfo_burn(), whose hot
// loop is mix_step(), an always-inline function, so with -O2 -g every sample's leaf pc lies in
// code DWARF attributes to mix_step (inlined) within debuginfo_burn. The tests derive stripped
// copies (a separate debug file found through .gnu_debuglink or the build-id directory, and
// MiniDebugInfo) from builds of this file that differ only in PS_VARIANT, so each has its own
// build id. The lines the tests expect are marked "LINE:" below; they read them from this file.
//
// usage: debuginfo SECONDS
//   prints "ready <pid>", waits for a line on stdin, spins for SECONDS of wall time, prints
//   "done rounds=<R>", then idles until stdin closes.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#ifndef PS_VARIANT
#define PS_VARIANT 0
#endif

static volatile unsigned long sink = PS_VARIANT;

__attribute__((always_inline)) static inline unsigned long mix_step(unsigned long x,
                                                                     unsigned long i) {
  return (x ^ (x >> 29)) * 0xbf58476d1ce4e5b9UL + i; /* LINE: mix_step */
}

__attribute__((noinline, noclone)) unsigned long debuginfo_burn(unsigned long n) {
  unsigned long x = sink;
  for (unsigned long i = 0; i < n; i++) x = mix_step(x, i); /* LINE: call mix_step */
  return x + PS_VARIANT;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 2.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  long rounds = 0;
  while (now_ns(CLOCK_MONOTONIC) < end) {
    sink = debuginfo_burn(200000);
    rounds++;
  }
  printf("done rounds=%ld\n", rounds);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
