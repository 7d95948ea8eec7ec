#include "agent/symbolize/stack_symbolizer.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/symbolize/elf_file.h"

// Two functions of this binary (built with -g) whose source lines come only from DWARF.
extern "C" __attribute__((noinline)) int ps_dwarf_reopen_a(int x) {
  __asm__ volatile("" ::: "memory");
  return x * 3 + 1;
}
extern "C" __attribute__((noinline)) int ps_dwarf_reopen_b(int x) {
  __asm__ volatile("" ::: "memory");
  return x * 5 + 2;
}

namespace parascope {
namespace {

// A kallsyms file whose table changes as a BPF program is loaded: the refresh notices the new
// /proc/modules text (here a fixture) and reloads, so an address in the new program is named by
// it instead of by its neighbour in the old table.
TEST_CASE("kernel symbols: the table is reloaded when modules change", "[symbolize]") {
  char dir_template[] = "/tmp/parascope_ksyms_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string dir = dir_template;
  const std::string ksyms = dir + "/kallsyms", modules = dir + "/modules";
  std::ofstream(ksyms) << "ffffffff81000000 T _stext\n"
                          "ffffffff81000100 T schedule\n"
                          "ffffffffc0001000 t bpf_prog_aaaa_old\t[bpf]\n";
  std::ofstream(modules) << "nvme 49152 2 - Live 0x0000000000000000\n";
  auto first = symbolize::Kallsyms::Load(ksyms);
  REQUIRE(first.ok());
  proc::ProcessTable processes;
  symbolize::ElfCache elfs;
  StackSymbolizer symbolizer(&processes, &elfs, &*first);
  symbolizer.EnableKallsymsRefresh(ksyms, modules, /*min_interval_ns=*/0);
  auto name = [&](uint64_t ip) {
    symbolize::Frame f = symbolizer.KernelFrame(ip, /*leaf=*/true);
    return f.lines == nullptr || f.lines->empty() ? std::string() : f.lines->front().name;
  };
  const uint64_t new_prog = 0xffffffffc0002010;
  CHECK(name(new_prog) == "bpf_prog_aaaa_old");  // the stale table names a neighbour
  // Nothing changed: no reload.
  symbolizer.EndWindow();
  CHECK(symbolizer.kallsyms_reloads() == 0);
  std::ofstream(ksyms) << "ffffffff81000000 T _stext\n"
                          "ffffffff81000100 T schedule\n"
                          "ffffffffc0001000 t bpf_prog_aaaa_old\t[bpf]\n"
                          "ffffffffc0002000 t bpf_prog_bbbb_new\t[bpf]\n";
  std::ofstream(modules) << "nvme 49152 2 - Live 0x0000000000000000\n"
                            "dummy 16384 0 - Live 0x0000000000000000\n";
  symbolizer.EndWindow();
  CHECK(symbolizer.kallsyms_reloads() == 1);
  CHECK(name(new_prog) == "bpf_prog_bbbb_new");
  CHECK(name(0xffffffff81000104) == "schedule");
  // A reload that fails keeps the symbols it had.
  std::ofstream(ksyms) << "not kallsyms\n";
  std::ofstream(modules) << "changed again\n";
  symbolizer.EndWindow();
  CHECK(symbolizer.kallsyms_reloads() == 1);
  CHECK(name(new_prog) == "bpf_prog_bbbb_new");
  std::system(("rm -rf " + dir).c_str());
}

TEST_CASE("DWARF: a closed debug file is reopened only when the bucket pays twice its opening",
          "[symbolize]") {
  using R = StackSymbolizer;
  // Unknown cost (never opened): any tokens will do.
  CHECK(R::MayReopenDwarf(1, 250, 0));
  CHECK_FALSE(R::MayReopenDwarf(0, 250, 0));
  // Twice the last opening.
  CHECK(R::MayReopenDwarf(80, 250, 40));
  CHECK_FALSE(R::MayReopenDwarf(79, 250, 40));
  // An opening dearer than half the burst waits for a full bucket.
  CHECK(R::MayReopenDwarf(250, 250, 200));
  CHECK_FALSE(R::MayReopenDwarf(249, 250, 200));
  // Deferred as long as the refill takes for twice its opening (2 x 200 ms at 2 ms/s: 200 s):
  // any tokens will do, the bucket goes into debt.
  const int64_t ms = 1000000, s = 1000000000;
  CHECK_FALSE(R::MayReopenDwarf(1, 250 * ms, 200 * ms, 199 * s, 2 * ms));
  CHECK(R::MayReopenDwarf(1, 250 * ms, 200 * ms, 200 * s, 2 * ms));
  CHECK_FALSE(R::MayReopenDwarf(0, 250 * ms, 200 * ms, 1000 * s, 2 * ms));
  CHECK_FALSE(R::MayReopenDwarf(1, 250 * ms, 200 * ms, 1000 * s, 0));  // no refill: never

  // And in use: this binary's debug sections are opened for one address, closed at the window's
  // end (DwarfCache::EndWindow), and reopened for a new address in the next window, whose line
  // then comes from DWARF.
  auto text = proc::ReadFileToString("/proc/self/stat");
  REQUIRE(text.ok());
  auto st = proc::ParseStat(*text);
  REQUIRE(st.ok());
  const proc::ProcessKey self{static_cast<uint32_t>(st->pid),
                              proc::TicksToNs(st->start_time_ticks)};
  auto kallsyms = symbolize::Kallsyms::Load(std::string(PS_FIXTURE_DIR) + "/kallsyms.txt");
  REQUIRE(kallsyms.ok());
  proc::ProcessTable processes;
  symbolize::ElfCache elfs;
  symbolize::DwarfCache dwarf;
  StackSymbolizer symbolizer(&processes, &elfs, &*kallsyms);
  symbolizer.SetDwarf(&dwarf, /*burst_ns=*/int64_t{60} * 1000000000, nullptr, /*refill=*/0);
  auto line_of = [&](const void* fn) {
    symbolize::Frame f = symbolizer.UserFrame(self, reinterpret_cast<uint64_t>(fn) + 1, true);
    return f.lines == nullptr || f.lines->empty() ? int64_t{-1} : f.lines->front().line;
  };
  REQUIRE(ps_dwarf_reopen_a(1) == 4);
  REQUIRE(ps_dwarf_reopen_b(1) == 7);
  CHECK(line_of(reinterpret_cast<const void*>(&ps_dwarf_reopen_a)) > 0);
  auto exe = symbolize::ElfFile::Open("/proc/self/exe");
  REQUIRE(exe.ok());
  REQUIRE_FALSE((*exe)->build_id().empty());
  const std::string key = "b:" + (*exe)->build_id();
  std::shared_ptr<symbolize::DwarfFile> f = dwarf.Get(key, "/proc/self/exe", "", "");
  REQUIRE(f != nullptr);
  CHECK(f->open_cost_ns() > 0);
  CHECK_FALSE(f->closed());
  symbolizer.EndWindow();
  CHECK(f->closed());
  CHECK(line_of(reinterpret_cast<const void*>(&ps_dwarf_reopen_b)) > 0);
  CHECK_FALSE(f->closed());
  CHECK(symbolizer.stats().dwarf_deferred == 0);
}

}  // namespace
}  // namespace parascope
