#include "agent/symbolize/kallsyms.h"

#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/str_cat.h"

#ifndef PS_FIXTURE_DIR
#error "PS_FIXTURE_DIR must be defined (absolute path of test/fixtures)"
#endif

namespace parascope::symbolize {
namespace {

Kallsyms LoadFixture() {
  auto syms = Kallsyms::Load(PS_FIXTURE_DIR "/kallsyms.txt");
  INFO(syms.status().ToString());
  REQUIRE(syms.ok());
  return std::move(syms).value();
}

std::string NameAt(const Kallsyms& syms, uint64_t addr) {
  std::optional<KernelSymbol> sym = syms.Lookup(addr);
  return sym ? std::string(sym->name) : "<null>";
}

TEST_CASE("Kallsyms keeps sorted text symbols only", "[symbolize]") {
  Kallsyms syms = LoadFixture();
  // 16 lines: 11 text symbols, one address shared by two of them -> 10; A/D/r/d/b dropped.
  CHECK(syms.size() == 10);
  CHECK(syms.min_address() == 0xffffffff81000000);
  CHECK(syms.max_address() == 0xffffffffc0b00400);
  CHECK(NameAt(syms, 0xffffffff82000000) == "<null>");  // jiffies_data (D) is past _etext
}

TEST_CASE("Kallsyms lookups at, between and beyond symbols", "[symbolize]") {
  Kallsyms syms = LoadFixture();
  // At a symbol; the global name wins over a local alias at the same address.
  CHECK(NameAt(syms, 0xffffffff81000000) == "_stext");
  CHECK(NameAt(syms, 0xffffffff81001000) == "do_one_initcall");
  // Between symbols.
  CHECK(NameAt(syms, 0xffffffff81000fff) == "_stext");
  CHECK(NameAt(syms, 0xffffffff81001abc) == "do_one_initcall");
  CHECK(NameAt(syms, 0xffffffff81002100) == "local_text_fn");
  // Weak symbols (w, W) are text; the rodata symbol (r) is ignored.
  CHECK(NameAt(syms, 0xffffffff81002400) == "weak_local_fn");
  CHECK(NameAt(syms, 0xffffffff81002900) == "weak_local_fn");
  CHECK(NameAt(syms, 0xffffffff81003010) == "weak_text_fn");
  // Below the first symbol.
  CHECK(NameAt(syms, 0) == "<null>");
  CHECK(NameAt(syms, 0xffffffff80ffffff) == "<null>");
  // At or past _etext, and in the gap between vmlinux and the module area.
  CHECK(NameAt(syms, 0xffffffff81004000) == "<null>");
  CHECK(NameAt(syms, 0xffffffff81004010) == "<null>");
  CHECK(NameAt(syms, 0xffffffffa0000000) == "<null>");
  // Beyond the last symbol: close is fine, a sane bound is not.
  CHECK(NameAt(syms, 0xffffffffc0b00400 + 0x100) == "bpf_prog_6deef7357e7b4530_handler");
  CHECK(NameAt(syms, 0xffffffffc0b00400 + Kallsyms::kMaxSymbolSpan) == "<null>");
  CHECK(NameAt(syms, ~uint64_t{0}) == "<null>");
}

TEST_CASE("Kallsyms module names", "[symbolize]") {
  Kallsyms syms = LoadFixture();
  std::optional<KernelSymbol> sym = syms.Lookup(0xffffffffc0a01900);
  REQUIRE(sym.has_value());
  CHECK(sym->name == "nvme_submit_cmd");
  CHECK(sym->module == "nvme");
  CHECK(sym->address == 0xffffffffc0a01800);

  sym = syms.Lookup(0xffffffffc0a01000);
  REQUIRE(sym.has_value());
  CHECK(sym->name == "nvme_probe");
  CHECK(sym->module == "nvme");

  sym = syms.Lookup(0xffffffffc0b00010);
  REQUIRE(sym.has_value());
  CHECK(sym->name == "xfs_iget");
  CHECK(sym->module == "xfs");

  sym = syms.Lookup(0xffffffffc0b00400);
  REQUIRE(sym.has_value());
  CHECK(sym->module == "bpf");

  sym = syms.Lookup(0xffffffff81001000);
  REQUIRE(sym.has_value());
  CHECK(sym->module.empty());
}

TEST_CASE("Kallsyms::Parse rejects malformed lines naming the line", "[symbolize]") {
  auto bad_addr = Kallsyms::Parse("ffffffff81000000 T _stext\nzzzz T foo\n");
  CHECK(absl::IsInvalidArgument(bad_addr.status()));
  CHECK(bad_addr.status().message().find("line 2") != absl::string_view::npos);

  auto missing_name = Kallsyms::Parse("\nffffffff81000000 T\n");
  CHECK(absl::IsInvalidArgument(missing_name.status()));
  CHECK(missing_name.status().message().find("line 2") != absl::string_view::npos);

  auto bad_type = Kallsyms::Parse("ffffffff81000000 TT _stext\n");
  CHECK(absl::IsInvalidArgument(bad_type.status()));

  auto bad_module = Kallsyms::Parse("ffffffffc0a01000 t nvme_probe\tnvme\n");
  CHECK(absl::IsInvalidArgument(bad_module.status()));

  auto too_long = Kallsyms::Parse("1ffffffff81000000 T _stext\n");
  CHECK(absl::IsInvalidArgument(too_long.status()));

  auto no_text = Kallsyms::Parse("ffffffff82000000 D jiffies\n");
  CHECK(absl::IsInvalidArgument(no_text.status()));

  CHECK(absl::IsInvalidArgument(Kallsyms::Parse("").status()));
}

TEST_CASE("Kallsyms::Parse accepts blank lines and CRLF", "[symbolize]") {
  auto syms = Kallsyms::Parse("\nffffffff81000000 T _stext\r\n\nffffffff81000100 t foo\t[mod]\r\n");
  REQUIRE(syms.ok());
  CHECK(syms->size() == 2);
  std::optional<KernelSymbol> sym = syms->Lookup(0xffffffff81000101);
  REQUIRE(sym.has_value());
  CHECK(sym->name == "foo");
  CHECK(sym->module == "mod");
}

// Names are kept compressed in blocks of 64 (kallsyms.h): every symbol of a table spanning
// several blocks, with module runs and _etext inside a block, reads back its own name and module.
TEST_CASE("Kallsyms names and modules read back across compressed blocks", "[symbolize]") {
  std::string text;
  constexpr int kSymbols = 300;
  auto module_of = [](int i) -> std::string {
    if (i < 150) return "";
    return i < 200 ? "nvme" : (i < 210 ? "bpf" : "xfs");
  };
  for (int i = 0; i < kSymbols; ++i) {
    const uint64_t addr = 0xffffffff81000000 + uint64_t(i) * 0x100;
    const std::string name = i == 100 ? "_etext" : absl::StrCat("function_number_", i, "_name");
    const std::string module = module_of(i);
    absl::StrAppend(&text, absl::Hex(addr, absl::kZeroPad16), i % 2 ? " t " : " T ", name,
                    module.empty() ? "" : absl::StrCat("\t[", module, "]"), "\n");
  }
  auto syms = Kallsyms::Parse(text);
  REQUIRE(syms.ok());
  REQUIRE(syms->size() == kSymbols);
  for (int i = 0; i < kSymbols; ++i) {
    const uint64_t addr = 0xffffffff81000000 + uint64_t(i) * 0x100 + 0x10;
    std::optional<KernelSymbol> sym = syms->Lookup(addr);
    if (i == 100) {
      CHECK_FALSE(sym.has_value());  // past _etext
      continue;
    }
    REQUIRE(sym.has_value());
    CHECK(sym->address == addr - 0x10);
    CHECK(sym->name == absl::StrCat("function_number_", i, "_name"));
    CHECK(sym->module == module_of(i));
  }
  // 300 names of 22-24 bytes: compressed, not stored.
  CHECK(syms->memory_bytes() < kSymbols * (8 + 23));
}

TEST_CASE("Kallsyms with all-zero addresses is FailedPrecondition", "[symbolize]") {
  auto syms = Kallsyms::Parse(
      "0000000000000000 T _stext\n"
      "0000000000000000 t do_one_initcall\n"
      "0000000000000000 t nvme_probe\t[nvme]\n");
  CHECK(absl::IsFailedPrecondition(syms.status()));
  CHECK(syms.status().message().find("CAP_SYSLOG") != absl::string_view::npos);
}

TEST_CASE("Kallsyms::Load errors and the live file", "[symbolize]") {
  CHECK(absl::IsNotFound(Kallsyms::Load("/nonexistent/parascope/kallsyms").status()));

  // The host's own table: readable without privileges, but possibly hidden by kptr_restrict.
  auto live = Kallsyms::Load();
  if (live.ok()) {
    CHECK(live->size() > 0);
    CHECK(live->Lookup(live->min_address()).has_value());
  } else {
    WARN("live /proc/kallsyms not usable: " << live.status().ToString());
    CHECK((absl::IsFailedPrecondition(live.status()) || absl::IsNotFound(live.status()) ||
           absl::IsPermissionDenied(live.status())));
  }
}

}  // namespace
}  // namespace parascope::symbolize
