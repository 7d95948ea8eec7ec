// Unwind tables from DWARF call frame information: an ELF file's .eh_frame and .debug_frame
// turned into the sorted rows the BPF walker searches (bpf/abi.h, struct ps_unwind_row).
//
// Sources: DWARF 5 section 6.4 "Call Frame Information" (CIE/FDE layout, the DW_CFA_*
// instructions, the register rules); the Linux Standard Base Core spec, "Exception Frames" and
// "DWARF Extensions" (.eh_frame: CIE id 0, CIE pointers relative to the field, augmentation
// strings "zRLPS", DW_EH_PE_* pointer encodings); System V x86-64 psABI section 3.6.2 (DWARF
// register numbers: rbp 6, rsp 7, return address 16).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "bpf/abi.h"

namespace parascope::unwind {

// DWARF register numbers of the three registers the walker tracks: the table format itself is
// architecture-neutral (SP, FP, return address). arm64 would be {31, 29, 30} with its return
// address in x30 at the leaf (PS_RA_LR); not built.
struct CfiArch {
  int sp_reg;
  int fp_reg;
  int ra_reg;
};
inline constexpr CfiArch kX86_64 = {7, 6, 16};

// What a build found, for logs and metrics. Rules the walker cannot express become PS_CFA_NONE
// rows (the walker falls back to frame pointers there) and are counted here.
struct CfiStats {
  uint64_t fdes = 0;                 // FDEs parsed (both sections)
  uint64_t fdes_debug_frame = 0;     // of which from .debug_frame
  uint64_t fdes_skipped = 0;         // overlapping another FDE, above 4 GiB, or malformed
  uint64_t rows_raw = 0;             // rows before merging identical neighbours
  uint64_t unsupported_cfa = 0;      // rows whose CFA rule is not one of PS_CFA_*
  uint64_t unsupported_fp = 0;       // rows whose FP rule became PS_FP_UNDEFINED
  uint64_t unsupported_ra = 0;       // rows whose return-address rule is not expressible
  uint64_t signal_rows = 0;          // rows of signal trampolines ('S')
};

// Rows sorted by pc, strictly increasing; a row covers [pc, next row's pc); the last row is a
// PS_CFA_NONE terminator (pcs after every FDE have no CFI). Gaps between FDEs are PS_CFA_NONE.
struct UnwindTable {
  std::vector<ps_unwind_row> rows;
  CfiStats stats;
  // Filled by the file and memory builders: the NT_GNU_BUILD_ID note as lowercase hex ("" when
  // none) and the PT_LOAD segments, to relate a mapping's file offset to ELF addresses.
  std::string build_id;
  struct Segment {
    uint64_t offset = 0, filesz = 0, vaddr = 0;
    bool exec = false;  // PF_X
  };
  std::vector<Segment> loads;
  // Load bias of an executable mapping of this file: [start, start + len) maps file offsets from
  // `offset` (page-aligned, /proc/<pid>/maps), and runtime pc - bias is the pc's ELF address.
  // Computed from the PF_X PT_LOAD whose file range overlaps the mapping (ELF gABI "Program
  // Header": vaddr = file offset - p_offset + p_vaddr), not from the segment holding `offset`
  // itself: linkers that pack segments into shared pages (lld, gold) put the end of a read-only
  // segment in the executable mapping's first page. False when no segment overlaps.
  bool MappingBias(uint64_t start, uint64_t len, uint64_t offset, uint64_t* bias) const {
    return MappingBias(loads, start, len, offset, bias);
  }
  // The same over a table's segments kept elsewhere (agent/unwind/unwind_tables.h).
  static bool MappingBias(const std::vector<Segment>& loads, uint64_t start, uint64_t len,
                          uint64_t offset, uint64_t* bias) {
    const Segment* best = nullptr;
    for (const Segment& s : loads) {
      if (s.filesz == 0 || s.offset >= offset + len || s.offset + s.filesz <= offset) continue;
      if (best == nullptr || (s.exec && !best->exec)) best = &s;
    }
    if (best == nullptr) return false;
    *bias = start - offset + best->offset - best->vaddr;
    return true;
  }
  size_t bytes() const { return rows.size() * sizeof(ps_unwind_row); }
};

// One CFI section's bytes and where it is loaded: vaddr is the section's sh_addr, the base of
// DW_EH_PE_pcrel pointers in .eh_frame. debug_frame selects the .debug_frame dialect (CIE id
// 0xffffffff, CIE pointers as section offsets, absolute addresses).
struct CfiSection {
  absl::Span<const uint8_t> data;
  uint64_t vaddr = 0;
  bool debug_frame = false;
};

// Builds the table from the given sections (.eh_frame first: where FDEs of two sections overlap,
// the earlier section's win). Malformed entries are skipped and counted, never fatal; an error
// only when no section could be parsed at all (InvalidArgument).
absl::StatusOr<UnwindTable> BuildTable(const std::vector<CfiSection>& sections,
                                       const CfiArch& arch = kX86_64);

// Reads .eh_frame and .debug_frame of the ELF file at `path` with libelf and builds its table.
// Errors: errno statuses from open(2); InvalidArgument for a non-ELF or corrupt file;
// NotFound when the file has neither section (no CFI: the walker uses frame pointers).
absl::StatusOr<UnwindTable> BuildTableFromFile(const std::string& path,
                                               const CfiArch& arch = kX86_64);

// The same for an ELF image in memory (the vDSO, read from the agent's own address space:
// getauxval(AT_SYSINFO_EHDR), man 7 vdso). The image is only read during the call.
absl::StatusOr<UnwindTable> BuildTableFromMemory(const void* image, size_t size,
                                                 const CfiArch& arch = kX86_64);

}  // namespace parascope::unwind
