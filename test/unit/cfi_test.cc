// Unwind tables from CFI (agent/unwind/cfi.h): hand-assembled .eh_frame entries with known rows,
// the rule patterns the BPF walker understands (signal frames, the PLT, realigned stacks), real
// files (every function entry of libc and of the test fixture must say CFA = rsp + 8, the x86-64
// call convention), and corrupt input.
#include "agent/unwind/cfi.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "absl/strings/str_cat.h"
#include "agent/proc/maps.h"
#include "agent/proc/process_table.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/symbolize/elf_file.h"
#include "agent/unwind/unwind_tables.h"

namespace parascope::unwind {
namespace {

// Little helpers to assemble .eh_frame bytes.
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
void Sleb(std::vector<uint8_t>* b, int64_t v) {
  bool more = true;
  while (more) {
    uint8_t byte = v & 0x7f;
    v >>= 7;
    more = !((v == 0 && !(byte & 0x40)) || (v == -1 && (byte & 0x40)));
    b->push_back(byte | (more ? 0x80 : 0));
  }
}

// A CIE at offset 0 of *sec: augmentation `aug` ("zR" or "zRS"), code align 1, data align -8,
// return address register 16, FDE pointers pcrel|sdata4, initial rules CFA = rsp + 8 and
// RA at CFA - 8 (what GCC emits on x86-64).
void Cie(std::vector<uint8_t>* sec, const std::string& aug) {
  std::vector<uint8_t> body;
  U32(&body, 0);     // CIE id
  body.push_back(1); // version
  for (char c : aug) body.push_back(static_cast<uint8_t>(c));
  body.push_back(0);
  Uleb(&body, 1);
  Sleb(&body, -8);
  body.push_back(16);
  Uleb(&body, 1);       // augmentation data length
  body.push_back(0x1b); // DW_EH_PE_pcrel | DW_EH_PE_sdata4
  body.insert(body.end(), {0x0c, 0x07, 0x08, 0x90, 0x01});  // def_cfa rsp+8; offset r16 cfa-8
  while ((body.size() + 4) % 8) body.push_back(0);          // DW_CFA_nop padding
  U32(sec, static_cast<uint32_t>(body.size()));
  sec->insert(sec->end(), body.begin(), body.end());
}

// An FDE for [start, start + len) (section loaded at `vaddr`) with the given instructions,
// pointing at the CIE at offset 0.
void Fde(std::vector<uint8_t>* sec, uint64_t vaddr, uint32_t start, uint32_t len,
         const std::vector<uint8_t>& insns) {
  const size_t at = sec->size();
  std::vector<uint8_t> body;
  U32(&body, static_cast<uint32_t>(at + 4));  // CIE pointer: back to offset 0
  const uint64_t field = vaddr + at + 8;      // address of the pc_begin field
  U32(&body, static_cast<uint32_t>(start - field));
  U32(&body, len);
  Uleb(&body, 0);  // augmentation data length
  body.insert(body.end(), insns.begin(), insns.end());
  while ((body.size() + 4) % 8) body.push_back(0);
  U32(sec, static_cast<uint32_t>(body.size()));
  sec->insert(sec->end(), body.begin(), body.end());
}

const ps_unwind_row* RowAt(const UnwindTable& t, uint64_t pc) {
  const ps_unwind_row* best = nullptr;
  for (const auto& r : t.rows) {
    if (r.pc <= pc) best = &r;
  }
  return best;
}

}  // namespace

TEST_CASE("cfi: a frame-pointer prologue and epilogue become exact rows", "[unwind]") {
  std::vector<uint8_t> sec;
  Cie(&sec, "zR");
  // push %rbp; mov %rsp,%rbp; ...; leave; ret — GCC's CFI for it.
  Fde(&sec, 0x400, 0x1000, 0x20,
      {0x41,             // advance_loc 1
       0x0e, 0x10,       // def_cfa_offset 16
       0x86, 0x02,       // offset rbp at cfa-16
       0x43,             // advance_loc 3
       0x0d, 0x06,       // def_cfa_register rbp
       0x58,             // advance_loc 24
       0x0c, 0x07, 0x08});  // def_cfa rsp+8
  auto t = BuildTable({CfiSection{sec, 0x400, false}});
  REQUIRE(t.ok());
  REQUIRE(t->rows.size() == 5);
  const auto& r = t->rows;
  CHECK(r[0].pc == 0x1000);
  CHECK(r[0].cfa_rule == PS_CFA_SP);
  CHECK(r[0].cfa_offset == 8);
  CHECK(r[0].ra_rule == PS_RA_AT_CFA);
  CHECK(r[0].ra_offset == -8);
  CHECK(r[0].fp_rule == PS_FP_SAME);
  CHECK(r[1].pc == 0x1001);
  CHECK(r[1].cfa_offset == 16);
  CHECK(r[1].fp_rule == PS_FP_AT_CFA);
  CHECK(r[1].fp_offset == -16);
  CHECK(r[2].pc == 0x1004);
  CHECK(r[2].cfa_rule == PS_CFA_FP);
  CHECK(r[2].cfa_offset == 16);
  CHECK(r[3].pc == 0x101c);
  CHECK(r[3].cfa_rule == PS_CFA_SP);
  CHECK(r[3].cfa_offset == 8);
  CHECK(r[4].pc == 0x1020);  // end of the FDE: no CFI after it
  CHECK(r[4].cfa_rule == PS_CFA_NONE);
  CHECK(t->stats.fdes == 1);
}

TEST_CASE("cfi: gaps between FDEs, identical neighbours and remember/restore_state", "[unwind]") {
  std::vector<uint8_t> sec;
  Cie(&sec, "zR");
  Fde(&sec, 0, 0x2000, 0x10, {0x44, 0x0e, 0x10, 0x0a, 0x42, 0x0e, 0x20, 0x42, 0x0b});
  // A second FDE right after the first with the CIE's rules only: merged into the first's last
  // row only if the rules are equal (they are not: the first ends at CFA+16).
  Fde(&sec, 0, 0x2010, 0x10, {});
  // A third one after a gap.
  Fde(&sec, 0, 0x3000, 0x8, {});
  auto t = BuildTable({CfiSection{sec, 0, false}});
  REQUIRE(t.ok());
  // 0x2000 sp+8, 0x2004 sp+16 (remembered), 0x2006 sp+32, 0x2008 sp+16 (restored),
  // 0x2010 sp+8, 0x2020 none, 0x3000 sp+8, 0x3008 none.
  std::vector<std::pair<uint32_t, int>> want = {{0x2000, 8},  {0x2004, 16}, {0x2006, 32},
                                                {0x2008, 16}, {0x2010, 8},  {0x2020, -1},
                                                {0x3000, 8},  {0x3008, -1}};
  REQUIRE(t->rows.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("row " << i);
    CHECK(t->rows[i].pc == want[i].first);
    if (want[i].second < 0) {
      CHECK(t->rows[i].cfa_rule == PS_CFA_NONE);
    } else {
      CHECK(t->rows[i].cfa_rule == PS_CFA_SP);
      CHECK(t->rows[i].cfa_offset == want[i].second);
    }
  }
}

TEST_CASE("cfi: signal trampoline, PLT and realigned-stack expressions", "[unwind]") {
  std::vector<uint8_t> sec;
  Cie(&sec, "zRS");
  // glibc's __restore_rt (sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c): CFA = *(rsp + 160),
  // rbp at rsp + 120, rip at rsp + 168 (struct ucontext_t's gregs).
  Fde(&sec, 0, 0x5000, 0x10,
      {0x0f, 0x04, 0x77, 0xa0, 0x01, 0x06,        // def_cfa_expression breg7 160; deref
       0x10, 0x06, 0x03, 0x77, 0xf8, 0x00,        // expression rbp: breg7 120
       0x10, 0x10, 0x03, 0x77, 0xa8, 0x01});      // expression rip: breg7 168
  auto t = BuildTable({CfiSection{sec, 0, false}});
  REQUIRE(t.ok());
  const ps_unwind_row* r = RowAt(*t, 0x5000);
  REQUIRE(r != nullptr);
  CHECK(r->cfa_rule == PS_CFA_DEREF_SP);
  CHECK(r->cfa_offset == 160);
  CHECK(r->fp_rule == PS_FP_AT_SP);
  CHECK(r->fp_offset == 120);
  CHECK(r->ra_rule == PS_RA_AT_SP);
  CHECK(r->ra_offset == 168);
  CHECK((r->flags & PS_ROW_SIGNAL) != 0);
  CHECK(t->stats.signal_rows == 1);

  std::vector<uint8_t> plt;
  Cie(&plt, "zR");
  // binutils' lazy PLT: def_cfa_offset 16 for PLT0, then the expression for the entries.
  Fde(&plt, 0, 0x1020, 0x40,
      {0x0e, 0x10, 0x46, 0x0e, 0x18, 0x4a, 0x0f, 0x0b, 0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a,
       0x3b, 0x2a, 0x33, 0x24, 0x22});
  // A realigned main (GCC's DRAP): CFA = *(rbp - 8), rbp saved at rbp + 0.
  Fde(&plt, 0, 0x2000, 0x40, {0x0f, 0x03, 0x76, 0x78, 0x06, 0x10, 0x06, 0x02, 0x76, 0x00});
  // An expression the walker cannot follow (CFA = r10 + 0, during realignment).
  Fde(&plt, 0, 0x3000, 0x10, {0x0c, 0x0a, 0x00});
  t = BuildTable({CfiSection{plt, 0, false}});
  REQUIRE(t.ok());
  r = RowAt(*t, 0x1030);
  REQUIRE(r != nullptr);
  CHECK(r->cfa_rule == PS_CFA_PLT);
  CHECK(r->cfa_offset == 8);
  CHECK((r->flags >> PS_ROW_PLT_SHIFT) == 11);
  r = RowAt(*t, 0x2000);
  CHECK(r->cfa_rule == PS_CFA_DEREF_FP);
  CHECK(r->cfa_offset == -8);
  CHECK(r->fp_rule == PS_FP_AT_FP);
  CHECK(r->fp_offset == 0);
  r = RowAt(*t, 0x3000);
  CHECK(r->cfa_rule == PS_CFA_NONE);
  CHECK(t->stats.unsupported_cfa == 1);
}

TEST_CASE("cfi: the outermost frame (RA undefined) ends the walk", "[unwind]") {
  std::vector<uint8_t> sec;
  Cie(&sec, "zR");
  Fde(&sec, 0, 0x1000, 0x30, {0x07, 0x10});  // DW_CFA_undefined rip (glibc's _start)
  auto t = BuildTable({CfiSection{sec, 0, false}});
  REQUIRE(t.ok());
  CHECK(RowAt(*t, 0x1010)->cfa_rule == PS_CFA_END);
}

// Every function symbol of a real file starts with CFA = rsp + 8 and the return address at
// CFA - 8: the x86-64 call pushed it (System V psABI 3.2.2).
static void CheckFunctionEntries(const std::string& path, double min_share) {
  auto elf = symbolize::ElfFile::Open(path);
  REQUIRE(elf.ok());
  auto t = BuildTableFromFile(path);
  REQUIRE(t.ok());
  for (size_t i = 1; i < t->rows.size(); ++i) REQUIRE(t->rows[i - 1].pc < t->rows[i].pc);
  CHECK(t->rows.back().cfa_rule == PS_CFA_NONE);
  // Walk the symbols through a small probe: Lookup(start) gives back the symbol at start.
  size_t checked = 0, entry_ok = 0;
  for (uint64_t a = 0; checked < 100000 && a < (1ull << 32);) {
    const symbolize::ElfSymbol* s = elf->get()->Lookup(a);
    if (s == nullptr) {
      // Next row pc after a as the next probe: rows cover the text densely.
      auto it = std::upper_bound(t->rows.begin(), t->rows.end(), a,
                                 [](uint64_t v, const ps_unwind_row& r) { return v < r.pc; });
      if (it == t->rows.end()) break;
      a = it->pc;
      continue;
    }
    if (s->start == a && s->size > 1) {
      ++checked;
      const ps_unwind_row* r = RowAt(*t, a);
      if (r && r->cfa_rule == PS_CFA_SP && r->cfa_offset == 8 && r->ra_rule == PS_RA_AT_CFA &&
          r->ra_offset == -8) {
        ++entry_ok;
      }
    }
    a = s->start + std::max<uint64_t>(s->size, 1);
  }
  INFO(path << ": " << entry_ok << " of " << checked << " function entries at CFA = rsp+8");
  REQUIRE(checked >= 4);
  CHECK(double(entry_ok) / checked >= min_share);
}

TEST_CASE("cfi: function entries of real files say CFA = rsp + 8", "[unwind]") {
  CheckFunctionEntries(PS_FIXTURE_LIB, 1.0);
  // libc has hand-written assembly; nearly all of it has CFI too.
  CheckFunctionEntries("/lib/x86_64-linux-gnu/libc.so.6", 0.97);
  // The stripped fixture keeps .eh_frame: the same table.
  auto a = BuildTableFromFile(PS_FIXTURE_LIB);
  auto b = BuildTableFromFile(PS_FIXTURE_LIB_STRIPPED);
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  REQUIRE(a->rows.size() == b->rows.size());
  CHECK(std::memcmp(a->rows.data(), b->rows.data(), a->bytes()) == 0);
  CHECK(a->build_id == b->build_id);
  CHECK(!a->build_id.empty());
}

TEST_CASE("cfi: files without CFI and corrupt sections are errors or partial, never a crash",
          "[unwind]") {
  CHECK(absl::IsNotFound(BuildTableFromFile("/nonexistent/file").status()));
  CHECK(!BuildTableFromFile(std::string(PS_FIXTURE_DIR) + "/proc/root/1/stat").ok());
  // Read libc's .eh_frame bytes through the builder with corruption: truncated at many points and
  // with random bytes flipped. Tables that come out keep their invariants.
  auto elf_table = BuildTableFromFile("/lib/x86_64-linux-gnu/libc.so.6");
  REQUIRE(elf_table.ok());
  std::ifstream f("/lib/x86_64-linux-gnu/libc.so.6", std::ios::binary);
  std::vector<uint8_t> file((std::istreambuf_iterator<char>(f)), {});
  // Use a window of the file as a fake section: mostly garbage, must not crash.
  std::mt19937 rng(42);
  for (int round = 0; round < 200; ++round) {
    size_t off = rng() % (file.size() - 4096);
    std::vector<uint8_t> bytes(file.begin() + off, file.begin() + off + 1 + rng() % 4096);
    for (int k = 0; k < 8; ++k) bytes[rng() % bytes.size()] ^= static_cast<uint8_t>(rng());
    auto t = BuildTable({CfiSection{bytes, 0x1000, (round & 1) != 0}});
    if (t.ok()) {
      for (size_t i = 1; i < t->rows.size(); ++i) REQUIRE(t->rows[i - 1].pc < t->rows[i].pc);
    }
  }
}

TEST_CASE("cfi: load bias of an executable mapping, bfd and lld layouts", "[unwind]") {
  UnwindTable t;
  // ld.bfd: R at 0, R E at file 0x1000 / vaddr 0x1000 on its own page (what Debian builds).
  t.loads = {{0, 0x628, 0, false}, {0x1000, 0x2000, 0x1000, true}, {0x3000, 0x500, 0x3000, false}};
  uint64_t bias = 0;
  REQUIRE(t.MappingBias(0x7f0000001000, 0x2000, 0x1000, &bias));
  CHECK(bias == 0x7f0000000000);
  // lld packs segments: R E starts at file 0x630 / vaddr 0x1630, so the r-xp mapping begins at
  // file offset 0 (the page it shares with the R segment) and at runtime base + 0x1000.
  t.loads = {{0, 0x628, 0, false}, {0x630, 0x1000, 0x1630, true}};
  REQUIRE(t.MappingBias(0x7f0000001000, 0x1000, 0, &bias));
  CHECK(bias == 0x7f0000000000);  // pc base + 0x1630 is ELF address 0x1630
  // Non-PIE (ET_EXEC): addresses are ELF addresses, bias 0.
  t.loads = {{0, 0x400, 0x400000, false}, {0x1000, 0x5000, 0x401000, true}};
  REQUIRE(t.MappingBias(0x401000, 0x5000, 0x1000, &bias));
  CHECK(bias == 0);
  CHECK(!t.MappingBias(0x500000, 0x1000, 0x9000, &bias));  // no segment there
}

TEST_CASE("unwind: range allocator reuses and coalesces freed ranges", "[unwind]") {
  RangeAllocator a(100);
  auto x = a.Allocate(40), y = a.Allocate(40), z = a.Allocate(30);
  REQUIRE(x);
  REQUIRE(y);
  CHECK(!z);  // 20 left
  a.Free(*x, 40);
  CHECK(a.largest_free() == 40);
  a.Free(*y, 40);
  CHECK(a.largest_free() == 100);  // coalesced with the tail and with x
  CHECK(a.free_count() == 100);
  CHECK(a.Allocate(100) == 0u);
}

namespace {

// In-memory stand-in for the BPF maps.
class FakeMaps : public UnwindMaps {
 public:
  FakeMaps(uint32_t rows, uint32_t mappings) : rows_(rows), maps_(mappings) {}
  uint32_t row_capacity() const override { return static_cast<uint32_t>(rows_.size()); }
  uint32_t mapping_capacity() const override { return static_cast<uint32_t>(maps_.size()); }
  void WriteRows(uint32_t first, absl::Span<const ps_unwind_row> rows) override {
    REQUIRE(first + rows.size() <= rows_.size());
    std::copy(rows.begin(), rows.end(), rows_.begin() + first);
  }
  void WriteMappings(uint32_t first, absl::Span<const ps_unwind_mapping> maps) override {
    REQUIRE(first + maps.size() <= maps_.size());
    std::copy(maps.begin(), maps.end(), maps_.begin() + first);
  }
  absl::Status SetProcess(uint32_t tgid, const ps_unwind_proc& p) override {
    procs_[tgid] = p;
    return absl::OkStatus();
  }
  void DeleteProcess(uint32_t tgid) override { procs_.erase(tgid); }
  absl::Status SetFile(const ps_unwind_file_key& key, const ps_unwind_file& file) override {
    files_[{key.dev, key.ino}] = file;
    return absl::OkStatus();
  }
  void DeleteFile(const ps_unwind_file_key& key) override { files_.erase({key.dev, key.ino}); }
  bool has_files() const override { return true; }

  // What the find_vma walker would find for `pc` of this process (bpf/unwind.bpf.h
  // ps_vma_file_table), from its /proc/self/maps line: the row, or nullptr.
  const ps_unwind_row* LookupByFile(uint64_t pc) const {
    auto text = proc::ReadFileToString("/proc/self/maps");
    REQUIRE(text.ok());
    auto maps = proc::ParseMaps(*text);
    REQUIRE(maps.ok());
    for (const proc::MapEntry& m : *maps) {
      if (pc < m.start || pc >= m.end || !m.executable()) continue;
      auto it = files_.find({(uint64_t{m.dev_major} << 20) | m.dev_minor, m.inode});
      if (it == files_.end()) return nullptr;
      const ps_unwind_file& f = it->second;
      const uint64_t bias = m.start - m.offset + f.seg_offset - f.seg_vaddr;
      const ps_unwind_row* best = nullptr;
      for (uint32_t r = 0; r < f.count; ++r) {
        if (rows_[f.first + r].pc <= pc - bias) best = &rows_[f.first + r];
      }
      return best;
    }
    return nullptr;
  }

  // What the BPF walker would find for `pc` of `tgid`: the row, or nullptr.
  const ps_unwind_row* Lookup(uint32_t tgid, uint64_t pc, const ps_unwind_mapping** m_out) const {
    auto it = procs_.find(tgid);
    if (it == procs_.end()) return nullptr;
    for (uint32_t i = 0; i < it->second.count; ++i) {
      const ps_unwind_mapping& m = maps_[it->second.first + i];
      if (pc < m.start || pc >= m.end) continue;
      *m_out = &m;
      if (m.state != PS_TABLE_READY) return nullptr;
      const ps_unwind_row* best = nullptr;
      for (uint32_t r = 0; r < m.count; ++r) {
        if (rows_[m.first + r].pc <= pc - m.bias) best = &rows_[m.first + r];
      }
      return best;
    }
    return nullptr;
  }

  std::vector<ps_unwind_row> rows_;
  std::vector<ps_unwind_mapping> maps_;
  std::map<uint32_t, ps_unwind_proc> procs_;
  std::map<std::pair<uint64_t, uint64_t>, ps_unwind_file> files_;  // (dev, ino)
};

}  // namespace

__attribute__((noinline)) int UnwindTestProbe(int x) { return x * 3 + 1; }

TEST_CASE("unwind: a live process's mappings point at tables that describe its code",
          "[unwind]") {
  FakeMaps maps(1 << 20, 1024);
  UnwindTables tables(&maps);
  REQUIRE(tables.LoadProcess(getpid()).ok());
  UnwindTableStats st = tables.stats();
  CHECK(st.processes == 1);
  CHECK(st.tables >= 2);  // this binary, libc, libstdc++, ...
  // This function's entry, at its runtime address: CFA = rsp + 8 (the call just pushed the
  // return address), so bias and table agree.
  const ps_unwind_mapping* m = nullptr;
  const ps_unwind_row* r =
      maps.Lookup(getpid(), reinterpret_cast<uint64_t>(&UnwindTestProbe), &m);
  REQUIRE(r != nullptr);
  CHECK(r->cfa_rule == PS_CFA_SP);
  CHECK(r->cfa_offset == 8);
  // libc's write(), through dlsym: its entry too.
  void* w = dlsym(RTLD_DEFAULT, "write");
  REQUIRE(w != nullptr);
  r = maps.Lookup(getpid(), reinterpret_cast<uint64_t>(w), &m);
  REQUIRE(r != nullptr);
  CHECK(r->cfa_rule == PS_CFA_SP);
  CHECK(r->cfa_offset == 8);
  // The same rows by file identity and vma, as the find_vma walker reaches them: this binary's
  // and libc's, at the same row as through the process's list.
  for (uint64_t pc : {reinterpret_cast<uint64_t>(&UnwindTestProbe), reinterpret_cast<uint64_t>(w)}) {
    const ps_unwind_row* by_list = maps.Lookup(getpid(), pc, &m);
    const ps_unwind_row* by_file = maps.LookupByFile(pc);
    REQUIRE(by_file != nullptr);
    CHECK(by_file == by_list);
  }
  CHECK(tables.stats().files == maps.files_.size());
  // The process entry says who it is: start time in ticks as /proc/<pid>/stat has it.
  CHECK(maps.procs_.at(getpid()).tgid_start_ticks > 0);
  // A second load (a refresh) reuses the tables: none built again.
  REQUIRE(tables.LoadProcess(getpid()).ok());
  CHECK(tables.stats().tables_built == st.tables_built);
  // A pid that does not exist: NotFound, nothing written.
  CHECK(absl::IsNotFound(tables.LoadProcess(0x3ffffff0)));
}

// This process's mappings as a ProcessTable snapshot would hold them, each file pinned by the
// stat of its path but with no descriptor (-1): only a pinned identity can find its table.
static proc::ProcessInfo SelfWithDescriptorlessPins() {
  auto text = proc::ReadFileToString("/proc/self/maps");
  REQUIRE(text.ok());
  auto entries = proc::ParseMaps(*text);
  REQUIRE(entries.ok());
  proc::ProcessInfo info;
  info.maps = *entries;
  info.files.resize(info.maps.size());
  for (size_t i = 0; i < info.maps.size(); ++i) {
    struct stat st {};
    if (!info.maps[i].file_backed() || stat(info.maps[i].path.c_str(), &st) != 0) continue;
    info.files[i] = std::make_shared<const proc::PinnedFile>(-1, st);
  }
  return info;
}

// A snapshot's pinned files whose identity (device, inode, size, mtime) is known find their
// tables from the stat they were pinned with, without reopening anything: here the pins hold no
// descriptor, and the tgid has no /proc entry, so only that path can find them.
TEST_CASE("unwind: pinned files of a snapshot find known tables by their pinned identity",
          "[unwind]") {
  FakeMaps maps(1 << 20, 1024);
  UnwindTables tables(&maps);
  REQUIRE(tables.LoadProcess(getpid()).ok());  // builds this process's tables
  const UnwindTableStats before = tables.stats();
  const proc::ProcessInfo info = SelfWithDescriptorlessPins();
  constexpr uint32_t kTgid = 0x3ffffff0;  // no such process
  REQUIRE(tables.LoadProcess(kTgid, /*start_ticks=*/1, /*exec_id=*/7, &info).ok());
  const UnwindTableStats after = tables.stats();
  CHECK(after.tables_built == before.tables_built);
  CHECK(after.unreadable == before.unreadable);
  const ps_unwind_mapping* m = nullptr;
  const uint64_t pc = reinterpret_cast<uint64_t>(&UnwindTestProbe);
  const ps_unwind_row* r = maps.Lookup(kTgid, pc, &m);
  REQUIRE(r != nullptr);
  CHECK(r == maps.Lookup(getpid(), pc, &m));
  void* w = dlsym(RTLD_DEFAULT, "write");
  REQUIRE(w != nullptr);
  CHECK(maps.Lookup(kTgid, reinterpret_cast<uint64_t>(w), &m) != nullptr);
}

// UnwindService loads a new image in its poll thread only when that builds nothing: every
// executable file pinned under an identity whose table is loaded, or whose build failed.
TEST_CASE("unwind: a snapshot loads without building only when every file's table is known",
          "[unwind]") {
  const proc::ProcessInfo info = SelfWithDescriptorlessPins();
  size_t executable_files = 0;
  for (size_t i = 0; i < info.maps.size(); ++i) {
    if (info.files[i] != nullptr && info.maps[i].executable()) ++executable_files;
  }
  REQUIRE(executable_files >= 2);  // this test binary and libc at least
  FakeMaps maps(1 << 20, 1024);
  UnwindTables tables(&maps);
  CHECK(!tables.LoadsWithoutBuilding(info));   // nothing built yet
  REQUIRE(tables.LoadProcess(getpid()).ok());  // builds this process's tables
  CHECK(tables.LoadsWithoutBuilding(info));
  // ... and the load then builds nothing (a process with no /proc entry: only the pins count).
  const UnwindTableStats before = tables.stats();
  REQUIRE(tables.LoadProcess(0x3ffffff0, /*start_ticks=*/1, /*exec_id=*/7, &info).ok());
  CHECK(tables.stats().tables_built == before.tables_built);
  CHECK(tables.stats().build_ns == before.build_ns);
  // A mapping with no pin (its file could not be pinned): a load would open it.
  proc::ProcessInfo unpinned = info;
  for (size_t i = 0; i < unpinned.maps.size(); ++i) {
    if (unpinned.maps[i].executable() && unpinned.files[i] != nullptr) {
      unpinned.files[i] = nullptr;
      break;
    }
  }
  CHECK(!tables.LoadsWithoutBuilding(unpinned));
  // A file never seen (another identity: another mtime) would be built.
  proc::ProcessInfo other = info;
  for (size_t i = 0; i < other.maps.size(); ++i) {
    if (!other.maps[i].executable() || other.files[i] == nullptr) continue;
    struct stat st = other.files[i]->stat();
    st.st_mtim.tv_nsec ^= 1;
    other.files[i] = std::make_shared<const proc::PinnedFile>(-1, st);
    break;
  }
  CHECK(!tables.LoadsWithoutBuilding(other));
  // Mappings without a file (anonymous, [vdso], [stack]) need no table of a file.
  proc::ProcessInfo anonymous;
  for (size_t i = 0; i < info.maps.size(); ++i) {
    if (!info.maps[i].file_backed()) {
      anonymous.maps.push_back(info.maps[i]);
      anonymous.files.push_back(nullptr);
    }
  }
  REQUIRE(!anonymous.maps.empty());
  CHECK(tables.LoadsWithoutBuilding(anonymous));
}

TEST_CASE("unwind: the row budget is never exceeded, unused tables are evicted LRU first", "[unwind]") {
  // Another program (sleep: its own binary, libc, ld.so), which then exits: its tables become
  // unused. The pipe closes on exec, so its maps are read after the exec.
  int p[2];
  REQUIRE(pipe2(p, O_CLOEXEC) == 0);
  pid_t child = fork();
  if (child == 0) {
    execl("/bin/sleep", "sleep", "100", nullptr);
    _exit(127);
  }
  REQUIRE(child > 0);
  close(p[1]);
  char c;
  REQUIRE(read(p[0], &c, 1) == 0);
  close(p[0]);
  FakeMaps big(1 << 20, 1024);
  uint32_t libc_rows = 0;
  {
    UnwindTables probe(&big);
    REQUIRE(probe.LoadProcess(child).ok());
    libc_rows = static_cast<uint32_t>(probe.stats().table_bytes / sizeof(ps_unwind_row));
  }
  // Room for the child's tables and nothing more.
  FakeMaps small(libc_rows + 16, 1024);
  UnwindTables tables(&small);
  REQUIRE(tables.LoadProcess(child).ok());
  const uint64_t built = tables.stats().tables_built;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  tables.SweepExited();
  CHECK(tables.stats().processes == 0);
  CHECK(small.procs_.empty());
  // This process needs more tables than fit: the child's (now unused) are evicted first, and
  // what still does not fit is counted, with its mappings left to frame pointers.
  tables.ReleaseQuarantine(INT64_MAX / 2, 0);
  REQUIRE(tables.LoadProcess(getpid()).ok());
  UnwindTableStats st = tables.stats();
  INFO("built " << st.tables_built << " evicted " << st.tables_evicted << " budget_full "
                << st.budget_full);
  CHECK(st.table_bytes <= st.table_budget_bytes);
  CHECK(st.tables_built > built);  // evicted rows were reused for new tables
  CHECK(st.tables_evicted >= 1);  // sleep's own table
  CHECK(st.budget_full > 0);
  // An evicted table's file entries go with it (its rows are reused): sleep's is gone.
  struct stat sleep_st {};
  REQUIRE(stat("/bin/sleep", &sleep_st) == 0);
  CHECK(small.files_.count({(uint64_t{major(sleep_st.st_dev)} << 20) | minor(sleep_st.st_dev),
                            sleep_st.st_ino}) == 0);
  CHECK(st.files == small.files_.size());
}

// A proc root whose entries are symlinks to /proc/<pid>: the test decides what each "tgid" is.
TEST_CASE("unwind: a sweep forgets unlisted processes at once, reused pids within a minute",
          "[unwind]") {
  char dir_template[] = "/tmp/parascope_procroot_XXXXXX";
  REQUIRE(mkdtemp(dir_template) != nullptr);
  const std::string root = dir_template;
  // The children are killed and reaped, and the root removed, however the test ends.
  struct Cleanup {
    std::string root;
    std::vector<pid_t> children;
    ~Cleanup() {
      for (pid_t pid : children) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
    }
  } cleanup{root, {}};
  auto child = [&] {
    pid_t pid = fork();
    if (pid == 0) {
      execl("/bin/sleep", "sleep", "100", nullptr);
      _exit(127);
    }
    if (pid > 0) cleanup.children.push_back(pid);
    return pid;
  };
  const pid_t a = child(), b = child();
  REQUIRE(a > 0);
  REQUIRE(b > 0);
  // Fake tgids 100 (a) and 200 (b), read once each has exec'd (its comm is "sleep").
  auto execd = [](pid_t pid) {
    auto comm = proc::ReadFileToString(absl::StrCat("/proc/", pid, "/comm"));
    return comm.ok() && *comm == "sleep\n";
  };
  for (int i = 0; i < 1000 && !(execd(a) && execd(b)); ++i) usleep(10000);
  REQUIRE(execd(a));
  REQUIRE(execd(b));
  REQUIRE(symlink(absl::StrCat("/proc/", a).c_str(), (root + "/100").c_str()) == 0);
  REQUIRE(symlink(absl::StrCat("/proc/", b).c_str(), (root + "/200").c_str()) == 0);
  FakeMaps maps(1 << 20, 1024);
  UnwindTables tables(&maps, root);
  REQUIRE(tables.LoadProcess(100).ok());
  REQUIRE(tables.LoadProcess(200).ok());
  REQUIRE(tables.stats().processes == 2);
  // 100 is no longer listed: forgotten by the next sweep, without reading its stat.
  REQUIRE(unlink((root + "/100").c_str()) == 0);
  // 200 is listed but is now another process, as a reused pid: a third child with another
  // start time than b. Start times are in clock ticks (10 ms): a process made in b's tick looks
  // like b (it was this process, and a run that forked within its first tick failed: 2 in 30
  // under ctest).
  auto start_ticks = [](pid_t pid) -> uint64_t {
    auto text = proc::ReadFileToString(absl::StrCat("/proc/", pid, "/stat"));
    if (!text.ok()) return 0;
    auto st = proc::ParseStat(*text);
    return st.ok() ? st->start_time_ticks : 0;
  };
  const uint64_t b_ticks = start_ticks(b);
  REQUIRE(b_ticks > 0);
  pid_t c = child();
  for (int i = 0; i < 100 && c > 0 && start_ticks(c) == b_ticks; ++i) {
    usleep(10000);  // into the next clock tick, then another child
    c = child();
  }
  REQUIRE(c > 0);
  REQUIRE(start_ticks(c) != b_ticks);
  REQUIRE(unlink((root + "/200").c_str()) == 0);
  REQUIRE(symlink(absl::StrCat("/proc/", c).c_str(), (root + "/200").c_str()) == 0);
  tables.SweepExited();
  CHECK(tables.stats().processes == 1);
  // The reused pid is found by the sweep that reads each listed process's stat.
  for (uint32_t i = 2; i < UnwindTables::kVerifyEverySweeps; ++i) tables.SweepExited();
  CHECK(tables.stats().processes == 1);
  tables.SweepExited();
  CHECK(tables.stats().processes == 0);
  CHECK(maps.procs_.empty());
}

}  // namespace parascope::unwind
