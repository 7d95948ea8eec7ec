// Ground truth for the off-CPU stack memo (bpf/abi.h ps_user_memo): the main thread blocks in
// block_once() (libc's poll() with no fds and a 2 ms timeout) called through via_a() three
// times, then through via_b() once, round after round. via_a and via_b have the same frame, and
// main calls both from one loop, so every switch-out starts from the same user pc and sp:
// only the return addresses on the stack (into via_a or via_b, and into main) tell them apart. Their off-CPU time
// therefore splits 0.75/0.25, and a memo that reused a walk on equal registers alone would give
// via_b's time to via_a. Each stack: kernel -> libc poll -> block_once -> via_a|via_b -> main.
//
// usage: offcpu_memo SECONDS
//   prints "ready <pid>", waits for a line on stdin, alternates for SECONDS of wall time, then
//   prints
//     done tid=T a_ns=A b_ns=B rounds=R same_sp=S
//   (A and B are CLOCK_MONOTONIC sums around each via_a() and each via_b() call; S is 1 when
//   block_once ran on the same stack pointer in every call, the premise above), then idles
//   until stdin closes.
// Built with gcc -O2 and its defaults (no frame pointers).
#define _GNU_SOURCE
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "workload_util.h"

// The stack pointer in block_once at its first call, and whether a later call differed (x86-64;
// read with asm so that no frame pointer is forced on the function).
static unsigned long first_sp;
static int sp_differs;

__attribute__((noinline, noclone)) int block_once(void) {
  unsigned long sp;
  __asm__ volatile("mov %%rsp, %0" : "=r"(sp));
  if (first_sp == 0)
    first_sp = sp;
  else if (sp != first_sp)
    sp_differs = 1;
  return poll(NULL, 0, 2) + 1;
}

// Not a tail call (the result is changed after), and different constants keep gcc's identical
// code folding (-fipa-icf, on at -O2) from making them one function.
__attribute__((noinline, noclone)) int via_a(void) {
  int r = block_once();
  __asm__ volatile("" ::: "memory");
  return r + 1;
}

__attribute__((noinline, noclone)) int via_b(void) {
  int r = block_once();
  __asm__ volatile("" ::: "memory");
  return r + 2;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long a_ns = 0, b_ns = 0;
  long rounds = 0;
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) {
    for (int i = 0; i < 4; i++) {
      long long t0 = now_ns(CLOCK_MONOTONIC);
      int r = i < 3 ? via_a() : via_b();
      long long t1 = now_ns(CLOCK_MONOTONIC);
      if (r != (i < 3 ? 2 : 3)) abort();
      if (i < 3)
        a_ns += t1 - t0;
      else
        b_ns += t1 - t0;
    }
    rounds++;
  }
  printf("done tid=%d a_ns=%lld b_ns=%lld rounds=%ld same_sp=%d\n", (int)getpid(), a_ns, b_ns,
         rounds, !sp_differs);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
