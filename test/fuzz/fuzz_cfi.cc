// libFuzzer target: the CFI parser (agent/unwind/cfi.h), which reads .eh_frame / .debug_frame of
// every binary a profiled process maps, so untrusted input. Two modes by the input's first bytes:
//  - "\x7fELF...": a whole ELF image, through BuildTableFromMemory (libelf finds the sections)
//    and BuildTableFromFile (the same bytes in a memfd); both must agree.
//  - anything else: a raw section for BuildTable, which fuzzes the CIE/FDE and DW_CFA_*
//    interpreter directly. Layout: byte 0 bit 0 = .debug_frame dialect, bit 1 = also pass the
//    bytes as a second section of the other dialect; bytes 1..4 = the section's vaddr
//    (little-endian u32, the pcrel base); the rest = the section bytes.
// Every table built is checked against the contract the BPF walker relies on: rows strictly
// increasing by pc, a PS_CFA_NONE terminator last, at most PS_UNWIND_MAX_TABLE_ROWS rows.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "agent/unwind/cfi.h"
#include "fuzz_util.h"

using parascope::unwind::CfiSection;
using parascope::unwind::UnwindTable;

namespace {

void CheckTable(const UnwindTable& t) {
  PS_FUZZ_CHECK(!t.rows.empty());
  PS_FUZZ_CHECK(t.rows.size() <= PS_UNWIND_MAX_TABLE_ROWS);
  for (size_t i = 1; i < t.rows.size(); ++i) PS_FUZZ_CHECK(t.rows[i - 1].pc < t.rows[i].pc);
  PS_FUZZ_CHECK(t.rows.back().cfa_rule == PS_CFA_NONE);
  for (const ps_unwind_row& r : t.rows) {
    PS_FUZZ_CHECK(r.cfa_rule <= PS_CFA_END);
    PS_FUZZ_CHECK(r.fp_rule <= PS_FP_AT_FP);
    PS_FUZZ_CHECK(r.ra_rule <= PS_RA_LR);
  }
  PS_FUZZ_CHECK(t.stats.fdes_debug_frame <= t.stats.fdes);
  PS_FUZZ_CHECK(t.build_id.size() % 2 == 0);
  uint64_t bias = 0;
  for (const UnwindTable::Segment& s : t.loads) (void)t.MappingBias(s.vaddr, 4096, s.offset, &bias);
}

bool SameRows(const UnwindTable& a, const UnwindTable& b) {
  return a.rows.size() == b.rows.size() &&
         (a.rows.empty() ||
          std::memcmp(a.rows.data(), b.rows.data(), a.rows.size() * sizeof(ps_unwind_row)) == 0) &&
         a.build_id == b.build_id && a.loads.size() == b.loads.size();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static parascope::fuzz::MemFile file("fuzz_cfi");
  if (size >= 4 && std::memcmp(data, "\x7f" "ELF", 4) == 0) {
    // The image is passed as the fuzzer gave it: libelf must not write through it (the agent
    // reads the vDSO this way), and libFuzzer reports a target that modifies its input.
    auto mem = parascope::unwind::BuildTableFromMemory(data, size);
    if (mem.ok()) CheckTable(*mem);
    file.Set(data, size);
    auto disk = parascope::unwind::BuildTableFromFile(file.path());
    if (disk.ok()) CheckTable(*disk);
    PS_FUZZ_CHECK(mem.ok() == disk.ok());
    if (mem.ok()) PS_FUZZ_CHECK(SameRows(*mem, *disk));
    return 0;
  }
  if (size < 5) return 0;
  const bool debug_frame = data[0] & 1;
  const bool two = data[0] & 2;
  uint64_t vaddr = 0;
  for (int i = 0; i < 4; ++i) vaddr |= uint64_t{data[1 + i]} << (8 * i);
  // A copy of exactly the section's size, so ASan sees any read past its end.
  const std::vector<uint8_t> bytes(data + 5, data + size);
  std::vector<CfiSection> sections;
  sections.push_back({absl::MakeConstSpan(bytes), vaddr, debug_frame});
  if (two) sections.push_back({absl::MakeConstSpan(bytes), vaddr, !debug_frame});
  auto t = parascope::unwind::BuildTable(sections);
  if (t.ok()) CheckTable(*t);
  return 0;
}
