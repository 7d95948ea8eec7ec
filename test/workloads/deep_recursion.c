// Ground truth for stack-depth truncation: main calls recurse(300), a noinline function that calls
// itself 300 deep and spins in spin_at_bottom() at the bottom. So every sample's user stack is
// spin_at_bottom, then 300 recurse frames, then main and libc's start code: deeper than the
// profiler's 127-frame limit, so the profile shows 127 user frames and a synthetic
// "[truncated]" root frame.
//
// usage: deep_recursion SECONDS
//   prints "ready <pid>", waits for a line on stdin, spins at the bottom for SECONDS of wall time,
//   prints "done depth=300 cpu_ns=<process CPU ns>", then idles until stdin closes.
// Built with gcc -O2 and its defaults (no frame pointers). The recursion stays a recursion: the
// result of the call is used after it and a volatile store follows it, so gcc can neither turn it
// into a loop (tail recursion, or its accumulator form) nor make it a sibling call.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define DEPTH 300

static volatile unsigned long sink;
static volatile int deepest;

__attribute__((noinline, noclone)) unsigned long spin_at_bottom(long long until) {
  unsigned long x = sink;
  while (now_ns(CLOCK_MONOTONIC) < until) {
    for (int i = 0; i < 10000; i++) x = x * 6364136223846793005UL + 1442695040888963407UL;
  }
  return x;
}

__attribute__((noinline, noclone)) unsigned long recurse(int depth, long long until) {
  if (depth == 0) return spin_at_bottom(until) + 1;
  unsigned long r = recurse(depth - 1, until);
  deepest = depth;  // after the call: keeps the frame
  return r * 3 + (unsigned long)depth;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
  sink = recurse(DEPTH, now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9));
  printf("done depth=%d cpu_ns=%lld\n", DEPTH, now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
