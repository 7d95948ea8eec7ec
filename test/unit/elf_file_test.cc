#include "agent/symbolize/elf_file.h"

#include <dlfcn.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
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

// The test binary's own functions, symbolized through its ELF file. Distinct bodies keep the
// linker from folding them; noinline + used keep real, addressable symbols.
extern "C" __attribute__((noinline, used)) int ps_test_target_fn(int x) {
  volatile int v = x * 31 + 7;
  return v;
}

namespace ps::test {
__attribute__((noinline, used)) int TargetFn(int x) {
  volatile int v = x ^ 0x1234;
  return v + 5;
}
}  // namespace ps::test

namespace parascope::symbolize {
namespace {

// One /proc/self/maps line (man 5 proc, /proc/pid/maps).
struct Mapping {
  uint64_t start = 0;
  uint64_t end = 0;
  uint64_t offset = 0;
  std::string path;
};

std::optional<Mapping> FindMapping(uint64_t addr) {
  std::ifstream maps("/proc/self/maps");
  std::string line;
  while (std::getline(maps, line)) {
    Mapping m;
    char perms[8] = {};
    int path_pos = 0;
    if (std::sscanf(line.c_str(), "%" SCNx64 "-%" SCNx64 " %7s %" SCNx64 " %*s %*u %n", &m.start,
                    &m.end, perms, &m.offset, &path_pos) < 4) {
      continue;
    }
    if (addr < m.start || addr >= m.end) continue;
    if (path_pos > 0) m.path = line.substr(static_cast<size_t>(path_pos));
    return m;
  }
  return std::nullopt;
}

std::unique_ptr<ElfFile> OpenOrDie(const std::string& path) {
  auto file = ElfFile::Open(path);
  INFO(path << ": " << file.status().ToString());
  REQUIRE(file.ok());
  return std::move(file).value();
}

// Maps a runtime address to the ELF virtual address of its file, as the symbolizer does:
// file offset = addr - mapping start + mapping offset, then FileOffsetToVaddr.
uint64_t RuntimeToVaddr(const ElfFile& file, uint64_t addr) {
  std::optional<Mapping> m = FindMapping(addr);
  REQUIRE(m.has_value());
  std::optional<uint64_t> vaddr = file.FileOffsetToVaddr(addr - m->start + m->offset);
  REQUIRE(vaddr.has_value());
  return *vaddr;
}

// Scans [lo, hi) for a symbol called `name` (for local symbols that dlsym cannot find).
const ElfSymbol* FindByName(const ElfFile& file, uint64_t lo, uint64_t hi,
                            const std::string& name) {
  for (uint64_t a = lo; a < hi; ++a) {
    const ElfSymbol* sym = file.Lookup(a);
    if (sym != nullptr && sym->system_name == name) return sym;
  }
  return nullptr;
}

struct DlCloser {
  void operator()(void* handle) const { dlclose(handle); }
};
using DlHandle = std::unique_ptr<void, DlCloser>;

DlHandle DlOpenOrDie(const char* path) {
  DlHandle handle(dlopen(path, RTLD_NOW | RTLD_LOCAL));
  INFO(path << ": " << (handle ? "" : dlerror()));
  REQUIRE(handle != nullptr);
  return handle;
}

uint64_t DlSymOrDie(void* handle, const char* name) {
  void* sym = dlsym(handle, name);
  INFO(name);
  REQUIRE(sym != nullptr);
  return reinterpret_cast<uintptr_t>(sym);
}

bool IsLowerHex(const std::string& s) {
  return s.find_first_not_of("0123456789abcdef") == std::string::npos;
}

TEST_CASE("ElfFile symbolizes the test binary's own functions", "[symbolize]") {
  const auto c_addr = reinterpret_cast<uintptr_t>(&ps_test_target_fn);
  const auto cc_addr = reinterpret_cast<uintptr_t>(&ps::test::TargetFn);
  std::optional<Mapping> m = FindMapping(c_addr);
  REQUIRE(m.has_value());
  REQUIRE(!m->path.empty());

  std::unique_ptr<ElfFile> exe = OpenOrDie(m->path);
  CHECK(exe->is_pie_or_dso());  // built with -fPIE -pie
  CHECK(exe->symbol_count() > 0);
  CHECK(exe->memory_bytes() > sizeof(ElfFile));

  const uint64_t c_vaddr = RuntimeToVaddr(*exe, c_addr);
  // Cross-check against the dynamic loader's load bias (first PT_LOAD at vaddr 0 for a PIE).
  Dl_info info;
  REQUIRE(dladdr(reinterpret_cast<void*>(c_addr), &info) != 0);
  CHECK(c_vaddr == c_addr - reinterpret_cast<uintptr_t>(info.dli_fbase));

  const ElfSymbol* sym = exe->Lookup(c_vaddr);
  REQUIRE(sym != nullptr);
  CHECK(sym->system_name == "ps_test_target_fn");
  CHECK(sym->name() == "ps_test_target_fn");
  CHECK(sym->start == c_vaddr);
  CHECK(sym->size > 0);
  // A pc inside the function body resolves to the same symbol.
  CHECK(exe->Lookup(c_vaddr + 1) == sym);
  CHECK(exe->Lookup(c_vaddr + sym->size - 1) == sym);
  const ElfSymbol* after = exe->Lookup(c_vaddr + sym->size);
  CHECK((after == nullptr || after != sym));

  const uint64_t cc_vaddr = RuntimeToVaddr(*exe, cc_addr);
  const ElfSymbol* cc_sym = exe->Lookup(cc_vaddr + 1);
  REQUIRE(cc_sym != nullptr);
  CHECK(cc_sym->system_name == "_ZN2ps4test8TargetFnEi");
  CHECK(cc_sym->name() == "ps::test::TargetFn(int)");
  CHECK(cc_sym->start == cc_vaddr);
}

TEST_CASE("ElfFile reads the unstripped fixture library", "[symbolize]") {
  std::unique_ptr<ElfFile> lib = OpenOrDie(PS_FIXTURE_LIB);
  CHECK(lib->is_pie_or_dso());
  CHECK(lib->has_symtab());
  CHECK(lib->build_id().size() == 40);  // SHA-1 build id from -Wl,--build-id
  CHECK(IsLowerHex(lib->build_id()));

  DlHandle handle = DlOpenOrDie(PS_FIXTURE_LIB);
  const uint64_t alpha = RuntimeToVaddr(*lib, DlSymOrDie(handle.get(), "ps_fixture_alpha"));
  const ElfSymbol* sym = lib->Lookup(alpha);
  REQUIRE(sym != nullptr);
  CHECK(sym->system_name == "ps_fixture_alpha");
  CHECK(sym->name() == "ps_fixture_alpha");

  const uint64_t gamma = RuntimeToVaddr(*lib, DlSymOrDie(handle.get(), "_ZN2ps7fixture5GammaEi"));
  sym = lib->Lookup(gamma + 2);
  REQUIRE(sym != nullptr);
  CHECK(sym->system_name == "_ZN2ps7fixture5GammaEi");
  CHECK(sym->name() == "ps::fixture::Gamma(int)");

  // Zero-size symbol (no .size directive) still covers its code.
  const uint64_t nosize = RuntimeToVaddr(*lib, DlSymOrDie(handle.get(), "ps_fixture_nosize"));
  sym = lib->Lookup(nosize);
  REQUIRE(sym != nullptr);
  CHECK(sym->name() == "ps_fixture_nosize");
  CHECK(sym->size > 0);

  // The static (local) function is only in .symtab.
  CHECK(FindByName(*lib, alpha > 4096 ? alpha - 4096 : 0, alpha + 4096, "ps_fixture_local") !=
        nullptr);

  CHECK(lib->Lookup(0) == nullptr);  // ELF header, not code
  CHECK(!lib->FileOffsetToVaddr(uint64_t{1} << 40).has_value());
}

TEST_CASE("Stripped library resolves exported functions via .dynsym", "[symbolize]") {
  std::unique_ptr<ElfFile> full = OpenOrDie(PS_FIXTURE_LIB);
  std::unique_ptr<ElfFile> stripped = OpenOrDie(PS_FIXTURE_LIB_STRIPPED);
  CHECK(!stripped->has_symtab());
  CHECK(stripped->symbol_count() > 0);
  CHECK(stripped->symbol_count() < full->symbol_count());
  CHECK(stripped->build_id().size() == 40);
  CHECK(IsLowerHex(stripped->build_id()));
  CHECK(stripped->build_id() == full->build_id());

  DlHandle handle = DlOpenOrDie(PS_FIXTURE_LIB_STRIPPED);
  const uint64_t beta_addr = DlSymOrDie(handle.get(), "ps_fixture_beta");
  Dl_info info;
  REQUIRE(dladdr(reinterpret_cast<void*>(beta_addr), &info) != 0);
  REQUIRE(info.dli_sname != nullptr);
  CHECK(std::string(info.dli_sname) == "ps_fixture_beta");

  std::optional<Mapping> m = FindMapping(beta_addr);
  REQUIRE(m.has_value());
  CHECK(std::filesystem::equivalent(m->path, PS_FIXTURE_LIB_STRIPPED));

  const uint64_t beta = RuntimeToVaddr(*stripped, beta_addr);
  CHECK(beta == beta_addr - reinterpret_cast<uintptr_t>(info.dli_fbase));
  const ElfSymbol* sym = stripped->Lookup(beta + 1);
  REQUIRE(sym != nullptr);
  CHECK(sym->system_name == "ps_fixture_beta");
  CHECK(sym->name() == "ps_fixture_beta");
  CHECK(sym->start == beta);

  const uint64_t gamma =
      RuntimeToVaddr(*stripped, DlSymOrDie(handle.get(), "_ZN2ps7fixture5GammaEi"));
  sym = stripped->Lookup(gamma);
  REQUIRE(sym != nullptr);
  CHECK(sym->name() == "ps::fixture::Gamma(int)");

  // Same layout as the unstripped file: the same vaddr names the same function in both.
  const ElfSymbol* full_sym = full->Lookup(beta);
  REQUIRE(full_sym != nullptr);
  CHECK(full_sym->name() == "ps_fixture_beta");

  // Local functions are gone with .symtab.
  CHECK(FindByName(*stripped, beta > 4096 ? beta - 4096 : 0, beta + 4096, "ps_fixture_local") ==
        nullptr);
}

TEST_CASE("ElfFile::Open reports errors", "[symbolize]") {
  auto missing = ElfFile::Open("/nonexistent/parascope/libnothing.so");
  CHECK(absl::IsNotFound(missing.status()));

  auto text = ElfFile::Open(PS_FIXTURE_DIR "/kallsyms.txt");
  CHECK(absl::IsInvalidArgument(text.status()));
  CHECK(text.status().message().find("not an ELF file") != absl::string_view::npos);

  auto dir = ElfFile::Open(PS_FIXTURE_DIR);
  CHECK(absl::IsInvalidArgument(dir.status()));

  // A truncated ELF: valid identification and header, section/program headers past EOF.
  const std::filesystem::path truncated = std::filesystem::temp_directory_path() /
                                          ("ps_elf_truncated_" + std::to_string(getpid()) + ".so");
  {
    std::ifstream in(PS_FIXTURE_LIB, std::ios::binary);
    std::string head(100, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    std::ofstream out(truncated, std::ios::binary);
    out.write(head.data(), static_cast<std::streamsize>(head.size()));
  }
  auto corrupt = ElfFile::Open(truncated.string());
  INFO(corrupt.status().ToString());
  CHECK(absl::IsInvalidArgument(corrupt.status()));
  std::filesystem::remove(truncated);
}

}  // namespace
}  // namespace parascope::symbolize
