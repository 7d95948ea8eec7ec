#include "agent/symbolize/elf_file.h"

#include <atomic>

#include <elf.h>
#include <fcntl.h>
#include <gelf.h>
#include <libelf.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <tuple>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "agent/symbolize/demangle.h"
#include "agent/util/status.h"

namespace parascope::symbolize {
namespace {

// Closes a file descriptor on scope exit.
class ScopedFd {
 public:
  explicit ScopedFd(int fd) : fd_(fd) {}
  ~ScopedFd() {
    if (fd_ >= 0) close(fd_);
  }
  ScopedFd(const ScopedFd&) = delete;
  ScopedFd& operator=(const ScopedFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

struct ElfEnd {
  void operator()(Elf* elf) const { elf_end(elf); }
};
using ElfPtr = std::unique_ptr<Elf, ElfEnd>;

// libelf requires elf_version() before any other call; done once per process (thread-safe static
// initialization).
bool InitLibelf() {
  static const bool ok = elf_version(EV_CURRENT) != EV_NONE;
  return ok;
}

absl::Status CorruptError(const std::string& path, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("corrupt ELF ", path, ": ", what, ": ", elf_errmsg(-1)));
}

// Strips a symbol version suffix: the assembler's .symver names ("foo@VER", "foo@@VER") can appear
// literally in .symtab (binutils gas manual, ".symver").
absl::string_view StripVersion(absl::string_view name) {
  size_t at = name.find('@');
  return at == absl::string_view::npos || at == 0 ? name : name.substr(0, at);
}

std::string HexLower(const unsigned char* bytes, size_t n) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    out.push_back(kDigits[bytes[i] >> 4]);
    out.push_back(kDigits[bytes[i] & 0xf]);
  }
  return out;
}

// Scans a note-formatted buffer for NT_GNU_BUILD_ID with owner "GNU" (ELF gABI "Note Section";
// NT_GNU_BUILD_ID from binutils include/elf/common.h / glibc elf.h). Returns "" if absent.
std::string FindBuildIdNote(Elf_Data* data) {
  if (data == nullptr || data->d_buf == nullptr) return "";
  const auto* base = static_cast<const unsigned char*>(data->d_buf);
  size_t offset = 0;
  while (offset < data->d_size) {
    GElf_Nhdr nhdr;
    size_t name_off = 0;
    size_t desc_off = 0;
    size_t next = gelf_getnote(data, offset, &nhdr, &name_off, &desc_off);
    if (next == 0) break;
    if (nhdr.n_type == NT_GNU_BUILD_ID && nhdr.n_namesz == sizeof(ELF_NOTE_GNU) &&
        std::memcmp(base + name_off, ELF_NOTE_GNU, sizeof(ELF_NOTE_GNU)) == 0 &&
        nhdr.n_descsz > 0) {
      return HexLower(base + desc_off, nhdr.n_descsz);
    }
    offset = next;
  }
  return "";
}

// Heap bytes owned by a std::string beyond its inline (SSO) buffer.
size_t StringHeapBytes(const std::string& s) {
  static const size_t kInlineCapacity = std::string().capacity();
  return s.capacity() > kInlineCapacity ? s.capacity() + 1 : 0;
}

// A symbol-table entry before merging.
struct Candidate {
  uint64_t start;
  uint64_t size;
  uint64_t section_end;  // sh_addr + sh_size of st_shndx's section; 0 if unknown
  int rank;              // lower wins among candidates at the same start
  // Into the string table's data, which libelf holds until elf_end (after Read returns).
  absl::string_view system_name;
};

// Preference at equal addresses: global (and GNU unique) over weak over local, then .symtab over
// .dynsym (ELF gABI "Symbol Table", symbol binding).
int Rank(unsigned char binding, bool dynsym) {
  int binding_rank = 2;
  if (binding == STB_GLOBAL || binding == STB_GNU_UNIQUE) {
    binding_rank = 0;
  } else if (binding == STB_WEAK) {
    binding_rank = 1;
  }
  return binding_rank * 2 + (dynsym ? 1 : 0);
}

}  // namespace

// Builds an ElfFile from an open libelf handle; a friend of ElfFile so it can fill private fields.
class ElfFileReader {
 public:
  ElfFileReader(Elf* elf, const std::string& path, uint64_t file_size)
      : elf_(elf), path_(path), file_size_(file_size) {}

  absl::StatusOr<std::unique_ptr<ElfFile>> Read() {
    auto file = std::unique_ptr<ElfFile>(new ElfFile());
    static std::atomic<uint64_t> next_instance{1};
    file->instance_id_ = next_instance.fetch_add(1, std::memory_order_relaxed);
    GElf_Ehdr ehdr;
    if (gelf_getehdr(elf_, &ehdr) == nullptr) return CorruptError(path_, "ELF header");
    file->is_pie_or_dso_ = ehdr.e_type == ET_DYN;
    PS_RETURN_IF_ERROR(CheckHeaderTables(ehdr));
    PS_RETURN_IF_ERROR(ReadSections(*file));
    PS_RETURN_IF_ERROR(ReadProgramHeaders(*file));
    BuildSymbols(*file);

    file->memory_bytes_ = sizeof(ElfFile) + file->segments_.capacity() * sizeof(ElfFile::Segment) +
                          file->symbols_.capacity() * sizeof(ElfSymbol) +
                          StringHeapBytes(file->names_) + StringHeapBytes(file->build_id_);
    return file;
  }

 private:
  // libelf silently reports zero sections / program headers when their tables lie past EOF, so a
  // truncated file would look like a valid file without symbols; reject it instead. With extended
  // numbering (e_shnum == 0, e_phnum == PN_XNUM) at least the first entry must be present
  // (ELF gABI, "ELF Header" and "Sections", extended section numbering).
  absl::Status CheckHeaderTables(const GElf_Ehdr& ehdr) {
    auto fits = [this](uint64_t offset, uint64_t count, uint64_t entry_size) {
      return offset <= file_size_ &&
             count <= (file_size_ - offset) / std::max<uint64_t>(entry_size, 1);
    };
    if (ehdr.e_shoff != 0) {
      const uint64_t shnum = ehdr.e_shnum == 0 ? 1 : ehdr.e_shnum;
      if (!fits(ehdr.e_shoff, shnum, ehdr.e_shentsize)) {
        return absl::InvalidArgumentError(
            absl::StrCat("corrupt ELF ", path_, ": section header table past end of file"));
      }
    }
    if (ehdr.e_phoff != 0) {
      const uint64_t phnum = ehdr.e_phnum == PN_XNUM ? 1 : ehdr.e_phnum;
      if (!fits(ehdr.e_phoff, phnum, ehdr.e_phentsize)) {
        return absl::InvalidArgumentError(
            absl::StrCat("corrupt ELF ", path_, ": program header table past end of file"));
      }
    }
    return absl::OkStatus();
  }

  // Section pass: symbol tables and (preferred) build-id notes in SHT_NOTE sections.
  absl::Status ReadSections(ElfFile& file) {
    Elf_Scn* scn = nullptr;
    while ((scn = elf_nextscn(elf_, scn)) != nullptr) {
      GElf_Shdr shdr;
      if (gelf_getshdr(scn, &shdr) == nullptr) return CorruptError(path_, "section header");
      if (shdr.sh_type == SHT_SYMTAB || shdr.sh_type == SHT_DYNSYM) {
        if (shdr.sh_type == SHT_SYMTAB) file.has_symtab_ = true;
        PS_RETURN_IF_ERROR(ReadSymbolTable(scn, shdr));
      } else if (shdr.sh_type == SHT_NOTE && file.build_id_.empty()) {
        Elf_Data* data = elf_getdata(scn, nullptr);
        if (data == nullptr) return CorruptError(path_, "note section");
        file.build_id_ = FindBuildIdNote(data);
      }
    }
    return absl::OkStatus();
  }

  // Program-header pass: PT_LOAD segments, and PT_NOTE build ids for files without sections.
  absl::Status ReadProgramHeaders(ElfFile& file) {
    size_t phnum = 0;
    if (elf_getphdrnum(elf_, &phnum) != 0) return CorruptError(path_, "program header count");
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr phdr;
      if (gelf_getphdr(elf_, static_cast<int>(i), &phdr) == nullptr) {
        return CorruptError(path_, "program header");
      }
      if (phdr.p_type == PT_LOAD && phdr.p_filesz > 0) {
        file.segments_.push_back({phdr.p_offset, phdr.p_filesz, phdr.p_vaddr});
      } else if (phdr.p_type == PT_NOTE && file.build_id_.empty() && phdr.p_filesz > 0) {
        // 8-byte aligned note segments use the Elf64_Nhdr layout with 8-byte padding.
        Elf_Data* data =
            elf_getdata_rawchunk(elf_, static_cast<int64_t>(phdr.p_offset), phdr.p_filesz,
                                 phdr.p_align == 8 ? ELF_T_NHDR8 : ELF_T_NHDR);
        if (data == nullptr) return CorruptError(path_, "note segment");
        file.build_id_ = FindBuildIdNote(data);
      }
    }
    file.segments_.shrink_to_fit();
    return absl::OkStatus();
  }

  absl::Status ReadSymbolTable(Elf_Scn* scn, const GElf_Shdr& shdr) {
    const bool dynsym = shdr.sh_type == SHT_DYNSYM;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) return CorruptError(path_, dynsym ? ".dynsym data" : ".symtab data");
    const size_t entry_size = gelf_fsize(elf_, ELF_T_SYM, 1, EV_CURRENT);
    if (entry_size == 0) return CorruptError(path_, "symbol entry size");
    const size_t count = data->d_size / entry_size;
    // Index 0 is the reserved undefined symbol (ELF gABI, "Symbol Table").
    for (size_t i = 1; i < count; ++i) {
      GElf_Sym sym;
      if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) {
        return CorruptError(path_, "symbol entry");
      }
      const unsigned char type = GELF_ST_TYPE(sym.st_info);
      if (type != STT_FUNC && type != STT_GNU_IFUNC) continue;
      if (sym.st_shndx == SHN_UNDEF || sym.st_name == 0) continue;
      const char* name = elf_strptr(elf_, shdr.sh_link, sym.st_name);
      if (name == nullptr || name[0] == '\0') continue;
      candidates_.push_back({sym.st_value, sym.st_size, SectionEnd(sym.st_shndx),
                             Rank(GELF_ST_BIND(sym.st_info), dynsym), absl::string_view(name)});
    }
    return absl::OkStatus();
  }

  // End address of section `shndx`, or 0 for reserved indices (SHN_ABS, SHN_COMMON, SHN_XINDEX).
  uint64_t SectionEnd(uint16_t shndx) {
    if (shndx >= SHN_LORESERVE) return 0;
    Elf_Scn* scn = elf_getscn(elf_, shndx);
    GElf_Shdr shdr;
    if (scn == nullptr || gelf_getshdr(scn, &shdr) == nullptr) return 0;
    return shdr.sh_addr + shdr.sh_size;
  }

  // Merges candidates into the sorted, address-unique symbol vector.
  void BuildSymbols(ElfFile& file) {
    std::sort(candidates_.begin(), candidates_.end(), [](const Candidate& a, const Candidate& b) {
      return std::tie(a.start, a.rank, a.system_name) < std::tie(b.start, b.rank, b.system_name);
    });
    std::vector<Candidate> merged;
    merged.reserve(candidates_.size());
    for (Candidate& c : candidates_) {
      if (!merged.empty() && merged.back().start == c.start) {
        // Same address: keep the preferred (first) name, the widest size and section bound.
        merged.back().size = std::max(merged.back().size, c.size);
        merged.back().section_end = std::max(merged.back().section_end, c.section_end);
        continue;
      }
      merged.push_back(std::move(c));
    }
    candidates_.clear();
    candidates_.shrink_to_fit();

    file.symbols_.reserve(merged.size());
    size_t name_bytes = 0;
    for (size_t i = 0; i < merged.size(); ++i) {
      const Candidate& c = merged[i];
      uint64_t size = c.size;
      if (size == 0) {
        // Zero-size symbol (typically hand-written assembly): extend to the next symbol, bounded
        // by its section's end; dropped if neither bound exists or it covers nothing.
        uint64_t end =
            i + 1 < merged.size() ? merged[i + 1].start : std::numeric_limits<uint64_t>::max();
        if (c.section_end != 0) end = std::min(end, c.section_end);
        if (end == std::numeric_limits<uint64_t>::max() || end <= c.start) continue;
        size = end - c.start;
      }
      file.symbols_.push_back({c.start, size, c.system_name});
      name_bytes += c.system_name.size();
    }
    file.symbols_.shrink_to_fit();
    // The names, still in libelf's string table data, are copied into one pool: one allocation
    // for them all, so an evicted file leaves no small holes in the heap. Reserved whole, the
    // pool never reallocates, so the views stay valid.
    file.names_.reserve(name_bytes);
    for (ElfSymbol& sym : file.symbols_) {
      const size_t offset = file.names_.size();
      const size_t length = sym.system_name.size();
      file.names_.append(sym.system_name.data(), length);
      sym.system_name = absl::string_view(file.names_).substr(offset, length);
    }
  }

  Elf* elf_;
  const std::string& path_;
  const uint64_t file_size_;
  std::vector<Candidate> candidates_;
};

absl::StatusOr<std::unique_ptr<ElfFile>> ElfFile::Open(const std::string& path) {
  if (!InitLibelf()) return absl::InternalError("libelf: elf_version(EV_CURRENT) failed");
  // O_NONBLOCK: the path may name a FIFO a process planted; opening must never block.
  ScopedFd fd(open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK));
  if (fd.get() < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return ErrnoStatus(errno, absl::StrCat("fstat ", path));
  if (!S_ISREG(st.st_mode)) {
    return absl::InvalidArgumentError(absl::StrCat("not an ELF file (not a regular file): ", path));
  }
  // ELF_C_READ reads on demand with read/pread (no mapping); elf_end frees everything.
  ElfPtr elf(elf_begin(fd.get(), ELF_C_READ, nullptr));
  if (elf == nullptr) return CorruptError(path, "elf_begin");
  if (elf_kind(elf.get()) != ELF_K_ELF) {
    return absl::InvalidArgumentError(absl::StrCat("not an ELF file: ", path));
  }
  return ElfFileReader(elf.get(), path, static_cast<uint64_t>(st.st_size)).Read();
}

std::optional<uint64_t> ElfFile::FileOffsetToVaddr(uint64_t offset) const {
  for (const Segment& seg : segments_) {
    if (offset >= seg.offset && offset - seg.offset < seg.filesz) {
      return offset - seg.offset + seg.vaddr;
    }
  }
  return std::nullopt;
}

static_assert(sizeof(ElfSymbol) == 32, "ElfSymbol: start, size and a view of the name pool");

std::string ElfSymbol::name() const { return Demangle(std::string(StripVersion(system_name))); }

const ElfSymbol* ElfFile::Lookup(uint64_t vaddr) const {
  auto it = std::upper_bound(symbols_.begin(), symbols_.end(), vaddr,
                             [](uint64_t addr, const ElfSymbol& sym) { return addr < sym.start; });
  if (it == symbols_.begin()) return nullptr;
  --it;
  return vaddr - it->start < it->size ? &*it : nullptr;
}

}  // namespace parascope::symbolize
