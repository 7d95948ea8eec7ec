#include "agent/symbolize/symbol_cache.h"

namespace parascope::symbolize {

size_t MemoryBytes(const FrameLines& lines) {
  size_t n = sizeof(FrameLines) + 32;  // the vector and its shared_ptr control block
  for (const FrameLine& l : lines) {
    n += sizeof(FrameLine) + l.name.capacity() + l.system_name.capacity() + l.file.capacity();
  }
  return n;
}

const CachedSymbol* SymbolCache::Find(const std::string& binary, uint64_t vaddr,
                                      int64_t now_ns) {
  auto it = index_.find(Key{binary, vaddr});
  if (it != index_.end() && it->second->symbol.expires_ns != 0 &&
      now_ns >= it->second->symbol.expires_ns) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
    it = index_.end();
  }
  if (it == index_.end()) {
    ++misses_;
    return nullptr;
  }
  ++hits_;
  lru_.splice(lru_.begin(), lru_, it->second);
  return &it->second->symbol;
}

void SymbolCache::EraseBinary(const std::string& binary) {
  for (auto it = lru_.begin(); it != lru_.end();) {
    if (it->key.binary == binary) {
      bytes_ -= it->bytes;
      index_.erase(it->key);
      it = lru_.erase(it);
    } else {
      ++it;
    }
  }
}

void SymbolCache::Insert(const std::string& binary, uint64_t vaddr, CachedSymbol symbol) {
  Key key{binary, vaddr};
  if (auto it = index_.find(key); it != index_.end()) {
    bytes_ -= it->second->bytes;
    lru_.erase(it->second);
    index_.erase(it);
  }
  // Entry, list node and index slot, the key's string, and the lines (shared with frames that
  // use them, but accounted here: the cache is what keeps them alive across windows).
  const size_t bytes = sizeof(Entry) + 2 * sizeof(void*) + sizeof(Key) + 16 +
                       binary.capacity() + MemoryBytes(*symbol.lines);
  lru_.push_front(Entry{std::move(key), std::move(symbol), bytes});
  index_.emplace(lru_.front().key, lru_.begin());
  bytes_ += bytes;
  while (bytes_ > max_bytes_ && lru_.size() > 1) {
    Entry& last = lru_.back();
    bytes_ -= last.bytes;
    index_.erase(last.key);
    lru_.pop_back();
    ++evictions_;
  }
}

}  // namespace parascope::symbolize
