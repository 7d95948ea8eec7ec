#include "agent/symbolize/stack_symbolizer.h"

#include <time.h>
#include <unistd.h>

#include <limits>

#include "absl/hash/hash.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace parascope {

StackSymbolizer::StackSymbolizer(proc::ProcessTable* processes, symbolize::ElfCache* elf_cache,
                                 const symbolize::Kallsyms* kallsyms)
    : processes_(processes), elf_cache_(elf_cache), kallsyms_(kallsyms), perf_maps_(processes) {}

void StackSymbolizer::SetDwarf(symbolize::DwarfCache* dwarf, int64_t budget_ns) {
  dwarf_ = dwarf;
  dwarf_budget_ns_ = budget_ns;
}

namespace {
int64_t ThreadCpuNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

void StackSymbolizer::AddKernelFrames(PprofBuilder& builder, absl::Span<const uint64_t> ips,
                                      std::vector<uint64_t>* out) {
  if (ips.empty()) return;
  MappingSpec spec;
  spec.filename = kKernelMapping;
  spec.memory_start = kallsyms_ ? kallsyms_->min_address() : 0;
  spec.memory_limit = std::numeric_limits<uint64_t>::max();
  spec.has_functions = kallsyms_ != nullptr && kallsyms_->size() > 0;
  uint64_t mapping_id = builder.AddMapping(spec);
  for (size_t i = 0; i < ips.size(); ++i) {
    ++stats_.frames;
    uint64_t ip = ips[i];
    const uint32_t kind = i == 0 ? kKernelLeaf : kKernelCaller;
    if (uint64_t loc = builder.RememberedLocation(ip, kind)) {
      out->push_back(loc);
      continue;
    }
    std::optional<symbolize::KernelSymbol> sym;
    if (kallsyms_ != nullptr) sym = kallsyms_->Lookup(i == 0 ? ip : ip - 1);
    uint64_t loc;
    if (!sym) {
      ++stats_.kernel_no_symbol;
      loc = builder.AddLocation(mapping_id, ip, {});
    } else {
      std::string name(sym->name);
      uint64_t fid = builder.AddFunction({name, name, ""});
      loc = builder.AddLocation(mapping_id, ip, {fid});
    }
    builder.RememberLocation(ip, kind, loc);
    out->push_back(loc);
  }
}

size_t StackSymbolizer::TracingPrefixLength(absl::Span<const uint64_t> ips) const {
  if (kallsyms_ == nullptr) return 0;
  size_t n = 0;
  for (; n < ips.size() && n < 4; ++n) {
    std::optional<symbolize::KernelSymbol> sym = kallsyms_->Lookup(ips[n]);
    bool tracing = !sym || sym->module == "bpf" ||
                   absl::StartsWith(sym->name, "bpf_trace_run") ||
                   absl::StartsWith(sym->name, "__bpf_trace_") ||
                   absl::StartsWith(sym->name, "bpf_prog_");
    if (!tracing) break;
  }
  // Only a prefix that ends in the kernel proper is trimmed; otherwise keep everything.
  return n < ips.size() ? n : 0;
}

void StackSymbolizer::AddUserFrames(PprofBuilder& builder, const proc::ProcessKey& process,
                                    absl::Span<const uint64_t> ips, std::vector<uint64_t>* out) {
  for (size_t i = 0; i < ips.size(); ++i) {
    ++stats_.frames;
    uint64_t ip = ips[i];
    const uint32_t kind = i == 0 ? kUserLeaf : kUserCaller;
    // A builder holds one process's profile: an address it has seen needs no new lookup.
    if (uint64_t loc = builder.RememberedLocation(ip, kind)) {
      out->push_back(loc);
      continue;
    }
    uint64_t lookup_ip = i == 0 ? ip : ip - 1;
    const proc::MappingRef m = processes_->FindMapping(process, lookup_ip);
    if (!m || !m->file_backed()) {
      // JIT code (anonymous memory): named by the process's perf map, if it writes one.
      std::string map_path;
      if (const symbolize::PerfMapSymbol* js = perf_maps_.Lookup(process, lookup_ip, &map_path)) {
        ++stats_.jit;
        MappingSpec spec;
        spec.memory_start = m ? m->start : js->start;
        spec.memory_limit = m ? m->end : js->start + js->size;
        spec.filename = map_path;
        spec.has_functions = true;
        uint64_t fid = builder.AddFunction({js->name, js->name, ""});
        uint64_t loc = builder.AddLocation(builder.AddMapping(spec), ip, {fid});
        builder.RememberLocation(ip, kind, loc);
        out->push_back(loc);
        continue;
      }
    }
    if (!m) {
      ++stats_.no_mapping;
      uint64_t loc = builder.AddLocation(0, ip, {});
      builder.RememberLocation(ip, kind, loc);
      out->push_back(loc);
      continue;
    }
    MappingSpec spec;
    spec.memory_start = m->start;
    spec.memory_limit = m->end;
    spec.file_offset = m->offset;
    spec.filename = m->path.empty() ? "[anon]" : m->path;
    std::shared_ptr<const symbolize::ElfFile> elf;
    if (m->file_backed()) {
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
      if (it == window_elfs_.end()) {
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
          it = window_elfs_.emplace(has_identity ? file_key : process_key, *std::move(elf_or))
                   .first;
        } else {
          elf_errors_log_.Log(LogLevel::kWarning, "symbolize: cannot read %s (pid %d): %s",
                              m->path, process.tgid, elf_or.status().ToString());
          it = window_elfs_.emplace(process_key, nullptr).first;
        }
      }
      elf = it->second;
      if (elf == nullptr) ++stats_.no_elf;
    }
    if (elf != nullptr) {
      spec.build_id = elf->build_id();
      spec.has_functions = true;
    }
    if (server_side_ && elf != nullptr) {
      std::optional<uint64_t> vaddr =
          elf->FileOffsetToVaddr(lookup_ip - m->start + m->offset);
      std::optional<uint64_t> start_vaddr = elf->FileOffsetToVaddr(m->offset);
      if (vaddr && start_vaddr) {
        spec.memory_start = *start_vaddr;
        spec.memory_limit = *start_vaddr + (m->end - m->start);
        spec.has_functions = false;
        uint64_t loc = builder.AddLocation(builder.AddMapping(spec), *vaddr, {});
        builder.RememberLocation(ip, kind, loc);
        out->push_back(loc);
        continue;
      }
    }
    uint64_t mapping_id = builder.AddMapping(spec);
    const symbolize::ElfSymbol* sym = nullptr;
    std::optional<uint64_t> vaddr;
    if (elf != nullptr) {
      vaddr = elf->FileOffsetToVaddr(lookup_ip - spec.memory_start + spec.file_offset);
      if (vaddr) sym = elf->Lookup(*vaddr);
    }
    // DWARF lines and inlined frames, or symbols of a separate debug file / MiniDebugInfo.
    if (vaddr && dwarf_ != nullptr) {
      const bool in_budget = dwarf_spent_ns_ < dwarf_budget_ns_;
      const int64_t t0 = in_budget ? ThreadCpuNow() : 0;
      std::shared_ptr<symbolize::DwarfFile> dw = DwarfFor(process, m, *elf);
      const std::vector<symbolize::SourceFrame>* cached = nullptr;
      if (dw != nullptr && !in_budget) {
        cached = dw->Cached(*vaddr);
        if (cached == nullptr) ++stats_.dwarf_deferred;
      }
      if (dw != nullptr && (in_budget || cached != nullptr) &&
          (sym == nullptr || dw->HasDwarf())) {
        const std::vector<symbolize::SourceFrame>& frames =
            cached != nullptr ? *cached : dw->Symbolize(*vaddr);
        if (in_budget) dwarf_spent_ns_ += ThreadCpuNow() - t0;
        if (!frames.empty()) {
          std::vector<LineRef> lines;
          lines.reserve(frames.size());
          for (size_t k = 0; k < frames.size(); ++k) {
            const symbolize::SourceFrame& f = frames[k];
            // The function the others are inlined into is named as its ELF symbol when there is
            // one (the name without DWARF, e.g. __libc_start_main for glibc's
            // __libc_start_main_impl, and a lambda's full demangled name, not "operator()").
            if (k + 1 == frames.size() && sym != nullptr) {
              lines.push_back({builder.AddFunction({sym->name, sym->system_name, f.file}), f.line});
            } else {
              lines.push_back({builder.AddFunction({f.name, f.system_name, f.file}), f.line});
            }
          }
          if (dw->HasDwarf()) ++stats_.dwarf;
          if (sym == nullptr) ++stats_.debug_file_symbol;
          uint64_t loc = builder.AddLocationLines(mapping_id, ip, lines);
          builder.RememberLocation(ip, kind, loc);
          out->push_back(loc);
          continue;
        }
      }
    }
    uint64_t loc;
    if (sym == nullptr) {
      if (elf != nullptr) ++stats_.no_symbol;
      loc = builder.AddLocation(mapping_id, ip, {});
    } else {
      uint64_t fid = builder.AddFunction({sym->name, sym->system_name, ""});
      loc = builder.AddLocation(mapping_id, ip, {fid});
    }
    builder.RememberLocation(ip, kind, loc);
    out->push_back(loc);
  }
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
  dwarf_spent_ns_ = 0;
  window_elfs_.clear();
  perf_maps_.EndWindow();
  if (dwarf_ != nullptr) dwarf_->EndWindow();
}

}  // namespace parascope
