// Helpers shared by the ground-truth workloads (C, built with gcc -O2 and its defaults, without
// frame pointers: see CMakeLists.txt).
#ifndef PARASCOPE_TEST_WORKLOADS_WORKLOAD_UTIL_H_
#define PARASCOPE_TEST_WORKLOADS_WORKLOAD_UTIL_H_

#include <stdio.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// A system call issued inline, from the calling function itself: a wait issued this way has
// the measured function as its innermost user frame, whatever the unwinder does with libc's
// frames (workloads that test unwinding through libc call glibc's wrappers instead).
__attribute__((always_inline)) static inline long raw_syscall4(long n, long a, long b, long c,
                                                               long d) {
#if defined(__x86_64__)
  long ret;
  register long r10 __asm__("r10") = d;
  __asm__ volatile("syscall"
                   : "=a"(ret)
                   : "0"(n), "D"(a), "S"(b), "d"(c), "r"(r10)
                   : "rcx", "r11", "memory");
  return ret;
#elif defined(__aarch64__)
  register long x8 __asm__("x8") = n;
  register long x0 __asm__("x0") = a;
  register long x1 __asm__("x1") = b;
  register long x2 __asm__("x2") = c;
  register long x3 __asm__("x3") = d;
  __asm__ volatile("svc 0" : "+r"(x0) : "r"(x8), "r"(x1), "r"(x2), "r"(x3) : "memory");
  return x0;
#else
  return syscall(n, a, b, c, d);
#endif
}

// Clock `c` in ns (clock_gettime(2)).
static inline long long now_ns(clockid_t c) {
  struct timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// Run-queue wait (ns) of thread `tid` of this process so far, from the second field of
// /proc/self/task/<tid>/schedstat (Documentation/scheduler/sched-stats.rst); -1 if unreadable.
static inline long long runqueue_wait_ns(int tid) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/self/task/%d/schedstat", tid);
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  long long run, wait;
  int ok = fscanf(f, "%lld %lld", &run, &wait) == 2;
  fclose(f);
  return ok ? wait : -1;
}

#endif  // PARASCOPE_TEST_WORKLOADS_WORKLOAD_UTIL_H_
