#include "agent/symbolize/dwarf.h"

#include <dwarf.h>
#include <elfutils/libdw.h>
#include <elfutils/libdwelf.h>
#include <elfutils/libdwfl.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/symbolize/debuginfod.h"
#include "agent/symbolize/demangle.h"
#include "agent/util/status.h"

namespace parascope::symbolize {
namespace {

// The DwarfFile whose module libdwfl is resolving: libdwfl looks debug info up lazily, inside our
// calls on this thread, and its callbacks carry no context of ours.
thread_local DwarfFile* g_resolving = nullptr;

std::string Hex(const void* bytes, int len) {
  return absl::BytesToHexString(
      absl::string_view(static_cast<const char*>(bytes), static_cast<size_t>(len)));
}

// Build id of an open ELF file in lowercase hex, "" if none.
std::string BuildIdOfFd(int fd) {
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  if (elf == nullptr) return "";
  const void* id = nullptr;
  ssize_t n = dwelf_elf_gnu_build_id(elf, &id);
  std::string out = n > 0 ? Hex(id, static_cast<int>(n)) : "";
  elf_end(elf);
  return out;
}

// CRC-32 of a file as .gnu_debuglink records it (the zlib polynomial; gdb manual, "Separate Debug
// Files").
bool FileCrc(int fd, uint32_t* crc) {
  uLong c = crc32(0, nullptr, 0);
  char buf[65536];
  off_t off = 0;
  for (;;) {
    ssize_t n = pread(fd, buf, sizeof(buf), off);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (n == 0) break;
    c = crc32(c, reinterpret_cast<const Bytef*>(buf), static_cast<uInt>(n));
    off += n;
  }
  *crc = static_cast<uint32_t>(c);
  return true;
}

// The name to show for a subprogram or inlined-subroutine DIE: its demangled linkage name, else
// its name (both through DW_AT_abstract_origin / DW_AT_specification).
void DieNames(Dwarf_Die* die, std::string* name, std::string* system_name) {
  Dwarf_Attribute attr;
  const char* linkage = nullptr;
  if (dwarf_attr_integrate(die, DW_AT_linkage_name, &attr) != nullptr ||
      dwarf_attr_integrate(die, DW_AT_MIPS_linkage_name, &attr) != nullptr) {
    linkage = dwarf_formstring(&attr);
  }
  const char* plain = dwarf_diename(die);
  *system_name = linkage != nullptr ? linkage : (plain != nullptr ? plain : "");
  *name = linkage != nullptr ? Demangle(linkage) : (plain != nullptr ? plain : "");
  if (linkage != nullptr || plain == nullptr) return;
  // No linkage name (GCC omits it on many inlined template instances): qualify the plain name
  // with the namespaces and classes around its declaration, e.g. "std::__move_median_to_first".
  Dwarf_Die decl = *die, next;
  for (int hops = 0; hops < 4; ++hops) {  // concrete -> abstract origin -> specification
    Dwarf_Attribute a;
    if (dwarf_attr(&decl, DW_AT_abstract_origin, &a) != nullptr ||
        dwarf_attr(&decl, DW_AT_specification, &a) != nullptr) {
      if (dwarf_formref_die(&a, &next) == nullptr) break;
      decl = next;
    } else {
      break;
    }
  }
  Dwarf_Die* scopes = nullptr;
  int n = dwarf_getscopes_die(&decl, &scopes);
  std::string prefix;
  for (int i = 1; i < n; ++i) {
    int tag = dwarf_tag(&scopes[i]);
    if (tag != DW_TAG_namespace && tag != DW_TAG_class_type && tag != DW_TAG_structure_type &&
        tag != DW_TAG_union_type) {
      continue;
    }
    const char* s = dwarf_diename(&scopes[i]);
    prefix = absl::StrCat(s != nullptr ? s : "(anonymous namespace)", "::", prefix);
  }
  free(scopes);
  if (!prefix.empty()) {
    *name = prefix + *name;
    *system_name = *name;
  }
}

}  // namespace

// libdwfl's find_debuginfo callback (libdwfl.h Dwfl_Callbacks): returns an open fd of the
// module's separate debug file and sets *debuginfo_file_name (malloc'ed), or -1. libdwfl also
// calls it for a dwz alt file (.gnu_debugaltlink, dwfl_module_getdwarf.c find_debug_altlink), with
// the alt file's path as debuglink_file and CRC 0; that lookup would need the alt file's own build
// id, which the callback does not get, so it finds nothing rather than offer the module's file.
int FindDebugInfo(Dwfl_Module* mod, void** /*userdata*/, const char* /*modname*/,
                  uint64_t /*base*/, const char* /*file_name*/, const char* debuglink_file,
                  uint32_t debuglink_crc, char** debuginfo_file_name) {
  DwarfFile* self = g_resolving;
  if (self == nullptr) return -1;
  if (debuglink_file != nullptr && debuglink_crc == 0 && std::strchr(debuglink_file, '/')) {
    return -1;  // a dwz alt file (above)
  }
  const unsigned char* id = nullptr;
  GElf_Addr id_vaddr = 0;
  int id_len = dwfl_module_build_id(mod, &id, &id_vaddr);
  const std::string build_id = id_len > 0 ? Hex(id, id_len) : "";
  std::vector<std::string> candidates;
  if (build_id.size() > 2) {
    for (const std::string& d : self->search_.debug_dirs) {
      candidates.push_back(absl::StrCat(d, "/.build-id/", build_id.substr(0, 2), "/",
                                        build_id.substr(2), ".debug"));
    }
  }
  if (debuglink_file != nullptr && debuglink_file[0] != '\0' &&
      std::strchr(debuglink_file, '/') == nullptr && !self->seen_dir_.empty()) {
    candidates.push_back(absl::StrCat(self->seen_dir_, "/", debuglink_file));
    candidates.push_back(absl::StrCat(self->seen_dir_, "/.debug/", debuglink_file));
    for (const std::string& d : self->search_.debug_dirs) {
      if (!self->process_dir_.empty()) {
        candidates.push_back(absl::StrCat(d, self->process_dir_, "/", debuglink_file));
      }
    }
  }
  // The right file: the binary's build id, else (no build id) the debuglink's CRC.
  auto open_verified = [&](const std::string& c) -> int {
    // The process owner names the debuglink and the directory: never block on a FIFO, never
    // read a device.
    int fd = open(c.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return -1;
    struct stat st {};
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
      close(fd);
      return -1;
    }
    bool ok;
    if (!build_id.empty()) {
      ok = BuildIdOfFd(fd) == build_id;
    } else {
      uint32_t crc = 0;
      ok = FileCrc(fd, &crc) && crc == debuglink_crc;
    }
    if (!ok) {
      close(fd);
      return -1;
    }
    self->debug_file_ = c;
    *debuginfo_file_name = strdup(c.c_str());
    return fd;
  };
  for (const std::string& c : candidates) {
    if (int fd = open_verified(c); fd >= 0) return fd;
  }
  // Last, debuginfod's cache (no network here); what is not there yet is fetched in the
  // background, and DwarfCache::Get replaces this file once it is there.
  Debuginfod* debuginfod = self->search_.debuginfod;
  if (debuginfod != nullptr && !build_id.empty()) {
    if (std::string cached = debuginfod->Lookup(build_id); !cached.empty()) {
      return open_verified(cached);  // a file that fails verification is not asked for again
    }
    debuginfod->Request(build_id);
    self->awaiting_debuginfod_ = build_id;
  }
  return -1;
}

namespace {

const Dwfl_Callbacks kCallbacks = {
    .find_elf = nullptr,  // the main file is reported with its fd
    .find_debuginfo = FindDebugInfo,
    .section_address = dwfl_offline_section_address,
    .debuginfo_path = nullptr,
};

}  // namespace

absl::StatusOr<std::unique_ptr<DwarfFile>> DwarfFile::Open(const std::string& open_path,
                                                           const std::string& seen_dir,
                                                           const std::string& process_dir,
                                                           const DebugSearch& search) {
  std::unique_ptr<DwarfFile> self(new DwarfFile());
  self->seen_dir_ = seen_dir;
  self->process_dir_ = process_dir;
  self->search_ = search;
  PS_RETURN_IF_ERROR(self->Attach(open_path));
  return self;
}

absl::Status DwarfFile::Attach(const std::string& open_path) {
  int fd = open(open_path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", open_path));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(open_path, ": not a regular file"));
  }
  dwfl_ = dwfl_begin(&kCallbacks);
  if (dwfl_ == nullptr) {
    close(fd);
    return absl::InternalError(absl::StrCat("dwfl_begin: ", dwfl_errmsg(-1)));
  }
  // Base 0: module addresses are the ELF file's virtual addresses (what ElfFile gives).
  module_ = dwfl_report_elf(dwfl_, "module", open_path.c_str(), fd, 0, false);
  if (module_ == nullptr) {
    close(fd);  // not consumed on failure
    dwfl_end(dwfl_);
    dwfl_ = nullptr;
    return absl::InvalidArgumentError(
        absl::StrCat("libdwfl cannot read ", open_path, ": ", dwfl_errmsg(-1)));
  }
  dwfl_report_end(dwfl_, nullptr, nullptr);
  return absl::OkStatus();
}

void DwarfFile::Close() {
  if (dwfl_ == nullptr) return;
  dwfl_end(dwfl_);
  dwfl_ = nullptr;
  module_ = nullptr;
  syms_.clear();  // names pointed into libdwfl's symbol table
  syms_.shrink_to_fit();
  syms_built_ = false;
}

DwarfFile::~DwarfFile() {
  if (dwfl_ != nullptr) dwfl_end(dwfl_);
}

const DwarfFile::Sym* DwarfFile::SymAt(uint64_t vaddr) {
  if (!syms_built_) {
    syms_built_ = true;
    int n = dwfl_module_getsymtab(module_);
    for (int i = 0; i < n; ++i) {
      GElf_Sym sym{};
      GElf_Addr addr = 0;
      const char* name = dwfl_module_getsym_info(module_, i, &sym, &addr, nullptr, nullptr,
                                                 nullptr);
      if (name == nullptr || name[0] == '\0' || sym.st_shndx == SHN_UNDEF) continue;
      int type = GELF_ST_TYPE(sym.st_info);
      if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
      syms_.push_back({addr, addr + sym.st_size, name});
    }
    std::sort(syms_.begin(), syms_.end(),
              [](const Sym& a, const Sym& b) { return a.start < b.start; });
    // A zero-size symbol covers up to the next one.
    for (size_t i = 0; i < syms_.size(); ++i) {
      if (syms_[i].end == syms_[i].start) {
        syms_[i].end = i + 1 < syms_.size() ? syms_[i + 1].start : syms_[i].start + 1;
      }
    }
  }
  auto it = std::upper_bound(syms_.begin(), syms_.end(), vaddr,
                             [](uint64_t a, const Sym& s) { return a < s.start; });
  // Overlapping symbols (aliases, nested): check a few candidates before this one.
  for (int steps = 0; it != syms_.begin() && steps < 4; ++steps) {
    --it;
    if (vaddr < it->end) return &*it;
  }
  return nullptr;
}

namespace {

// True when `die` (a subprogram) has a DW_TAG_inlined_subroutine among its descendants, or is
// too large to tell (over 20000 DIEs).
bool HasInlinedCode(Dwarf_Die* die) {
  std::vector<Dwarf_Die> stack;
  Dwarf_Die child;
  if (dwarf_child(die, &child) == 0) stack.push_back(child);
  size_t visited = 0;
  while (!stack.empty()) {
    Dwarf_Die d = stack.back();
    stack.pop_back();
    if (++visited > 20000) return true;
    if (dwarf_tag(&d) == DW_TAG_inlined_subroutine) return true;
    Dwarf_Die next;
    if (dwarf_siblingof(&d, &next) == 0) stack.push_back(next);
    if (dwarf_child(&d, &child) == 0) stack.push_back(child);
  }
  return false;
}

}  // namespace

void DwarfFile::Resolve(uint64_t vaddr, std::vector<SourceFrame>* out) {
  Dwarf_Addr bias = 0;
  Dwarf_Die* cu = dwfl_module_addrdie(module_, vaddr, &bias);
  if (cu != nullptr) {
    std::string file;
    int64_t line = 0;
    if (Dwfl_Line* l = dwfl_module_getsrc(module_, vaddr)) {
      int lineno = 0;
      const char* f = dwfl_lineinfo(l, nullptr, &lineno, nullptr, nullptr, nullptr);
      if (f != nullptr) file = f;
      line = lineno;
    }
    const Sym* fn = SymAt(vaddr);
    if (fn != nullptr) {
      if (auto it = plain_functions_.find(fn->start); it != plain_functions_.end()) {
        out->push_back({it->second.name, it->second.system_name, file, line});
        return;
      }
    }
    Dwarf_Files* files = nullptr;
    size_t nfiles = 0;
    if (dwarf_getsrcfiles(cu, &files, &nfiles) != 0) files = nullptr;
    // The innermost function scope at the address. dwarf_getscopes continues an inlined
    // function's chain through its abstract definition, so the functions it was inlined into
    // come from dwarf_getscopes_die on the concrete inlined instance (as eu-addr2line -i does).
    Dwarf_Die* scopes = nullptr;
    int n = dwarf_getscopes(cu, vaddr - bias, &scopes);
    Dwarf_Die innermost;
    bool found = false;
    for (int i = 0; i < n && !found; ++i) {
      int tag = dwarf_tag(&scopes[i]);
      if (tag == DW_TAG_inlined_subroutine || tag == DW_TAG_subprogram) {
        innermost = scopes[i];
        found = true;
      }
    }
    free(scopes);
    // A subprogram is its own chain; only an inlined one needs its concrete containing scopes
    // (dwarf_getscopes_die walks the CU again, the expensive part).
    Dwarf_Die* chain = nullptr;
    int m = 0;
    if (found && dwarf_tag(&innermost) == DW_TAG_subprogram) {
      chain = static_cast<Dwarf_Die*>(malloc(sizeof(Dwarf_Die)));
      if (chain != nullptr) {
        chain[0] = innermost;
        m = 1;
      }
      if (fn != nullptr && plain_functions_.size() < 16384 && !HasInlinedCode(&innermost)) {
        PlainFunction pf;
        DieNames(&innermost, &pf.name, &pf.system_name);
        if (pf.name.empty()) {
          pf.system_name = fn->name;
          pf.name = Demangle(fn->name);
        }
        plain_functions_.emplace(fn->start, std::move(pf));
      }
    } else if (found) {
      m = dwarf_getscopes_die(&innermost, &chain);
    }
    for (int i = 0; i < m; ++i) {
      int tag = dwarf_tag(&chain[i]);
      if (tag != DW_TAG_inlined_subroutine && tag != DW_TAG_subprogram) continue;
      SourceFrame f;
      DieNames(&chain[i], &f.name, &f.system_name);
      f.file = file;
      f.line = line;
      if (tag == DW_TAG_subprogram) {
        if (f.name.empty()) {
          if (const char* symbol = SymbolAt(vaddr)) {
            f.system_name = symbol;
            f.name = Demangle(symbol);
          }
        }
        out->push_back(std::move(f));
        break;
      }
      out->push_back(std::move(f));
      // The frame it was inlined into is at this inlined call's site.
      Dwarf_Attribute attr;
      Dwarf_Word v = 0;
      file.clear();
      line = 0;
      if (files != nullptr &&
          dwarf_formudata(dwarf_attr(&chain[i], DW_AT_call_file, &attr), &v) == 0) {
        const char* cf = dwarf_filesrc(files, v, nullptr, nullptr);
        if (cf != nullptr) file = cf;
      }
      if (dwarf_formudata(dwarf_attr(&chain[i], DW_AT_call_line, &attr), &v) == 0) {
        line = static_cast<int64_t>(v);
      }
    }
    free(chain);
  }
  if (out->empty()) {
    if (const char* symbol = SymbolAt(vaddr)) {
      std::string system(symbol);
      out->push_back({Demangle(system), system, "", 0});
    }
  }
}

bool DwarfFile::HasDwarf() {
  if (!dwarf_checked_ && module_ != nullptr) {
    dwarf_checked_ = true;
    Dwarf_Addr bias = 0;
    g_resolving = this;
    has_dwarf_ = dwfl_module_getdwarf(module_, &bias) != nullptr;
    g_resolving = nullptr;
  }
  return has_dwarf_;
}

const std::vector<SourceFrame>& DwarfFile::Symbolize(uint64_t vaddr) {
  if (auto it = memo_.find(vaddr); it != memo_.end()) return it->second;
  static const std::vector<SourceFrame> kNone;
  if (module_ == nullptr) {
    // Closed at a window's end: attach again for this address. A failed attach is not retried
    // until the next DwarfCache::Get gives a path again.
    if (reopen_path_.empty()) return kNone;
    if (!Attach(reopen_path_).ok()) {
      reopen_path_.clear();
      return kNone;
    }
  }
  if (memo_bytes_ > (size_t{1} << 20)) {
    memo_.clear();
    memo_bytes_ = 0;
  }
  std::vector<SourceFrame> frames;
  g_resolving = this;
  Resolve(vaddr, &frames);
  g_resolving = nullptr;
  size_t bytes = 64;
  for (const SourceFrame& f : frames) {
    bytes += sizeof(f) + f.name.capacity() + f.system_name.capacity() + f.file.capacity();
  }
  memo_bytes_ += bytes;
  return memo_.emplace(vaddr, std::move(frames)).first->second;
}

DwarfCache::DwarfCache(DebugSearch search, size_t max_files)
    : search_(std::move(search)), max_files_(std::max<size_t>(max_files, 1)) {}

std::shared_ptr<DwarfFile> DwarfCache::Get(const std::string& key, const std::string& open_path,
                                           const std::string& seen_dir,
                                           const std::string& process_dir) {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (auto it = index_.find(key); it != index_.end()) {
      std::shared_ptr<DwarfFile> f = it->second->file;
      // At a file's first use in a window: if it asked debuginfod for its debug file and the
      // file is in the cache now, open it afresh (below), as its results were made without it.
      // Only when the file is on disk, so one that was evicted is not reopened every window.
      Debuginfod* debuginfod = search_.debuginfod;
      const bool fetched = it->second->last_used_window != window_ && debuginfod != nullptr &&
                           f != nullptr && !f->awaiting_debuginfod().empty() &&
                           debuginfod->Fetched(f->awaiting_debuginfod()) &&
                           !debuginfod->Lookup(f->awaiting_debuginfod()).empty();
      if (!fetched) {
        // Still waiting (a fetch that failed, or a request dropped on a full queue): asked
        // again at most once a window; Debuginfod's retry interval limits the network.
        if (it->second->last_used_window != window_ && debuginfod != nullptr && f != nullptr &&
            !f->awaiting_debuginfod().empty()) {
          debuginfod->Request(f->awaiting_debuginfod());
        }
        lru_.splice(lru_.begin(), lru_, it->second);
        it->second->last_used_window = window_;
        if (f != nullptr) f->set_reopen_path(open_path);  // reattached by Symbolize if needed
        return f;
      }
      if (replaced_.size() < 1024) replaced_.push_back(f->awaiting_debuginfod());
      lru_.erase(it->second);
      index_.erase(it);
    }
  }
  absl::StatusOr<std::unique_ptr<DwarfFile>> opened =
      DwarfFile::Open(open_path, seen_dir, process_dir, search_);
  std::shared_ptr<DwarfFile> file;
  if (opened.ok()) file = std::shared_ptr<DwarfFile>(*std::move(opened));
  std::lock_guard<std::mutex> l(mu_);
  if (auto it = index_.find(key); it != index_.end()) return it->second->file;
  lru_.push_front({key, file, window_});
  index_[key] = lru_.begin();
  while (lru_.size() > max_files_) {
    index_.erase(lru_.back().key);
    lru_.pop_back();
  }
  return file;
}

std::vector<std::string> DwarfCache::TakeReplaced() {
  std::lock_guard<std::mutex> l(mu_);
  return std::exchange(replaced_, {});
}

void DwarfCache::EndWindow() {
  std::lock_guard<std::mutex> l(mu_);
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->file != nullptr) it->file->Close();
    if (window_ - it->last_used_window >= 2) {
      index_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
  ++window_;
}

size_t DwarfCache::size() const {
  std::lock_guard<std::mutex> l(mu_);
  return lru_.size();
}

}  // namespace parascope::symbolize
