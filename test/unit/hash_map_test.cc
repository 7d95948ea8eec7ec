// ShrinkIfSparse (agent/util/hash_map.h): a table emptied by erase() gives its room back, a
// dense or small one is left alone, and what stays is intact.
#include "agent/util/hash_map.h"

#include <catch2/catch.hpp>
#include <cstdint>

#include "absl/container/flat_hash_map.h"

namespace parascope {
namespace {

TEST_CASE("ShrinkIfSparse: a table emptied by erase shrinks, its entries intact", "[unit]") {
  absl::flat_hash_map<uint64_t, uint64_t> m;
  for (uint64_t i = 0; i < 10000; ++i) m[i] = i * 3;
  const size_t peak = m.capacity();
  REQUIRE(peak >= 10000);
  CHECK_FALSE(ShrinkIfSparse(m));  // dense: untouched
  CHECK(m.capacity() == peak);
  absl::erase_if(m, [](const auto& kv) { return kv.first % 100 != 0; });
  REQUIRE(m.size() == 100);
  CHECK(m.capacity() == peak);  // erase keeps the room: what the helper is for
  CHECK(ShrinkIfSparse(m));
  CHECK(m.capacity() < 256);
  CHECK(m.size() == 100);
  for (uint64_t i = 0; i < 10000; i += 100) {
    auto it = m.find(i);
    REQUIRE(it != m.end());
    CHECK(it->second == i * 3);
  }
  // Small tables are left alone, even empty ones.
  absl::flat_hash_map<uint64_t, uint64_t> small;
  for (uint64_t i = 0; i < 50; ++i) small[i] = i;
  small.clear();
  CHECK_FALSE(ShrinkIfSparse(small));
}

}  // namespace
}  // namespace parascope
