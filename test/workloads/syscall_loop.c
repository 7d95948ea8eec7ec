// A process that spends most of its CPU in the kernel: it reads /dev/zero in a loop from
// read_zero_loop(), so its stacks are kernel frames (read_iter_zero, ...) above user frames.
// The read(2) system call is issued inline (x86-64 `syscall`), not through libc's read(), so the
// user stack of a sample in the kernel starts in read_zero_loop itself.
//
// usage: syscall_loop    prints "ready <pid>", loops until stdin closes (checked between reads
//                        by a non-blocking poll).
#include <fcntl.h>
#include <poll.h>
#include <sys/syscall.h>
#include <stdio.h>
#include <unistd.h>

static char buf[1 << 16];

__attribute__((noinline, noclone)) long read_zero_loop(int fd, int rounds) {
  long total = 0;
  for (int i = 0; i < rounds; i++) {
#if defined(__x86_64__)
    long ret;
    __asm__ volatile("syscall"
                     : "=a"(ret)
                     : "0"((long)SYS_read), "D"((long)fd), "S"(buf), "d"(sizeof(buf))
                     : "rcx", "r11", "memory");
    total += ret;
#else
    total += read(fd, buf, sizeof(buf));
#endif
  }
  return total;
}

int main(void) {
  int fd = open("/dev/zero", O_RDONLY);
  if (fd < 0) return 1;
  printf("ready %d\n", (int)getpid());
  fflush(stdout);
  for (;;) {
    read_zero_loop(fd, 1000);
    struct pollfd p = {.fd = 0, .events = POLLIN};
    if (poll(&p, 1, 0) > 0) break; /* stdin readable: EOF or a line means stop */
  }
  return 0;
}
