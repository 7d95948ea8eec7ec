// Inputs the fuzzers found crashes with (test/fuzz/README.md), kept under
// test/fixtures/fuzz/<target>/: every file goes through the parser its fuzz target feeds, the way
// the target feeds it, and must give an error status or a result that keeps the parser's
// documented invariants, never a crash. The fuzz:<target> tests replay the same files under
// ASan/UBSan, which also see undefined behaviour this plain build cannot; the cases below each found
// crash check what this build can see of its fix.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "agent/proc/maps.h"
#include "agent/proc/stat.h"
#include "agent/symbolize/elf_file.h"
#include "agent/symbolize/kallsyms.h"
#include "agent/symbolize/perf_map.h"
#include "agent/unwind/cfi.h"

namespace parascope {
namespace {

const std::string kFuzzFixtures = std::string(PS_FIXTURE_DIR) + "/fuzz";

std::vector<uint8_t> ReadBytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(f)), {});
}

std::vector<std::string> FixtureFiles(const std::string& target) {
  std::vector<std::string> out;
  const std::filesystem::path dir = kFuzzFixtures + "/" + target;
  if (!std::filesystem::is_directory(dir)) return out;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.is_regular_file()) out.push_back(e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

// The contract the BPF walker relies on (agent/unwind/cfi.h, UnwindTable).
void CheckTable(const unwind::UnwindTable& t) {
  REQUIRE(!t.rows.empty());
  for (size_t i = 1; i < t.rows.size(); ++i) REQUIRE(t.rows[i - 1].pc < t.rows[i].pc);
  CHECK(t.rows.back().cfa_rule == PS_CFA_NONE);
  CHECK(t.rows.size() <= PS_UNWIND_MAX_TABLE_ROWS);
}

// fuzz_cfi's input format (test/fuzz/fuzz_cfi.cc): a whole ELF image, or a raw section after a
// 5-byte header (flags: bit 0 .debug_frame, bit 1 both dialects; u32 vaddr).
absl::StatusOr<unwind::UnwindTable> BuildFromFuzzInput(const std::vector<uint8_t>& in) {
  if (in.size() >= 4 && std::memcmp(in.data(), "\x7f" "ELF", 4) == 0) {
    return unwind::BuildTableFromMemory(in.data(), in.size());
  }
  if (in.size() < 5) return absl::InvalidArgumentError("short input");
  uint64_t vaddr = 0;
  for (int i = 0; i < 4; ++i) vaddr |= uint64_t{in[1 + i]} << (8 * i);
  const std::vector<uint8_t> bytes(in.begin() + 5, in.end());
  std::vector<unwind::CfiSection> sections{{bytes, vaddr, (in[0] & 1) != 0}};
  if (in[0] & 2) sections.push_back({bytes, vaddr, (in[0] & 1) == 0});
  return unwind::BuildTable(sections);
}

// Little helpers to assemble .eh_frame bytes (as in cfi_test.cc).
void U32(std::vector<uint8_t>* b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b->push_back(static_cast<uint8_t>(v >> (8 * i)));
}
void Uleb(std::vector<uint8_t>* b, uint64_t v) {
  do {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    b->push_back(byte | (v ? 0x80 : 0));
  } while (v);
}
void Entry(std::vector<uint8_t>* sec, std::vector<uint8_t> body) {
  while ((body.size() + 4) % 8) body.push_back(0);  // DW_CFA_nop padding
  U32(sec, static_cast<uint32_t>(body.size()));
  sec->insert(sec->end(), body.begin(), body.end());
}
// GCC's x86-64 CIE at offset 0 (code align 1, data align -8, RA r16, pcrel|sdata4, CFA rsp+8, RA
// at CFA-8) and one FDE for [0x1000, 0x1000 + len) with `insns`, section at vaddr 0.
std::vector<uint8_t> OneFde(uint32_t len, const std::vector<uint8_t>& insns) {
  std::vector<uint8_t> sec;
  Entry(&sec, {0, 0, 0, 0, 1, 'z', 'R', 0, 1, 0x78, 16, 1, 0x1b, 0x0c, 0x07, 0x08, 0x90, 0x01});
  std::vector<uint8_t> fde;
  const uint32_t at = static_cast<uint32_t>(sec.size());
  U32(&fde, at + 4);                 // CIE pointer
  U32(&fde, 0x1000 - (at + 8));      // pc_begin, pcrel
  U32(&fde, len);                    // pc_range
  fde.push_back(0);                  // augmentation data length
  fde.insert(fde.end(), insns.begin(), insns.end());
  Entry(&sec, fde);
  return sec;
}

}  // namespace

TEST_CASE("fuzz fixtures: every saved crash input is an error or a valid result", "[fuzz]") {
  for (const std::string& path : FixtureFiles("cfi")) {
    DYNAMIC_SECTION("cfi " << path) {
      auto t = BuildFromFuzzInput(ReadBytes(path));
      if (t.ok()) CheckTable(*t);
    }
  }
  for (const std::string& path : FixtureFiles("elf")) {
    DYNAMIC_SECTION("elf " << path) {
      auto elf = symbolize::ElfFile::Open(path);
      if (elf.ok()) (void)(*elf)->Lookup(0);
    }
  }
  for (const std::string& path : FixtureFiles("proc")) {
    DYNAMIC_SECTION("proc " << path) {
      const std::vector<uint8_t> in = ReadBytes(path);
      const absl::string_view text(reinterpret_cast<const char*>(in.data()), in.size());
      if (auto maps = proc::ParseMaps(text); maps.ok()) {
        for (const auto& e : *maps) CHECK(e.start < e.end);
      }
      (void)proc::ParseStat(text);
      (void)symbolize::Kallsyms::Parse(text);
    }
  }
  for (const std::string& path : FixtureFiles("perf_map")) {
    DYNAMIC_SECTION("perf_map " << path) {
      const std::vector<uint8_t> in = ReadBytes(path);
      const absl::string_view text(reinterpret_cast<const char*>(in.data()), in.size());
      std::vector<symbolize::PerfMapSymbol> syms;
      symbolize::PerfMapParseStats stats;
      const size_t used = symbolize::ParsePerfMapLines(text, &syms, &stats);
      CHECK(used <= in.size());
      CHECK((used == 0 || in[used - 1] == '\n'));
    }
  }
}

// fuzz_cfi, rows-out-of-order-loc-wrap: DW_CFA_set_loc to near 2^64, then advance_loc wrapped
// the location around to below the FDE's start, and rows came out of pc order (the walker
// binary-searches them). A location past 2^64 now stays past the FDE's end.
TEST_CASE("fuzz fixture cfi/rows-out-of-order-loc-wrap: a location never wraps around", "[fuzz]") {
  auto t = BuildFromFuzzInput(ReadBytes(kFuzzFixtures + "/cfi/rows-out-of-order-loc-wrap"));
  REQUIRE(t.ok());
  CheckTable(*t);
  CHECK(t->rows.front().pc == 0x704e);
  CHECK(t->rows.back().pc == 0x6000708e);  // the FDE's end

  // The same by hand: rows at 0x1000 and 0x1004, then set_loc 2^64 - 4 (past the end) and
  // advance_loc4 8, which wrapped to 0x4 and gave a row below 0x1000.
  std::vector<uint8_t> insns = {0x44, 0x0e, 0x10,  // advance_loc 4; def_cfa_offset 16
                                0x01};             // set_loc (absolute sdata4 in this CIE)
  U32(&insns, 0xfffffffc);                         // sign-extended: 2^64 - 4
  insns.insert(insns.end(), {0x04, 8, 0, 0, 0, 0x0e, 0x18});  // advance_loc4 8; cfa_offset 24
  auto h = unwind::BuildTable({unwind::CfiSection{OneFde(0x20, insns), 0, false}});
  REQUIRE(h.ok());
  CheckTable(*h);
  REQUIRE(h->rows.size() == 3);
  CHECK(h->rows[0].pc == 0x1000);
  CHECK(h->rows[1].pc == 0x1004);
  CHECK(h->rows[1].cfa_offset == 16);
  CHECK(h->rows[2].pc == 0x1020);
}

// fuzz_cfi, ubsan-offset-overflow: DW_CFA_offset's operand times the data alignment factor
// overflowed int64_t (undefined behaviour, reported by UBSan). An offset that does not fit is now
// one the walker cannot express, instead of whatever the wrapped product happened to be.
TEST_CASE("fuzz fixture cfi/ubsan-offset-overflow: factored offsets never overflow", "[fuzz]") {
  auto t = BuildFromFuzzInput(ReadBytes(kFuzzFixtures + "/cfi/ubsan-offset-overflow"));
  CHECK(absl::IsNotFound(t.status()));  // both FDEs are malformed further on

  // DW_CFA_offset rbp, 2^61 + 2: times -8 that is -2^64 - 16, which wrapped to -16 (a plausible
  // "rbp saved at CFA-16").
  std::vector<uint8_t> insns = {0x41, 0x86};  // advance_loc 1; offset rbp ...
  Uleb(&insns, (uint64_t{1} << 61) + 2);
  auto h = unwind::BuildTable({unwind::CfiSection{OneFde(0x10, insns), 0, false}});
  REQUIRE(h.ok());
  CheckTable(*h);
  REQUIRE(h->rows.size() == 3);
  CHECK(h->rows[1].pc == 0x1001);
  CHECK(h->rows[1].fp_rule == PS_FP_UNDEFINED);
  CHECK(h->stats.unsupported_fp == 1);
  // GNU_negative_offset_extended of 2^63: its negation overflowed too.
  insns = {0x41, 0x2f, 0x06};
  Uleb(&insns, uint64_t{1} << 63);
  h = unwind::BuildTable({unwind::CfiSection{OneFde(0x10, insns), 0, false}});
  REQUIRE(h.ok());
  CheckTable(*h);
  CHECK(h->rows[1].fp_rule == PS_FP_UNDEFINED);
}

}  // namespace parascope
