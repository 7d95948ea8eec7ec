// Helpers shared by the libFuzzer targets (test/fuzz/README.md).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace parascope::fuzz {

// A failed invariant: print it and abort, which libFuzzer reports as a crash (and saves the
// input as an artifact).
[[noreturn]] inline void Fail(const char* file, int line, const char* what) {
  std::fprintf(stderr, "%s:%d: fuzz invariant failed: %s\n", file, line, what);
  std::abort();
}
#define PS_FUZZ_CHECK(cond) \
  do {                      \
    if (!(cond)) ::parascope::fuzz::Fail(__FILE__, __LINE__, #cond); \
  } while (0)

// One memfd (memfd_create(2)) reused across inputs: the file-reading parsers take a path, and
// /proc/self/fd/<n> of a memfd is a regular file whose content is exactly the input, without
// touching the disk.
class MemFile {
 public:
  explicit MemFile(const char* name) : fd_(memfd_create(name, MFD_CLOEXEC)) {
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the content with [data, data + size).
  void Set(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) Die("ftruncate");
    Append(data, size, 0);
  }
  // Writes [data, data + size) at byte `at` (the file grows as needed).
  void Append(const uint8_t* data, size_t size, size_t at) {
    size_t done = 0;
    while (done < size) {
      ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(at + done));
      if (n <= 0) Die("pwrite");
      done += static_cast<size_t>(n);
    }
  }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  [[noreturn]] static void Die(const char* what) {
    std::perror(what);
    std::abort();
  }
  int fd_;
  std::string path_;
};

// Little-endian u64 at `off` of the input (missing bytes read as 0).
inline uint64_t Le64(const uint8_t* data, size_t size, size_t off) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8 && off + i < size; ++i) v |= uint64_t{data[off + i]} << (8 * i);
  return v;
}

}  // namespace parascope::fuzz
