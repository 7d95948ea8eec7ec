#include "agent/symbolize/elf_cache.h"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#ifndef PS_FIXTURE_DIR
#error "PS_FIXTURE_DIR must be defined (absolute path of test/fixtures)"
#endif
#ifndef PS_FIXTURE_LIB
#error "PS_FIXTURE_LIB must be defined (absolute path of the built fixture .so)"
#endif
#ifndef PS_FIXTURE_LIB_STRIPPED
#error "PS_FIXTURE_LIB_STRIPPED must be defined (absolute path of the stripped fixture .so)"
#endif

namespace parascope::symbolize {
namespace {

std::shared_ptr<const ElfFile> GetOrDie(ElfCache& cache, const std::string& path) {
  auto file = cache.Get(path);
  INFO(path << ": " << file.status().ToString());
  REQUIRE(file.ok());
  REQUIRE(*file != nullptr);
  return *file;
}

TEST_CASE("ElfCache serves repeated lookups from the cache", "[symbolize]") {
  ElfCache cache;
  std::shared_ptr<const ElfFile> first = GetOrDie(cache, PS_FIXTURE_LIB);
  std::shared_ptr<const ElfFile> second = GetOrDie(cache, PS_FIXTURE_LIB);
  CHECK(first == second);
  CHECK(cache.misses() == 1);
  CHECK(cache.hits() == 1);
  CHECK(cache.errors() == 0);
  CHECK(cache.size() == 1);
  CHECK(cache.bytes() >= first->memory_bytes());

  // The same file through another path (as /proc/<pid>/root/... paths are) shares the entry.
  std::shared_ptr<const ElfFile> via_root = GetOrDie(cache, "/proc/self/root" PS_FIXTURE_LIB);
  CHECK(via_root == first);
  CHECK(cache.hits() == 2);
  CHECK(cache.size() == 1);
}

TEST_CASE("ElfCache evicts to its byte bound", "[symbolize]") {
  ElfCache cache(/*max_bytes=*/1, /*max_entries=*/100);
  std::shared_ptr<const ElfFile> lib = GetOrDie(cache, PS_FIXTURE_LIB);
  CHECK(cache.size() == 1);  // the newest entry is kept even when it alone exceeds the bound
  GetOrDie(cache, PS_FIXTURE_LIB_STRIPPED);
  CHECK(cache.size() == 1);
  CHECK(cache.evictions() == 1);
  CHECK(cache.misses() == 2);

  std::shared_ptr<const ElfFile> again = GetOrDie(cache, PS_FIXTURE_LIB);
  CHECK(cache.misses() == 3);  // evicted, so reopened
  CHECK(cache.hits() == 0);
  CHECK(cache.evictions() == 2);
  CHECK(again != lib);
  // An evicted file stays valid for callers still holding it.
  CHECK(lib->build_id() == again->build_id());
  CHECK(lib->symbol_count() == again->symbol_count());
}

TEST_CASE("ElfCache evicts least recently used entries to its entry bound", "[symbolize]") {
  ElfCache cache(ElfCache::kDefaultMaxBytes, /*max_entries=*/2);
  GetOrDie(cache, PS_FIXTURE_LIB);
  GetOrDie(cache, PS_FIXTURE_LIB_STRIPPED);
  GetOrDie(cache, PS_FIXTURE_LIB);  // hit: now the most recently used
  CHECK(cache.hits() == 1);
  CHECK(!cache.Get(PS_FIXTURE_DIR "/kallsyms.txt").ok());  // third entry evicts the stripped lib
  CHECK(cache.size() == 2);
  CHECK(cache.evictions() == 1);
  GetOrDie(cache, PS_FIXTURE_LIB);
  CHECK(cache.hits() == 2);
  GetOrDie(cache, PS_FIXTURE_LIB_STRIPPED);
  CHECK(cache.misses() == 4);
}

TEST_CASE("ElfCache caches failures", "[symbolize]") {
  ElfCache cache;
  const std::string missing = "/nonexistent/parascope/libmissing.so";
  CHECK(absl::IsNotFound(cache.Get(missing).status()));
  CHECK(absl::IsNotFound(cache.Get(missing).status()));
  CHECK(cache.misses() == 1);  // opened once
  CHECK(cache.errors() == 1);
  CHECK(cache.hits() == 1);

  const std::string not_elf = PS_FIXTURE_DIR "/kallsyms.txt";
  CHECK(absl::IsInvalidArgument(cache.Get(not_elf).status()));
  CHECK(absl::IsInvalidArgument(cache.Get(not_elf).status()));
  CHECK(cache.misses() == 2);
  CHECK(cache.errors() == 2);
  CHECK(cache.hits() == 2);
  CHECK(cache.size() == 2);
}

TEST_CASE("ElfCache reopens a file that changed in place", "[symbolize]") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("ps_elf_cache_" + std::to_string(getpid()) + ".so");
  { std::ofstream(path) << "not an ELF file yet\n"; }
  ElfCache cache;
  CHECK(absl::IsInvalidArgument(cache.Get(path.string()).status()));

  // Rewrite the same inode with the fixture library's bytes (size and mtime change).
  {
    std::ifstream in(PS_FIXTURE_LIB, std::ios::binary);
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out << in.rdbuf();
  }
  auto file = cache.Get(path.string());
  INFO(file.status().ToString());
  REQUIRE(file.ok());
  CHECK((*file)->build_id().size() == 40);
  CHECK(cache.misses() == 2);
  CHECK(cache.size() == 1);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace parascope::symbolize
