// Ground truth for unwinding C++ built with g++ -O2: main calls sort_many(), which sorts a vector
// with std::sort and a lambda comparator that does some work per comparison (so most of its CPU
// is in the lambda), and throw_catch(), which throws and catches an exception in a loop (its CPU
// is in libstdc++'s __cxa_throw and libgcc_s's _Unwind_* frames, which unwind the thrower's frames
// from .eh_frame). A lambda sample's stack is the lambda -> libstdc++'s sort code (std::sort,
// std::__introsort_loop and friends: template instances compiled into this binary from
// libstdc++'s headers) -> sort_many -> main.
//
// usage: cxx_sort SECONDS
//   prints "ready <pid>", waits for a line on stdin, alternates sort_many() (~3/4 of the CPU) and
//   throw_catch() (~1/4) for SECONDS of wall time, then prints
//     done cpu_ns=C sort_cpu_ns=S throw_cpu_ns=T sorts=N throws=M
//   (CLOCK_THREAD_CPUTIME_ID: C over the phase, S and T summed around each call), then idles
//   until stdin closes.
// Built with g++ -O2 and its defaults (no frame pointers). The lambda is noinline/noclone, so it
// is a real function, "(anonymous namespace)::compare::{lambda(unsigned long, unsigned long)#1}::
// operator()(unsigned long, unsigned long) const", that libstdc++'s code calls; sort_many and
// throw_catch are noinline/noclone and use what their callees return.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <vector>

// About 9 ms of throwing per ~27 ms sort of 20000 keys: throw_catch gets ~1/4 of the CPU.
#define THROWS_PER_ROUND 6700

namespace {

volatile unsigned long sink;

long long now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

long long thread_cpu_ns() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

// The comparator: work that does not change the order (it mixes a copy of the key) and then a
// comparison of the keys' high bits.
auto compare = [](unsigned long a, unsigned long b) __attribute__((noinline, noclone)) {
  unsigned long h = a ^ sink;
  for (int i = 0; i < 60; i++) h = h * 6364136223846793005UL + 1442695040888963407UL;
  sink = h;
  return (a >> 8) < (b >> 8);
};
using Iter = std::vector<unsigned long>::iterator;
// std::sort's own instance for this comparator, called through a volatile pointer: inlined into
// sort_many, its final insertion sort (inlined with it) would call the lambda from sort_many's
// own frame, and part of the lambda's samples would have no libstdc++ frame above them. Out of
// line, every comparison is made from a libstdc++ function (std::sort itself,
// std::__introsort_loop, std::__insertion_sort, std::__adjust_heap).
void (*volatile sort_fn)(Iter, Iter, decltype(compare)) = std::sort<Iter, decltype(compare)>;

}  // namespace

// Sorts `n` pseudo-random keys; returns the smallest.
__attribute__((noinline, noclone)) unsigned long sort_many(unsigned seed, size_t n) {
  std::vector<unsigned long> v(n);
  unsigned long x = seed;
  for (auto& e : v) e = x = x * 6364136223846793005UL + 1442695040888963407UL;
  sort_fn(v.begin(), v.end(), compare);
  return v.front();
}

__attribute__((noinline, noclone)) void thrower(int i) {
  throw std::runtime_error(i % 2 ? "odd" : "even");
}

// Throws and catches `n` exceptions; returns a checksum of what it caught.
__attribute__((noinline, noclone)) unsigned long throw_catch(int n) {
  unsigned long sum = 0;
  for (int i = 0; i < n; i++) {
    try {
      thrower(i);
    } catch (const std::runtime_error& e) {
      sum += static_cast<unsigned char>(e.what()[0]);
    }
  }
  return sum;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  if (!std::fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = thread_cpu_ns(), sort_cpu = 0, throw_cpu = 0;
  long long end = now_ns() + static_cast<long long>(seconds * 1e9);
  long sorts = 0, throws = 0;
  unsigned long acc = 0;
  while (now_ns() < end) {
    long long c0 = thread_cpu_ns();
    acc += sort_many(static_cast<unsigned>(sorts), 20000);
    long long c1 = thread_cpu_ns();
    acc += throw_catch(THROWS_PER_ROUND);
    long long c2 = thread_cpu_ns();
    sort_cpu += c1 - c0;
    throw_cpu += c2 - c1;
    sorts++;
    throws += THROWS_PER_ROUND;
  }
  sink = acc;
  std::printf("done cpu_ns=%lld sort_cpu_ns=%lld throw_cpu_ns=%lld sorts=%ld throws=%ld\n",
              thread_cpu_ns() - cpu0, sort_cpu, throw_cpu, sorts, throws);
  std::fflush(stdout);
  while (std::fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
