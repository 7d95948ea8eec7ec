// Symbolization results of user addresses, kept across windows so that an address is looked up
// (ELF symbol table, DWARF lines and inlined functions, separate debug file) once per binary,
// not once per process and window.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "agent/symbolize/frame.h"

namespace parascope::symbolize {

// Where a cached result came from (for the frames_symbolized counters).
enum class SymbolSource : uint8_t {
  kNone = 0,          // no symbol covers the address
  kElfSymtab = 1,     // the binary's own symbol table
  kDwarf = 2,         // DWARF source lines / inlined functions
  kDebugSymtab = 3,   // a separate debug file's or MiniDebugInfo's symbol table
};

struct CachedSymbol {
  std::shared_ptr<const FrameLines> lines;  // never null; empty when source is kNone
  SymbolSource source = SymbolSource::kNone;
  // Monotonic ns after which the entry is looked up again (0: never). For results that a debug
  // file installed later (a -dbgsym package, a debuginfod fetch) would improve.
  int64_t expires_ns = 0;
};

// A bounded LRU map (binary, ELF virtual address) -> CachedSymbol.
//
// `binary` identifies file contents, not a path: "b:<build id>" when the ELF file has one (so
// copies of one build in many containers share entries), else "i:<ElfFile::instance_id()>" (a
// file rewritten in place is opened anew by ElfCache and gets a new id; old entries age out). The address is the looked-up ELF
// vaddr (the pc for a leaf, the return address - 1 for a caller). Bounded by accounted bytes
// (MemoryBytes of the lines, the key and fixed overhead); least recently used entries go first.
// Not thread-safe (used by the flush thread).
class SymbolCache {
 public:
  static constexpr size_t kDefaultMaxBytes = size_t{16} << 20;  // 16 MiB
  explicit SymbolCache(size_t max_bytes = kDefaultMaxBytes) : max_bytes_(max_bytes) {}

  // The cached result, made most recently used; null on a miss. An entry expired at now_ns
  // (monotonic) is dropped and misses.
  const CachedSymbol* Find(const std::string& binary, uint64_t vaddr, int64_t now_ns = 0);
  // Drops every entry of `binary` (O(entries); for the rare event of its debug file arriving).
  void EraseBinary(const std::string& binary);
  // Inserts (or replaces) a result and evicts to the bound. The newest entry is always kept.
  void Insert(const std::string& binary, uint64_t vaddr, CachedSymbol symbol);

  size_t size() const { return index_.size(); }
  size_t bytes() const { return bytes_; }
  uint64_t hits() const { return hits_; }
  uint64_t misses() const { return misses_; }
  uint64_t evictions() const { return evictions_; }

 private:
  struct Key {
    std::string binary;
    uint64_t vaddr;
    friend bool operator==(const Key& a, const Key& b) {
      return a.vaddr == b.vaddr && a.binary == b.binary;
    }
    template <typename H>
    friend H AbslHashValue(H h, const Key& k) {
      return H::combine(std::move(h), k.binary, k.vaddr);
    }
  };
  struct Entry {
    Key key;
    CachedSymbol symbol;
    size_t bytes;
  };
  using List = std::list<Entry>;

  const size_t max_bytes_;
  List lru_;  // front = most recently used
  absl::flat_hash_map<Key, List::iterator> index_;
  size_t bytes_ = 0;
  uint64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

}  // namespace parascope::symbolize
