// Ground truth for demangling template-heavy C++ built with g++ -O2 -g (no frame pointers): every
// hot function is a template instance, a lambda, an operator or a std::function target, and each
// one does its own work (no callees in its loop), so a sample in it has it as its leaf frame. The
// hot functions are noinline/noclone/no_icf: -O2 keeps each a real function under its own
// mangled name (no ".constprop"/".isra" clones, no identical-code folding of one instance into
// another).
//
// usage: cxx_templates SECONDS
//   prints "ready <pid>", waits for a line on stdin, runs rounds of the work below for SECONDS of
//   wall time, then prints
//     done rounds=R cpu_ns=C box_int_ns=I box_double_ns=D map_ns=M lambda_ns=L op_ns=O
//          variadic_ns=V function_ns=F
//   (CLOCK_THREAD_CPUTIME_ID: C over the phase, the others summed around each part's calls),
//   then idles until stdin closes.
//
// Each round runs:
//   - ps::Box<int>::Accumulate<long> for kBoxIters iterations and ps::Box<double>::
//     Accumulate<double> for 2 * kBoxIters: two instances of one member function template of a
//     class template whose loops are the same code, so their CPU splits 1:2 (measured on a
//     busy 2-CPU machine: 0.31-0.33 of the pair's CPU in Box<int>'s; the "done" line says);
//   - ps::SumValues<std::map<std::string, std::vector<int>>>: a function template over a map;
//   - a lambda passed to std::for_each (a template algorithm);
//   - ps::operator*(ps::Mat4 const&, ps::Mat4 const&): an operator overload;
//   - ps::Mix<int, long, unsigned int>: a variadic template with a fold expression;
//   - a lambda stored in a std::function and called through it.
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <vector>

#define PS_HOT __attribute__((noinline, noclone, no_icf))

namespace {

// Iterations of Box<int>::Accumulate per round (Box<double>::Accumulate gets twice as many).
constexpr long kBoxIters = 2000000;

volatile unsigned long sink;
volatile long box_iters = kBoxIters;  // volatile: no constant propagation into the instances

long long now_ns(clockid_t c) {
  timespec ts;
  clock_gettime(c, &ts);
  return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

}  // namespace

namespace ps {

// A class template with a member function template.
template <typename T>
class Box {
 public:
  explicit Box(T seed) : seed_(seed) {}
  // Runs `n` steps of a 64-bit LCG seeded from the box and returns how many steps had the top
  // bit set, as a U. The loop is the same machine code in every instance (T and U are converted
  // only before and after it), so an instance's CPU is proportional to `n`.
  template <typename U>
  PS_HOT U Accumulate(U n) const;

 private:
  T seed_;
};

template <typename T>
template <typename U>
U Box<T>::Accumulate(U n) const {
  unsigned long h = static_cast<unsigned long>(seed_) ^ sink, ones = 0;
  const long steps = static_cast<long>(n);
  for (long i = 0; i < steps; i++) {
    h = h * 6364136223846793005UL + 1442695040888963407UL;
    ones += h >> 63;
  }
  sink = h;
  return static_cast<U>(ones);
}

// A function template over any map of sequences: the sum of every element, mixed.
template <typename M>
PS_HOT long SumValues(const M& m, int passes) {
  unsigned long h = sink;
  for (int p = 0; p < passes; p++) {
    for (const auto& [key, values] : m) {
      h ^= key.size();
      for (int v : values) h = h * 31 + static_cast<unsigned long>(v);
    }
  }
  return static_cast<long>(h);
}

// A 4x4 matrix with an operator overload.
struct Mat4 {
  double m[4][4];
};

PS_HOT Mat4 operator*(const Mat4& a, const Mat4& b) {
  Mat4 r;
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < 4; j++) {
      double s = 0;
      for (int k = 0; k < 4; k++) s += a.m[i][k] * b.m[k][j];
      r.m[i][j] = s;
    }
  }
  return r;
}

// A variadic template: `rounds` rounds of mixing every argument into a hash (a fold expression).
template <typename... Ts>
PS_HOT unsigned long Mix(long rounds, Ts... args) {
  unsigned long h = sink;
  for (long r = 0; r < rounds; r++) {
    ((h = (h ^ static_cast<unsigned long>(args)) * 1099511628211UL), ...);
  }
  return h;
}

}  // namespace ps

namespace {

// One round's parts; each returns something main folds into `sink`.
struct Parts {
  std::map<std::string, std::vector<int>> map;
  std::vector<unsigned long> items;
  ps::Mat4 mat;
  std::function<unsigned long(unsigned long)> fn;
};

PS_HOT unsigned long RunLambda(const std::vector<unsigned long>& items) {
  unsigned long acc = 0;
  std::for_each(items.begin(), items.end(), [&acc](unsigned long x) PS_HOT {
    unsigned long h = x ^ acc;
    for (int i = 0; i < 40; i++) h = h * 6364136223846793005UL + 1442695040888963407UL;
    acc += h >> 32;
  });
  return acc;
}

PS_HOT double RunOperator(const ps::Mat4& m, int n) {
  ps::Mat4 r = m;
  for (int i = 0; i < n; i++) r = r * m;
  return r.m[0][0];
}

PS_HOT unsigned long RunFunction(const std::function<unsigned long(unsigned long)>& f, int n) {
  unsigned long acc = 0;
  for (int i = 0; i < n; i++) acc += f(acc + static_cast<unsigned long>(i));
  return acc;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  Parts parts;
  for (int k = 0; k < 64; k++) {
    std::vector<int>& v = parts.map["key" + std::to_string(k * 7919)];
    for (int i = 0; i < 256; i++) v.push_back(i * k);
  }
  for (int i = 0; i < 32768; i++)
    parts.items.push_back(static_cast<unsigned long>(i) * 2654435761UL);
  for (int i = 0; i < 4; i++) {
    for (int j = 0; j < 4; j++) parts.mat.m[i][j] = (i == j ? 0.5 : 0.125) + 0.01 * (i + j);
  }
  parts.fn = [](unsigned long x) PS_HOT {
    unsigned long h = x;
    for (int i = 0; i < 30; i++) h = (h ^ (h >> 29)) * 0xbf58476d1ce4e5b9UL;
    return h;
  };
  ps::Box<int> box_int(7);
  ps::Box<double> box_double(11.0);

  char line[64];
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  if (!std::fgets(line, sizeof(line), stdin)) return 1;
  long long cpu0 = now_ns(CLOCK_THREAD_CPUTIME_ID);
  long long end = now_ns(CLOCK_MONOTONIC) + static_cast<long long>(seconds * 1e9);
  long long t[7] = {};
  long rounds = 0;
  double dacc = 0;
  unsigned long acc = 0;
  while (now_ns(CLOCK_MONOTONIC) < end) {
    long long c[8];
    c[0] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    acc += static_cast<unsigned long>(box_int.Accumulate<long>(box_iters));
    c[1] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    dacc += box_double.Accumulate<double>(2.0 * static_cast<double>(box_iters));
    c[2] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    acc += static_cast<unsigned long>(ps::SumValues(parts.map, 110));
    c[3] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    acc += RunLambda(parts.items);
    c[4] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    dacc += RunOperator(parts.mat, 60000);
    c[5] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    acc += ps::Mix(500000, 3, 5L, 7U);
    c[6] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    acc += RunFunction(parts.fn, 40000);
    c[7] = now_ns(CLOCK_THREAD_CPUTIME_ID);
    for (int i = 0; i < 7; i++) t[i] += c[i + 1] - c[i];
    rounds++;
  }
  sink = acc + static_cast<unsigned long>(dacc);
  std::printf(
      "done rounds=%ld cpu_ns=%lld box_int_ns=%lld box_double_ns=%lld map_ns=%lld lambda_ns=%lld "
      "op_ns=%lld variadic_ns=%lld function_ns=%lld\n",
      rounds, now_ns(CLOCK_THREAD_CPUTIME_ID) - cpu0, t[0], t[1], t[2], t[3], t[4], t[5], t[6]);
  std::fflush(stdout);
  while (std::fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
