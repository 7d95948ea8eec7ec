// Seed ELF for the fuzzers: a tiny static non-PIE executable (ET_EXEC) without libc, so its
// .eh_frame, .symtab and build-id note are a few hundred bytes. Built by test/fuzz/CMakeLists.txt
// (never committed as a binary) and never run.
__attribute__((noinline, used)) static long ps_seed_work(long x) {
  volatile long v = x * 3 + 1;
  return v;
}

__attribute__((noreturn, used)) void _start(void) {
  long code = ps_seed_work(4) & 0;
  __asm__ volatile("syscall" : : "a"(60L), "D"(code) : "rcx", "r11", "memory");  // exit(2)
  __builtin_unreachable();
}
