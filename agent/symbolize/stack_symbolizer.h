// Turns raw instruction pointers into pprof Locations (SPEC section 3): kernel frames from
// /proc/kallsyms under the `[kernel.kallsyms]` mapping, user frames from the ELF symbol tables of
// the files mapped at those addresses, found through /proc/<pid>/maps and opened through
// /proc/<pid>/root so container paths resolve.
#pragma once

#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include <vector>

#include "absl/types/span.h"
#include "agent/proc/process_table.h"
#include "agent/profile/pprof_builder.h"
#include "agent/symbolize/dwarf.h"
#include "agent/symbolize/elf_cache.h"
#include "agent/symbolize/kallsyms.h"
#include "agent/symbolize/perf_map.h"
#include "agent/util/log.h"

namespace parascope {

// Counters of a StackSymbolizer (monotonic). Frames are counted once per distinct address and
// kind (leaf / caller) in each profile: repeated addresses reuse their Location.
struct SymbolizerStats {
  uint64_t frames = 0;           // user + kernel frames resolved
  uint64_t no_mapping = 0;       // user ip outside every mapping (process gone or JIT)
  uint64_t no_elf = 0;           // mapping's file unreadable or not ELF
  uint64_t no_symbol = 0;        // ELF read, but no symbol covers the address
  uint64_t kernel_no_symbol = 0; // kernel ip not covered by kallsyms
  uint64_t jit = 0;              // user ip named from the process's perf map (JIT code)
  uint64_t dwarf = 0;            // user ip with DWARF source lines (and inlined frames)
  uint64_t debug_file_symbol = 0;// user ip named only by a debug file or MiniDebugInfo
  uint64_t dwarf_deferred = 0;   // user ip named from the ELF symbol table only: the window's
                                 // DWARF budget was spent (DWARF is tried again next window)
};

// Not thread-safe. Borrows the process table, ELF cache and kallsyms (may be null: kernel frames
// then keep their addresses).
class StackSymbolizer {
 public:
  StackSymbolizer(proc::ProcessTable* processes, symbolize::ElfCache* elf_cache,
                  const symbolize::Kallsyms* kallsyms);

  // Appends one Location id per kernel ip (leaf first) to *out.
  void AddKernelFrames(PprofBuilder& builder, absl::Span<const uint64_t> ips,
                       std::vector<uint64_t>* out);
  // Appends one Location id per user ip (leaf first) of `process` to *out. Frames after the leaf
  // are return addresses and are symbolized at ip - 1 (the call instruction), while the Location
  // keeps the raw address. A frame that cannot be symbolized keeps its address and Mapping (with
  // build id) so a server-side symbolizer can finish the job.
  void AddUserFrames(PprofBuilder& builder, const proc::ProcessKey& process,
                     absl::Span<const uint64_t> ips, std::vector<uint64_t>* out);

  // Number of leading kernel frames that belong to the tracing machinery rather than to the
  // traced task: a stack captured by bpf_get_stack() inside a tracepoint program starts with the
  // program itself (no kallsyms symbol, or a "[bpf]" one) and bpf_trace_run<N> /
  // __bpf_trace_<event> (kernel/trace/bpf_trace.c). At most 4 frames are considered.
  size_t TracingPrefixLength(absl::Span<const uint64_t> kernel_ips) const;

  const SymbolizerStats& stats() const { return stats_; }

  // Source lines, inlined frames and separate debug files (borrowed; null: ELF symbols only).
  // New addresses cost a walk of their compile unit's DIEs (tens of us to ms in big C++ units),
  // so each window spends at most budget_ns of CPU on new DWARF lookups; past it, new addresses
  // are named from the ELF symbol table for that window and cached ones still get their lines.
  void SetDwarf(symbolize::DwarfCache* dwarf, int64_t budget_ns = 250000000);
  // --symbolize=server: user frames of ELF files are left for the server (Pyroscope's
  // symbolizer, debuginfod): their Locations carry the ELF virtual address of the looked-up pc
  // (the pc for the leaf, the return address - 1 for callers, so `addr2line -e FILE ADDR` names
  // the calling function), no Lines, and their Mapping the build id, ELF-relative bounds
  // (memory_start = the ELF address of the mapping's first byte) and has_functions = false.
  // Kernel frames (kallsyms) and JIT frames (perf maps) are still named: no server can.
  void SetServerSide(bool server_side) { server_side_ = server_side; }

  // Forgets the per-window file lookups (files may be replaced between windows).
  void EndWindow();

  // Name of the kernel mapping (perf's convention, SPEC section 3).
  static constexpr char kKernelMapping[] = "[kernel.kallsyms]";

 private:
  proc::ProcessTable* processes_;
  symbolize::ElfCache* elf_cache_;
  const symbolize::Kallsyms* kallsyms_;
  std::shared_ptr<symbolize::DwarfFile> DwarfFor(const proc::ProcessKey& process,
                                                 const proc::MappingRef& m,
                                                 const symbolize::ElfFile& elf);

  SymbolizerStats stats_;
  symbolize::PerfMaps perf_maps_;
  symbolize::DwarfCache* dwarf_ = nullptr;
  int64_t dwarf_budget_ns_ = 0;
  int64_t dwarf_spent_ns_ = 0;  // this window
  bool server_side_ = false;
  RateLimitedLog elf_errors_log_;
  // Frame kinds for PprofBuilder's location memo: leaf frames are symbolized at ip, callers at
  // ip - 1, so the same address can map to different lines.
  static constexpr uint32_t kUserLeaf = 0, kUserCaller = 1, kKernelLeaf = 2, kKernelCaller = 3;
  // ELF files looked up this window. Key: (kFileKey, device, inode, path hash) for a file found
  // through /proc/<pid>/maps' identity, shared by every process mapping it (one stat(2) per file
  // and window, not per process); (kProcessKey, tgid, start ns, mapping start) for a mapping
  // without one (deleted files) and for failures (nullptr: unreadable through that process).
  static constexpr uint8_t kFileKey = 0, kProcessKey = 1;
  absl::flat_hash_map<std::tuple<uint8_t, uint64_t, uint64_t, uint64_t>,
                      std::shared_ptr<const symbolize::ElfFile>>
      window_elfs_;
};

}  // namespace parascope
