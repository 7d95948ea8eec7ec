#include "agent/symbolize/stack_symbolizer.h"

#include <catch2/catch.hpp>

#include <cstdlib>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace parascope
