// Ground truth for unwinding through libc: main calls search_many(), which calls libc's bsearch()
// in a loop; bsearch calls back into cmp_keys(), a comparator that does enough work (a short hash
// loop per comparison) that most samples land in it. So a comparator sample's stack is
// cmp_keys -> bsearch (libc.so.6) -> search_many -> main.
//
// usage: bsearch_loop SECONDS
//   prints "ready <pid>", waits for a line on stdin, searches for SECONDS of wall time, prints
//   "done cpu_ns=<process CPU ns> searches=<N> found=<F>", then idles until stdin closes.
// Built with gcc -O2 and its defaults (no frame pointers). At -O2 glibc's <stdlib.h> defines
// bsearch as an inline function (bits/stdlib-bsearch.h, __USE_EXTERN_INLINES), so a direct call
// would be compiled into search_many and libc would never be on the stack; the call goes through
// a volatile function pointer so that libc's own bsearch (in libc.so.6, found in its .dynsym)
// runs.
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

#define N_KEYS 4096
#define HASH_ROUNDS 400 /* work per comparison */

static unsigned long keys[N_KEYS];
static volatile unsigned long sink;
typedef void* (*bsearch_fn)(const void*, const void*, size_t, size_t,
                            int (*)(const void*, const void*));
static bsearch_fn volatile libc_bsearch = bsearch;

__attribute__((noinline, noclone)) int cmp_keys(const void* a, const void* b) {
  unsigned long x = *(const unsigned long*)a, y = *(const unsigned long*)b;
  // Work that does not change the outcome: mix a copy of the key HASH_ROUNDS times.
  unsigned long h = x ^ sink;
  for (int i = 0; i < HASH_ROUNDS; i++) h = h * 6364136223846793005UL + 1442695040888963407UL;
  sink = h;
  return x < y ? -1 : x > y ? 1 : 0;
}

// Looks up `n` keys (every other one present) and returns how many were found.
__attribute__((noinline, noclone)) long search_many(long n) {
  long found = 0;
  for (long i = 0; i < n; i++) {
    unsigned long key = (unsigned long)(i % (2 * N_KEYS));
    if (libc_bsearch(&key, keys, N_KEYS, sizeof(keys[0]), cmp_keys) != NULL) found++;
  }
  return found;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  for (int i = 0; i < N_KEYS; i++) keys[i] = 2UL * i;  // sorted, even numbers
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_PROCESS_CPUTIME_ID);
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  long searches = 0, found = 0;
  while (now_ns(CLOCK_MONOTONIC) < end) {
    found += search_many(200);
    searches += 200;
  }
  printf("done cpu_ns=%lld searches=%ld found=%ld\n", now_ns(CLOCK_PROCESS_CPUTIME_ID) - cpu0,
         searches, found);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
