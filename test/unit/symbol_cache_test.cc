#include "agent/symbolize/symbol_cache.h"

#include <catch2/catch.hpp>

namespace parascope::symbolize {
namespace {

CachedSymbol Named(const std::string& name) {
  return {std::make_shared<const FrameLines>(FrameLines{{name, name, "", 0}}),
          SymbolSource::kElfSymtab};
}

TEST_CASE("symbol cache: hits by binary and address, not by either alone", "[symbolize]") {
  SymbolCache cache;
  cache.Insert("b:aa", 0x1000, Named("f"));
  REQUIRE(cache.Find("b:aa", 0x1000) != nullptr);
  CHECK(cache.Find("b:aa", 0x1000)->lines->at(0).name == "f");
  CHECK(cache.Find("b:bb", 0x1000) == nullptr);
  CHECK(cache.Find("b:aa", 0x1001) == nullptr);
  CHECK(cache.hits() == 2);
  CHECK(cache.misses() == 2);
  // Replacing an entry keeps one entry and its bytes.
  const size_t bytes = cache.bytes();
  cache.Insert("b:aa", 0x1000, Named("g"));
  CHECK(cache.size() == 1);
  CHECK(cache.bytes() == bytes);
  CHECK(cache.Find("b:aa", 0x1000)->lines->at(0).name == "g");
}

TEST_CASE("symbol cache: bounded in bytes, least recently used evicted first", "[symbolize]") {
  SymbolCache probe;
  probe.Insert("b:aa", 0, Named("function_with_a_long_enough_name"));
  const size_t entry = probe.bytes();
  // Room for three entries of that size.
  SymbolCache cache(3 * entry + entry / 2);
  cache.Insert("b:aa", 1, Named("function_with_a_long_enough_name"));
  cache.Insert("b:aa", 2, Named("function_with_a_long_enough_name"));
  cache.Insert("b:aa", 3, Named("function_with_a_long_enough_name"));
  REQUIRE(cache.Find("b:aa", 1) != nullptr);  // 1 is now the most recently used
  cache.Insert("b:aa", 4, Named("function_with_a_long_enough_name"));
  CHECK(cache.size() == 3);
  CHECK(cache.evictions() == 1);
  CHECK(cache.Find("b:aa", 2) == nullptr);  // the least recently used went
  CHECK(cache.Find("b:aa", 1) != nullptr);
  CHECK(cache.Find("b:aa", 3) != nullptr);
  CHECK(cache.Find("b:aa", 4) != nullptr);
  CHECK(cache.bytes() <= 3 * entry + entry / 2);
  // One entry larger than the bound is kept alone.
  SymbolCache tiny(1);
  tiny.Insert("b:aa", 1, Named("x"));
  tiny.Insert("b:aa", 2, Named("y"));
  CHECK(tiny.size() == 1);
  CHECK(tiny.Find("b:aa", 2) != nullptr);
}

TEST_CASE("symbol cache: entries expire, and a binary's entries can be dropped", "[symbolize]") {
  SymbolCache cache;
  CachedSymbol expiring = Named("elf_only");
  expiring.expires_ns = 1000;
  cache.Insert("b:aa", 1, std::move(expiring));
  cache.Insert("b:aa", 2, Named("f"));
  cache.Insert("b:bb", 1, Named("g"));
  CHECK(cache.Find("b:aa", 1, 999) != nullptr);
  CHECK(cache.Find("b:aa", 1, 1000) == nullptr);  // expired: dropped
  CHECK(cache.size() == 2);
  CHECK(cache.Find("b:aa", 2, 1 << 30) != nullptr);  // 0 = never expires
  const size_t bb_bytes = cache.bytes() / 2;
  cache.EraseBinary("b:aa");
  CHECK(cache.size() == 1);
  CHECK(cache.Find("b:aa", 2) == nullptr);
  CHECK(cache.Find("b:bb", 1) != nullptr);
  CHECK(cache.bytes() == bb_bytes);
}

}  // namespace
}  // namespace parascope::symbolize
