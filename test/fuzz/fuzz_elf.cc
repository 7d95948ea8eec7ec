// libFuzzer target: the ELF symbol reader (ElfFile::Open, libelf underneath) on arbitrary bytes.
// The agent opens every binary a profiled process maps, so the file is untrusted. The input is
// written to a memfd and opened by its /proc/self/fd path, as the agent opens
// /proc/<pid>/root/<path>; on success the accessors run on addresses taken from the input.
#include <cstddef>
#include <cstdint>
#include <optional>

#include "agent/symbolize/elf_file.h"
#include "fuzz_util.h"

using parascope::fuzz::Le64;
using parascope::symbolize::ElfFile;
using parascope::symbolize::ElfSymbol;

namespace {

void Probe(const ElfFile& elf, uint64_t vaddr) {
  for (uint64_t addr : {vaddr, vaddr - 1, vaddr + 1}) {
    if (const ElfSymbol* s = elf.Lookup(addr)) {
      PS_FUZZ_CHECK(addr >= s->start && addr - s->start < s->size);
      PS_FUZZ_CHECK(elf.Lookup(s->start) == s);
      PS_FUZZ_CHECK(!s->system_name.empty());
      (void)s->name();  // the demanglers, on an untrusted name
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static parascope::fuzz::MemFile file("fuzz_elf");
  file.Set(data, size);
  auto elf = ElfFile::Open(file.path());
  if (!elf.ok()) return 0;
  const ElfFile& f = **elf;
  const std::string& id = f.build_id();
  PS_FUZZ_CHECK(id.size() % 2 == 0);
  PS_FUZZ_CHECK(id.find_first_not_of("0123456789abcdef") == std::string::npos);
  (void)f.is_pie_or_dso();
  (void)f.has_symtab();
  PS_FUZZ_CHECK(f.memory_bytes() > 0);

  // e_entry (offset 24 of an ELF64 header), words from the middle and end of the input, and file
  // offsets mapped through the PT_LOAD segments.
  const uint64_t words[] = {Le64(data, size, 24), Le64(data, size, size / 2),
                            Le64(data, size, size >= 8 ? size - 8 : 0), 0, ~uint64_t{0}};
  for (uint64_t w : words) Probe(f, w);
  const uint64_t offsets[] = {0, size / 3, size / 2, size - 1, Le64(data, size, 32), words[1]};
  for (uint64_t off : offsets) {
    if (std::optional<uint64_t> vaddr = f.FileOffsetToVaddr(off)) Probe(f, *vaddr);
  }
  return 0;
}
