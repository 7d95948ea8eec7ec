// Turns raw instruction pointers into pprof-free frames (symbolize/frame.h; SPEC section 3):
// kernel frames from /proc/kallsyms under the `[kernel.kallsyms]` mapping, user frames from the
// ELF symbol tables, DWARF and debug files of the files mapped at those addresses (the process
// table's snapshot of each image, files opened as the process sees them), JIT frames from perf
// maps. Results for ELF files are kept across windows in a SymbolCache keyed by build id.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/types/span.h"
#include "agent/proc/process_table.h"
#include "agent/symbolize/dwarf.h"
#include "agent/symbolize/elf_cache.h"
#include "agent/symbolize/frame.h"
#include "agent/symbolize/kallsyms.h"
#include "agent/symbolize/perf_map.h"
#include "agent/symbolize/symbol_cache.h"
#include "agent/util/log.h"

namespace parascope {
namespace symbolize {
class Debuginfod;
}

// Counters of a StackSymbolizer (monotonic), one per KernelFrame / UserFrame call (callers
// memoize per profile: once per distinct address and kind in each profile).
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
  // symbol_cache_bytes bounds the cross-window SymbolCache (bytes).
  StackSymbolizer(proc::ProcessTable* processes, symbolize::ElfCache* elf_cache,
                  const symbolize::Kallsyms* kallsyms,
                  size_t symbol_cache_bytes = symbolize::SymbolCache::kDefaultMaxBytes);

  // The frame of kernel address `ip`; leaf: the first frame of the stack (symbolized at ip),
  // else a return address (symbolized at ip - 1, the call instruction; the frame keeps ip).
  symbolize::Frame KernelFrame(uint64_t ip, bool leaf);
  // The frame of user address `ip` of `process`, leaf as above. A frame that cannot be
  // symbolized keeps its address and Mapping (with build id) so a server-side symbolizer can
  // finish the job; one outside every mapping has a null mapping.
  symbolize::Frame UserFrame(const proc::ProcessKey& process, uint64_t ip, bool leaf);

  // Number of leading kernel frames that belong to the tracing machinery rather than to the
  // traced task: a stack captured by bpf_get_stack() inside a tracepoint program starts with the
  // program itself (no kallsyms symbol, or a "[bpf]" one) and bpf_trace_run<N> /
  // __bpf_trace_<event> (kernel/trace/bpf_trace.c). At most 4 frames are considered. Not
  // thread-safe (a memo), like the rest of this class.
  size_t TracingPrefixLength(absl::Span<const uint64_t> kernel_ips) const;

  const SymbolizerStats& stats() const { return stats_; }
  const symbolize::SymbolCache& symbol_cache() const { return symbols_; }

  // Source lines, inlined frames and separate debug files (borrowed; null: ELF symbols only).
  // New addresses cost a walk of their compile unit's DIEs (tens of us to ms in big C++ units)
  // and, once a window, reopening the binary's debug sections (DwarfCache closes them between
  // windows), so DWARF lookups draw CPU time from a token bucket: it starts full with burst_ns
  // (the first windows name a new host's stacks fully) and refills refill_ns_per_s per second of
  // wall time up to burst_ns, so a host whose processes keep showing new addresses (the agent's
  // own stacks among them) costs at most refill_ns_per_s / 1e9 of a core in DWARF work. With the
  // bucket empty, new addresses are named from the ELF symbol table for that window (counted in
  // dwarf_deferred) and tried again in a later one; cached ones still get their lines. A binary
  // whose debug sections were closed is reopened only when MayReopenDwarf says the bucket can
  // pay for it, so its new addresses are resolved together in one opening.
  // debuginfod (borrowed, may be null): the fetcher the DwarfCache's files ask for debug files;
  // results of a binary whose debug file is still being fetched are not cached across windows.
  static constexpr int64_t kDwarfBurstNs = 250000000;       // 250 ms
  // 1 ms/s: 0.1% of a core. Measured, 200 idle processes and libc6-dbg installed, 15 s windows:
  // after the first windows nearly all DWARF work was the agent's own on-CPU samples landing on
  // new addresses of its own binary, libc and libdw, each reopening that file (5-16 ms for the
  // agent, 50 ms for libc's compressed debug file); at 2 ms/s that took 0.15-0.2% of a core,
  // 40% of the agent's 0.5% budget (issue 14).
  static constexpr int64_t kDwarfRefillNsPerS = 1000000;
  void SetDwarf(symbolize::DwarfCache* dwarf, int64_t burst_ns = kDwarfBurstNs,
                const symbolize::Debuginfod* debuginfod = nullptr,
                int64_t refill_ns_per_s = kDwarfRefillNsPerS);
  // Whether a bucket holding tokens_ns (of burst_ns) may reopen a binary whose last opening
  // cost open_cost_ns (DwarfFile::open_cost_ns; 0 = unknown): it must hold twice that, or be
  // full when twice that exceeds the burst, so the opening leaves as much again for the
  // addresses that waited for it. A binary deferred for waited_ns already, as long as the
  // bucket takes to refill twice its opening (refill_ns_per_s), goes with any tokens left: the
  // bucket runs into debt, which its refill repays before other DWARF work, so the average rate
  // holds and an expensive file is not deferred forever by cheaper work draining the bucket.
  static bool MayReopenDwarf(int64_t tokens_ns, int64_t burst_ns, int64_t open_cost_ns,
                             int64_t waited_ns = 0, int64_t refill_ns_per_s = 0) {
    if (tokens_ns <= 0) return false;
    if (tokens_ns >= std::min(burst_ns, 2 * open_cost_ns)) return true;
    return refill_ns_per_s > 0 &&
           static_cast<double>(waited_ns) * 1e-9 * static_cast<double>(refill_ns_per_s) >=
               2.0 * static_cast<double>(open_cost_ns);
  }
  // --symbolize=server: user frames of ELF files are left for the server (Pyroscope's
  // symbolizer, debuginfod): their Locations carry the ELF virtual address of the looked-up pc
  // (the pc for the leaf, the return address - 1 for callers, so `addr2line -e FILE ADDR` names
  // the calling function), no Lines, and their Mapping the build id, ELF-relative bounds
  // (memory_start = the ELF address of the mapping's first byte) and has_functions = false.
  // Kernel frames (kallsyms) and JIT frames (perf maps) are still named: no server can.
  void SetServerSide(bool server_side) { server_side_ = server_side; }

  // Kernel symbols that appear while the agent runs: modules loaded since, and BPF programs
  // loaded since (a new program lands in a bpf_prog_pack next to older ones, so a stale table
  // would name it as its neighbour). When enabled, EndWindow checks at most every
  // min_interval_ns a signature of `modules_path` (/proc/modules) and of the ids of the loaded
  // BPF programs (bpf(2) BPF_PROG_GET_NEXT_ID, needs CAP_SYS_ADMIN; man 2 bpf), and reloads
  // `kallsyms_path` when it changed (a 6.x kernel's ~50-100 ms of CPU, so only then). A failed
  // reload keeps the old symbols (logged at a bounded rate).
  void EnableKallsymsRefresh(std::string kallsyms_path, std::string modules_path,
                             int64_t min_interval_ns);
  // Reloads of kallsyms done by the refresh.
  uint64_t kallsyms_reloads() const { return kallsyms_reloads_; }

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
  // The ELF file of a file-backed mapping (null when unreadable), looked up once per window.
  std::shared_ptr<const symbolize::ElfFile> ElfFor(const proc::ProcessKey& process,
                                                   const proc::MappingRef& m);
  // Names `vaddr` of `elf` (ELF symbol table, then DWARF and debug files when enabled).
  // *cacheable is false when the DWARF budget deferred the lookup to a later window.
  symbolize::CachedSymbol Lookup(const proc::ProcessKey& process, const proc::MappingRef& m,
                                 const symbolize::ElfFile& elf, uint64_t vaddr, bool* cacheable);
  void Count(symbolize::SymbolSource source);

  SymbolizerStats stats_;
  symbolize::PerfMaps perf_maps_;
  symbolize::SymbolCache symbols_;
  symbolize::DwarfCache* dwarf_ = nullptr;
  const symbolize::Debuginfod* debuginfod_ = nullptr;
  int64_t dwarf_burst_ns_ = 0;
  int64_t dwarf_refill_ns_per_s_ = 0;
  int64_t dwarf_tokens_ns_ = 0;        // CPU ns DWARF lookups may still spend (may go below 0)
  int64_t dwarf_refilled_at_ns_ = 0;   // CLOCK_MONOTONIC of the last refill
  bool server_side_ = false;
  RateLimitedLog elf_errors_log_;
  // The kernel Mapping for the current kallsyms_.
  void SetKernelMapping();
  // The signature the refresh compares (0 when nothing could be read).
  uint64_t KernelSignature() const;
  std::unique_ptr<const symbolize::Kallsyms> refreshed_;  // kallsyms_ after a reload
  std::string kallsyms_path_, modules_path_;
  int64_t refresh_interval_ns_ = -1;  // < 0: refresh off
  int64_t last_refresh_check_ns_ = 0;
  uint64_t kernel_signature_ = 0;
  uint64_t kallsyms_reloads_ = 0;
  RateLimitedLog kallsyms_log_;
  std::shared_ptr<const symbolize::FrameMapping> kernel_mapping_;
  std::shared_ptr<const symbolize::FrameLines> no_lines_;
  // Kernel symbols by looked-up address (at most kMaxKernelMemo, then cleared).
  static constexpr size_t kMaxKernelMemo = 65536;
  absl::flat_hash_map<uint64_t, std::shared_ptr<const symbolize::FrameLines>> kernel_memo_;
  // TracingPrefixLength's verdict by address (at most kMaxKernelMemo, then cleared).
  mutable absl::flat_hash_map<uint64_t, bool> tracing_memo_;
  // ELF files looked up this window. Key: (kFileKey, device, inode, path hash) for a file found
  // through /proc/<pid>/maps' identity, shared by every process mapping it (one stat(2) per file
  // and window, not per process); (kProcessKey, tgid, start ns, mapping start) for a mapping
  // without one (deleted files) and for failures (nullptr: unreadable through that process).
  static constexpr uint8_t kFileKey = 0, kProcessKey = 1;
  absl::flat_hash_map<std::tuple<uint8_t, uint64_t, uint64_t, uint64_t>,
                      std::shared_ptr<const symbolize::ElfFile>>
      window_elfs_;
  // Mappings made this window, by (tgid, start ns, exec id, mapping start, end, offset, inode);
  // at most kMaxWindowMappings, then cleared.
  static constexpr size_t kMaxWindowMappings = 65536;
  absl::flat_hash_map<std::tuple<uint32_t, uint64_t, uint32_t, uint64_t, uint64_t, uint64_t,
                                 uint64_t>,
                      std::shared_ptr<const symbolize::FrameMapping>>
      window_mappings_;
  // Monotonic ns of the current window's start (set by EndWindow; 0 before the first).
  int64_t window_start_ns_ = 0;
  // How long a name without DWARF stays cached while DWARF is enabled (10 min).
  static constexpr int64_t kNoDwarfTtlNs = int64_t{600} * 1000000000;
};

}  // namespace parascope
