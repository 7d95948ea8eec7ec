// Symbolized frames that know nothing of pprof: what StackSymbolizer returns and profile/ turns
// into pprof Locations, Mappings and Functions (proto/profile.proto). Keeping them apart lets one
// symbolization serve every profile type and window, and lets profile/ depend on symbolize/
// without the reverse.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace parascope::symbolize {

// The object a frame's address lies in, as profile.proto's Mapping describes it: the kernel
// ("[kernel.kallsyms]"), an ELF file mapped by the process, a JIT perf map, or anonymous memory.
struct FrameMapping {
  uint64_t start = 0;        // first address (process virtual address; ELF vaddr in server mode)
  uint64_t limit = 0;        // one past the last address
  uint64_t file_offset = 0;  // bytes: file offset of `start`
  std::string filename;      // the path as the process sees it, "[anon]", a perf map's path
  std::string build_id;      // lowercase hex, "" if unknown
  bool has_functions = false;
};

// One function at a frame's address (profile.proto Line + Function).
struct FrameLine {
  std::string name;         // demangled
  std::string system_name;  // as in the symbol table
  std::string file;         // source file, "" if unknown
  int64_t line = 0;         // 0 if unknown
};

// Functions at one address, innermost (inlined) first, the function they were inlined into
// last. Shared: one symbolization serves every frame with that address.
using FrameLines = std::vector<FrameLine>;

// One frame of a stack.
struct Frame {
  uint64_t address = 0;                        // Location.address
  std::shared_ptr<const FrameMapping> mapping; // null: outside every known mapping
  std::shared_ptr<const FrameLines> lines;     // null or empty: not symbolized
};

// Approximate heap bytes of `lines` (for cache bounds).
size_t MemoryBytes(const FrameLines& lines);

}  // namespace parascope::symbolize
