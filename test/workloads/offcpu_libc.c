// Ground truth for off-CPU stacks through libc: the main thread blocks alternately in
// wait_poll() (libc's poll() with no fds and a 40 ms timeout) and in wait_cond() (libc's
// pthread_cond_wait(), until a helper thread signals it 10 ms after being asked), both called
// from main. So its off-CPU time splits 0.80/0.20 between the two functions (40 ms : 10 ms plus
// the same small wake-up latency each), all of it in TASK_INTERRUPTIBLE ("sleeping"), and each
// stack at the switch is kernel frames -> libc (poll, or pthread_cond_wait's futex wait) ->
// wait_poll|wait_cond -> main.
//
// usage: offcpu_libc SECONDS
//   prints "ready <pid>", waits for a line on stdin, starts the helper, alternates for SECONDS
//   of wall time, stops the helper, then prints
//     done tid=T helper_tid=H poll_ns=P cond_ns=C rounds=R
//   (T is the main thread; P and C are CLOCK_MONOTONIC sums around each wait_poll() and each
//   wait_cond() call), then idles until stdin closes.
// Built with gcc -O2 and its defaults (no frame pointers): the waits go through glibc's own
// wrappers, which are leaves without a frame pointer.
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "workload_util.h"

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t to_helper = PTHREAD_COND_INITIALIZER;
static pthread_cond_t to_main = PTHREAD_COND_INITIALIZER;
static long requests, answers;  // guarded by mu
static int stop;                // guarded by mu
static int helper_tid;

__attribute__((noinline, noclone)) int wait_poll(void) { return poll(NULL, 0, 40) + 1; }

// Asks the helper to signal in 10 ms and waits for it in pthread_cond_wait.
__attribute__((noinline, noclone)) long wait_cond(void) {
  pthread_mutex_lock(&mu);
  long want = ++requests;
  pthread_cond_signal(&to_helper);
  while (answers < want) pthread_cond_wait(&to_main, &mu);
  pthread_mutex_unlock(&mu);
  return want;
}

static void* helper(void* arg) {
  (void)arg;
  helper_tid = (int)syscall(SYS_gettid);
  long served = 0;
  pthread_mutex_lock(&mu);
  for (;;) {
    while (requests == served && !stop) pthread_cond_wait(&to_helper, &mu);
    if (requests == served) break;  // stop, nothing pending
    served = requests;
    pthread_mutex_unlock(&mu);
    struct timespec ts = {0, 10 * 1000 * 1000};
    nanosleep(&ts, NULL);
    pthread_mutex_lock(&mu);
    answers = served;
    pthread_cond_signal(&to_main);
  }
  pthread_mutex_unlock(&mu);
  return NULL;
}

int main(int argc, char** argv) {
  double seconds = argc > 1 ? atof(argv[1]) : 4.0;
  char line[64];
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  if (!fgets(line, sizeof(line), stdin)) return 1;
  pthread_t h;
  pthread_create(&h, NULL, helper, NULL);
  pthread_setname_np(h, "libc_helper");
  long long poll_ns = 0, cond_ns = 0;
  long rounds = 0;
  long long end = now_ns(CLOCK_MONOTONIC) + (long long)(seconds * 1e9);
  while (now_ns(CLOCK_MONOTONIC) < end) {
    long long t0 = now_ns(CLOCK_MONOTONIC);
    if (wait_poll() != 1) abort();
    long long t1 = now_ns(CLOCK_MONOTONIC);
    if (wait_cond() != rounds + 1) abort();
    long long t2 = now_ns(CLOCK_MONOTONIC);
    poll_ns += t1 - t0;
    cond_ns += t2 - t1;
    rounds++;
  }
  pthread_mutex_lock(&mu);
  stop = 1;
  pthread_cond_signal(&to_helper);
  pthread_mutex_unlock(&mu);
  pthread_join(h, NULL);
  printf("done tid=%d helper_tid=%d poll_ns=%lld cond_ns=%lld rounds=%ld\n", (int)getpid(),
         helper_tid, poll_ns, cond_ns, rounds);
  fflush(stdout);
  while (fgets(line, sizeof(line), stdin)) {
  }
  return 0;
}
