// Helpers for absl's swiss tables (absl/container/internal/raw_hash_set.h).
#pragma once

#include <cstddef>

namespace parascope {

// Gives back the room of an absl flat_hash_map/set that emptied: erase() never shrinks one, so
// a per-process map that grew through a burst of short-lived processes keeps its peak
// capacity (the slots, 2^k - 1 of them, each sizeof(value) + 1 control byte) after the
// processes are gone. When fewer than a quarter of more than 64 slots are in use, rehash(0)
// reallocates to fit the current size (absl 20220623 raw_hash_set::rehash: a capacity
// normalized from the size alone, or no table when empty). O(size)
// when it does, which a map sparse after a sweep repays by its smaller scans; nothing
// otherwise. Returns true when it shrank.
template <typename Table>
bool ShrinkIfSparse(Table& t) {
  const size_t capacity = t.capacity();
  if (capacity <= 64 || t.size() * 4 >= capacity) return false;
  t.rehash(0);
  return t.capacity() < capacity;
}

}  // namespace parascope
