#include "agent/symbolize/stack_symbolizer.h"

#include <linux/bpf.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <limits>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "agent/collect/window_clock.h"
#include "agent/proc/read_file.h"
#include "agent/symbolize/debuginfod.h"

namespace parascope {

StackSymbolizer::StackSymbolizer(proc::ProcessTable* processes, symbolize::ElfCache* elf_cache,
                                 const symbolize::Kallsyms* kallsyms, size_t symbol_cache_bytes)
    : processes_(processes),
      elf_cache_(elf_cache),
      kallsyms_(kallsyms),
      perf_maps_(processes),
      symbols_(symbol_cache_bytes),
      no_lines_(std::make_shared<const symbolize::FrameLines>()),
      window_start_ns_(MonotonicNowNs()) {
  SetKernelMapping();
}

void StackSymbolizer::SetKernelMapping() {
  symbolize::FrameMapping kernel;
  kernel.filename = kKernelMapping;
  kernel.start = kallsyms_ ? kallsyms_->min_address() : 0;
  kernel.limit = std::numeric_limits<uint64_t>::max();
  kernel.has_functions = kallsyms_ != nullptr && kallsyms_->size() > 0;
  kernel_mapping_ = std::make_shared<const symbolize::FrameMapping>(std::move(kernel));
}

void StackSymbolizer::EnableKallsymsRefresh(std::string kallsyms_path, std::string modules_path,
                                            int64_t min_interval_ns) {
  kallsyms_path_ = std::move(kallsyms_path);
  modules_path_ = std::move(modules_path);
  refresh_interval_ns_ = min_interval_ns;
  last_refresh_check_ns_ = MonotonicNowNs();
  kernel_signature_ = KernelSignature();
}

uint64_t StackSymbolizer::KernelSignature() const {
  absl::StatusOr<std::string> modules = proc::ReadFileToString(modules_path_);
  std::vector<uint32_t> prog_ids;
  uint32_t id = 0;
  // Bounded: at most 65536 programs are counted (a host has tens to hundreds).
  // The raw syscall: this library does not link libbpf.
  while (prog_ids.size() < 65536) {
    union bpf_attr attr {};
    attr.start_id = id;
    if (syscall(__NR_bpf, BPF_PROG_GET_NEXT_ID, &attr, sizeof(attr)) != 0) break;  // ENOENT: done
    id = attr.next_id;
    prog_ids.push_back(id);
  }
  return absl::HashOf(modules.ok() ? *modules : std::string(), prog_ids);
}

void StackSymbolizer::SetDwarf(symbolize::DwarfCache* dwarf, int64_t burst_ns,
                               const symbolize::Debuginfod* debuginfod, int64_t refill_ns_per_s) {
  dwarf_ = dwarf;
  debuginfod_ = debuginfod;
  dwarf_burst_ns_ = burst_ns;
  dwarf_refill_ns_per_s_ = refill_ns_per_s;
  dwarf_tokens_ns_ = burst_ns;
  dwarf_refilled_at_ns_ = MonotonicNowNs();
}

namespace {
int64_t ThreadCpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

symbolize::Frame StackSymbolizer::KernelFrame(uint64_t ip, bool leaf) {
  ++stats_.frames;
  symbolize::Frame frame{ip, kernel_mapping_, no_lines_};
  if (kallsyms_ == nullptr) return frame;
  const uint64_t lookup_ip = leaf ? ip : ip - 1;
  auto it = kernel_memo_.find(lookup_ip);
  if (it == kernel_memo_.end()) {
    if (kernel_memo_.size() >= kMaxKernelMemo) kernel_memo_.clear();
    std::shared_ptr<const symbolize::FrameLines> lines = no_lines_;
    if (std::optional<symbolize::KernelSymbol> sym = kallsyms_->Lookup(lookup_ip)) {
      std::string name(sym->name);
      lines = std::make_shared<const symbolize::FrameLines>(
          symbolize::FrameLines{{name, name, "", 0}});
    }
    it = kernel_memo_.emplace(lookup_ip, std::move(lines)).first;
  }
  if (it->second->empty()) ++stats_.kernel_no_symbol;
  frame.lines = it->second;
  return frame;
}

size_t StackSymbolizer::TracingPrefixLength(absl::Span<const uint64_t> ips) const {
  if (kallsyms_ == nullptr) return 0;
  size_t n = 0;
  for (; n < ips.size() && n < 4; ++n) {
    // Memoized: a lookup inflates a block of kallsyms names, and every off-CPU record asks.
    auto it = tracing_memo_.find(ips[n]);
    if (it == tracing_memo_.end()) {
      if (tracing_memo_.size() >= kMaxKernelMemo) tracing_memo_.clear();
      std::optional<symbolize::KernelSymbol> sym = kallsyms_->Lookup(ips[n]);
      const bool tracing = !sym || sym->module == "bpf" ||
                           absl::StartsWith(sym->name, "bpf_trace_run") ||
                           absl::StartsWith(sym->name, "__bpf_trace_") ||
                           absl::StartsWith(sym->name, "bpf_prog_");
      it = tracing_memo_.emplace(ips[n], tracing).first;
    }
    if (!it->second) break;
  }
  // Only a prefix that ends in the kernel proper is trimmed; otherwise keep everything.
  return n < ips.size() ? n : 0;
}

std::shared_ptr<const symbolize::ElfFile> StackSymbolizer::ElfFor(const proc::ProcessKey& process,
                                                                  const proc::MappingRef& m) {
  // One ELF cache lookup (a stat(2)) per file and window: processes mapping the same file
  // (device and inode from /proc/<pid>/maps) share it.
  const bool has_identity = m->inode != 0 && !m->deleted;
  // The path is part of the key: btrfs subvolumes (snapshots, container layers) share one
  // device number in maps and number their inodes independently.
  const auto file_key =
      std::make_tuple(kFileKey, (uint64_t{m->dev_major} << 32) | m->dev_minor, m->inode,
                      static_cast<uint64_t>(absl::HashOf(m->path)));
  const auto process_key =
      std::make_tuple(kProcessKey, uint64_t{process.tgid}, process.start_boot_ns, m->start);
  auto it = window_elfs_.end();
  if (has_identity) it = window_elfs_.find(file_key);
  if (it == window_elfs_.end()) it = window_elfs_.find(process_key);
  if (it != window_elfs_.end()) return it->second;
  // The pinned file first, then map_files/, then the path under the process's root.
  absl::StatusOr<std::shared_ptr<const symbolize::ElfFile>> elf_or =
      absl::NotFoundError("no path");
  for (const std::string& host_path : processes_->HostPaths(m)) {
    elf_or = elf_cache_->Get(host_path);
    if (elf_or.ok() || !(absl::IsNotFound(elf_or.status()) ||
                         absl::IsPermissionDenied(elf_or.status()))) {
      break;  // found, or the file itself is bad: another path to it will not help
    }
  }
  if (elf_or.ok()) {
    return window_elfs_.emplace(has_identity ? file_key : process_key, *std::move(elf_or))
        .first->second;
  }
  elf_errors_log_.Log(LogLevel::kWarning, "symbolize: cannot read %s (pid %d): %s", m->path,
                      process.tgid, elf_or.status().ToString());
  window_elfs_.emplace(process_key, nullptr);
  return nullptr;
}

void StackSymbolizer::Count(symbolize::SymbolSource source) {
  switch (source) {
    case symbolize::SymbolSource::kNone:
      ++stats_.no_symbol;
      break;
    case symbolize::SymbolSource::kDwarf:
      ++stats_.dwarf;
      break;
    case symbolize::SymbolSource::kDebugSymtab:
      ++stats_.debug_file_symbol;
      break;
    case symbolize::SymbolSource::kElfSymtab:
      break;
  }
}

symbolize::CachedSymbol StackSymbolizer::Lookup(const proc::ProcessKey& process,
                                                const proc::MappingRef& m,
                                                const symbolize::ElfFile& elf, uint64_t vaddr,
                                                bool* cacheable) {
  *cacheable = true;
  const symbolize::ElfSymbol* sym = elf.Lookup(vaddr);
  // DWARF lines and inlined frames, or symbols of a separate debug file / MiniDebugInfo.
  if (dwarf_ != nullptr) {
    if (dwarf_tokens_ns_ <= 0) {
      // Named from the ELF symbol table for this window; DWARF is tried again in a later one.
      ++stats_.dwarf_deferred;
      *cacheable = false;
    } else {
      const int64_t t0 = ThreadCpuNow();
      std::shared_ptr<symbolize::DwarfFile> dw = DwarfFor(process, m, elf);
      // Binaries whose debug file arrived: their cached results were made without it.
      for (const std::string& id : dwarf_->TakeReplaced()) symbols_.EraseBinary("b:" + id);
      // A file closed at a window's end is reopened (its debug sections loaded again: tens of
      // ms for libc6-dbg's) only when the bucket can pay for it (MayReopenDwarf). Its new
      // addresses wait for that together, instead of each window paying an opening for the
      // first one and deferring the rest (measured, 200 idle processes: 80 ms of a 100 ms
      // window's symbolization went to reopening libc's debug file for one address).
      const bool reopen = dw != nullptr && dw->closed() && dw->Cached(vaddr) == nullptr;
      if (reopen) {
        const int64_t waited =
            dw->deferred_since_ns() == 0 ? 0 : window_start_ns_ - dw->deferred_since_ns();
        if (MayReopenDwarf(dwarf_tokens_ns_, dwarf_burst_ns_, dw->open_cost_ns(), waited,
                           dwarf_refill_ns_per_s_)) {
          dw->set_deferred_since_ns(0);
        } else {
          if (dw->deferred_since_ns() == 0) dw->set_deferred_since_ns(window_start_ns_);
          ++stats_.dwarf_deferred;
          *cacheable = false;
          dw = nullptr;
        }
      }
      const bool opening = dw != nullptr && (reopen || dw->open_cost_ns() == 0);
      const bool has_dwarf = dw != nullptr && dw->HasDwarf();  // runs the debug file search
      // A debug file on its way from debuginfod, or fetched since this DwarfFile was opened:
      // this result, made without it, is for this window only (DwarfCache opens the binary
      // afresh at its first use in the next window).
      if (dw != nullptr && !dw->awaiting_debuginfod().empty() && debuginfod_ != nullptr &&
          (debuginfod_->Pending(dw->awaiting_debuginfod()) ||
           debuginfod_->Fetched(dw->awaiting_debuginfod()))) {
        *cacheable = false;
      }
      if (dw != nullptr && (sym == nullptr || has_dwarf)) {
        const std::vector<symbolize::SourceFrame>& frames = dw->Symbolize(vaddr);
        if (dw->closed()) {
          // The attach failed (the binary replaced or gone meanwhile): no opening to measure,
          // and a result made without DWARF, named from the ELF symbol table this window.
          *cacheable = false;
        } else if (opening) {
          dw->set_open_cost_ns(std::max<int64_t>(1, ThreadCpuNow() - t0));
        }
        if (!frames.empty()) {
          auto lines = std::make_shared<symbolize::FrameLines>();
          lines->reserve(frames.size());
          for (size_t k = 0; k < frames.size(); ++k) {
            const symbolize::SourceFrame& f = frames[k];
            // The function the others are inlined into is named as its ELF symbol when there is
            // one (the name without DWARF, e.g. __libc_start_main for glibc's
            // __libc_start_main_impl, and a lambda's full demangled name, not "operator()").
            if (k + 1 == frames.size() && sym != nullptr) {
              lines->push_back({sym->name(), std::string(sym->system_name), f.file, f.line});
            } else {
              lines->push_back({f.name, f.system_name, f.file, f.line});
            }
          }
          dwarf_tokens_ns_ -= ThreadCpuNow() - t0;
          // Without DWARF, the names came from a debug file's or MiniDebugInfo's symbol table
          // (only asked for when the binary's own table has no symbol here).
          return {std::move(lines), has_dwarf ? symbolize::SymbolSource::kDwarf
                                                   : symbolize::SymbolSource::kDebugSymtab};
        }
      }
      dwarf_tokens_ns_ -= ThreadCpuNow() - t0;
    }
  }
  if (sym == nullptr) return {no_lines_, symbolize::SymbolSource::kNone};
  return {std::make_shared<const symbolize::FrameLines>(
              symbolize::FrameLines{{sym->name(), std::string(sym->system_name), "", 0}}),
          symbolize::SymbolSource::kElfSymtab};
}

symbolize::Frame StackSymbolizer::UserFrame(const proc::ProcessKey& process, uint64_t ip,
                                            bool leaf) {
  ++stats_.frames;
  const uint64_t lookup_ip = leaf ? ip : ip - 1;
  const proc::MappingRef m = processes_->FindMapping(process, lookup_ip);
  if (!m || !m->file_backed()) {
    // JIT code (anonymous memory): named by the process's perf map, if it writes one.
    std::string map_path;
    if (const symbolize::PerfMapSymbol* js = perf_maps_.Lookup(process, lookup_ip, &map_path)) {
      ++stats_.jit;
      auto mapping = std::make_shared<symbolize::FrameMapping>();
      mapping->start = m ? m->start : js->start;
      mapping->limit = m ? m->end : js->start + js->size;
      mapping->filename = std::move(map_path);
      mapping->has_functions = true;
      return {ip, std::move(mapping),
              std::make_shared<const symbolize::FrameLines>(
                  symbolize::FrameLines{{js->name, js->name, "", 0}})};
    }
  }
  if (!m) {
    ++stats_.no_mapping;
    return {ip, nullptr, no_lines_};
  }
  std::shared_ptr<const symbolize::ElfFile> elf;
  if (m->file_backed()) {
    elf = ElfFor(process, m);
    if (elf == nullptr) ++stats_.no_elf;
  }
  std::optional<uint64_t> vaddr;
  if (elf != nullptr) vaddr = elf->FileOffsetToVaddr(lookup_ip - m->start + m->offset);
  // The Mapping: once per process image, mapping and window.
  const auto mapping_key = std::make_tuple(process.tgid, process.start_boot_ns, process.exec_id,
                                           m->start, m->end, m->offset, m->inode);
  auto mit = window_mappings_.find(mapping_key);
  if (mit == window_mappings_.end()) {
    auto mapping = std::make_shared<symbolize::FrameMapping>();
    mapping->start = m->start;
    mapping->limit = m->end;
    mapping->file_offset = m->offset;
    mapping->filename = m->path.empty() ? "[anon]" : m->path;
    if (elf != nullptr) {
      mapping->build_id = elf->build_id();
      mapping->has_functions = true;
      if (server_side_) {
        // ELF-relative bounds: memory_start is the ELF address of the mapping's first byte.
        if (std::optional<uint64_t> start_vaddr = elf->FileOffsetToVaddr(m->offset)) {
          mapping->start = *start_vaddr;
          mapping->limit = *start_vaddr + (m->end - m->start);
          mapping->has_functions = false;
        }
      }
    }
    if (window_mappings_.size() >= kMaxWindowMappings) window_mappings_.clear();
    mit = window_mappings_.emplace(mapping_key, std::move(mapping)).first;
  }
  const std::shared_ptr<const symbolize::FrameMapping>& mapping = mit->second;
  if (elf == nullptr || !vaddr) {
    if (elf != nullptr) ++stats_.no_symbol;
    if (server_side_ && !mapping->has_functions) {
      // No ELF address for this pc (outside the file's segments): the process-relative
      // Mapping, since the Location keeps the process address.
      auto own = std::make_shared<symbolize::FrameMapping>(*mapping);
      own->start = m->start;
      own->limit = m->end;
      own->has_functions = true;
      return {ip, std::move(own), no_lines_};
    }
    return {ip, mapping, no_lines_};
  }
  if (server_side_ && !mapping->has_functions) return {*vaddr, mapping, no_lines_};
  const std::string binary = !elf->build_id().empty()
                                 ? absl::StrCat("b:", elf->build_id())
                                 : absl::StrCat("i:", elf->instance_id());
  if (const symbolize::CachedSymbol* hit = symbols_.Find(binary, *vaddr, window_start_ns_)) {
    Count(hit->source);
    return {ip, mapping, hit->lines};
  }
  bool cacheable = true;
  symbolize::CachedSymbol found = Lookup(process, m, *elf, *vaddr, &cacheable);
  Count(found.source);
  symbolize::Frame frame{ip, mapping, found.lines};
  if (cacheable) {
    // With debug info on, a name without DWARF is looked up again after a while: a debug file
    // may be installed (or fetched) since.
    if (dwarf_ != nullptr && found.source != symbolize::SymbolSource::kDwarf) {
      found.expires_ns = window_start_ns_ + kNoDwarfTtlNs;
    }
    symbols_.Insert(binary, *vaddr, std::move(found));
  }
  return frame;
}

std::shared_ptr<symbolize::DwarfFile> StackSymbolizer::DwarfFor(const proc::ProcessKey& process,
                                                                const proc::MappingRef& m,
                                                                const symbolize::ElfFile& elf) {
  const std::string key = !elf.build_id().empty()
                              ? absl::StrCat("b:", elf.build_id())
                              : absl::StrCat("f:", m->dev_major, ":", m->dev_minor, ":", m->inode,
                                             ":", m->path);
  std::vector<std::string> paths = processes_->HostPaths(m);
  if (paths.empty()) return nullptr;
  // The binary's directory for the .gnu_debuglink search: in the process's view while it runs,
  // else on the host (where most binaries are the same files).
  std::string dir = m->path.substr(0, m->path.find_last_of('/'));
  std::string root = absl::StrCat("/proc/", process.tgid, "/root");
  std::string seen_dir = access((root + dir).c_str(), X_OK) == 0 ? root + dir : dir;
  return dwarf_->Get(key, paths.front(), seen_dir, dir);
}

void StackSymbolizer::EndWindow() {
  window_start_ns_ = MonotonicNowNs();
  if (refresh_interval_ns_ >= 0) {
    const int64_t now = MonotonicNowNs();
    if (now - last_refresh_check_ns_ >= refresh_interval_ns_) {
      last_refresh_check_ns_ = now;
      const uint64_t signature = KernelSignature();
      if (signature != kernel_signature_) {
        absl::StatusOr<symbolize::Kallsyms> k = symbolize::Kallsyms::Load(kallsyms_path_);
        if (k.ok()) {
          kernel_signature_ = signature;
          refreshed_ = std::make_unique<const symbolize::Kallsyms>(*std::move(k));
          kallsyms_ = refreshed_.get();
          kernel_memo_.clear();
          tracing_memo_.clear();
          SetKernelMapping();
          ++kallsyms_reloads_;
        } else {
          kallsyms_log_.Log(LogLevel::kWarning, "kallsyms: reload of %s failed: %s",
                            kallsyms_path_, k.status().ToString());
        }
      }
    }
  }
  {
    // The DWARF bucket's refill for the wall time since the last one (SetDwarf).
    const int64_t now = MonotonicNowNs();
    const double refill = static_cast<double>(now - dwarf_refilled_at_ns_) / 1e9 *
                          static_cast<double>(dwarf_refill_ns_per_s_);
    dwarf_tokens_ns_ = std::min<int64_t>(dwarf_burst_ns_,
                                         dwarf_tokens_ns_ + static_cast<int64_t>(refill));
    dwarf_refilled_at_ns_ = now;
  }
  window_elfs_.clear();
  window_mappings_.clear();
  perf_maps_.EndWindow();
  if (dwarf_ != nullptr) dwarf_->EndWindow();
}

}  // namespace parascope
