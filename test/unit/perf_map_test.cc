#include "agent/symbolize/perf_map.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace parascope::symbolize {
namespace {

TEST_CASE("ParsePerfMapLines: blank, half-written and space-containing names") {
  // As Node, the JVM's perf agent and Python's -X perf write them, plus damage.
  const std::string text =
      "7fa178005b80 130 JS:^hotLoopFunction /tmp/lc/hot.js:1:25\n"
      "\n"
      "   \n"
      "0x7fa178006180 0x2c4 LazyCompile:*fn with spaces\tand a tab\n"
      "1000 10 \n"                       // empty name
      "not a line at all\n"              // invalid
      "zz 10 bad_start\n"                // invalid hex
      "2000 0 zero_size\n"               // invalid: no code
      "ffffffffffffffff 10 wraps\n"      // invalid: start + size overflows
      "3000 20 py::main:/x.py\r\n"       // CRLF
      "4000 40 half-writ";               // no newline yet
  std::vector<PerfMapSymbol> syms;
  PerfMapParseStats stats;
  size_t used = ParsePerfMapLines(text, &syms, &stats);
  CHECK(used == text.size() - std::string("4000 40 half-writ").size());
  REQUIRE(syms.size() == 4);
  CHECK(syms[0].start == 0x7fa178005b80);
  CHECK(syms[0].size == 0x130);
  CHECK(syms[0].name == "JS:^hotLoopFunction /tmp/lc/hot.js:1:25");
  CHECK(syms[1].start == 0x7fa178006180);
  CHECK(syms[1].size == 0x2c4);
  CHECK(syms[1].name == "LazyCompile:*fn with spaces\tand a tab");
  CHECK(syms[2].name == "[jit 0x1000]");
  CHECK(syms[3].name == "py::main:/x.py");
  CHECK(stats.symbols == 4);
  CHECK(stats.invalid == 4);

  // The rest, once written, parses from where the last call stopped.
  std::vector<PerfMapSymbol> more;
  CHECK(ParsePerfMapLines("4000 40 half-written\n", &more, &stats) == 21);
  REQUIRE(more.size() == 1);
  CHECK(more[0].name == "half-written");
}

TEST_CASE("PerfMap reads what the JIT appends and prefers the latest code") {
  std::string path = (std::filesystem::temp_directory_path() / "ps-perfmap-XXXXXX").string();
  int wfd = mkstemp(path.data());
  REQUIRE(wfd >= 0);
  auto append = [&](const std::string& s) { REQUIRE(write(wfd, s.data(), s.size()) == (ssize_t)s.size()); };
  append("1000 100 first\n2000 100 second\n30");
  int rfd = open(path.c_str(), O_RDONLY);
  REQUIRE(rfd >= 0);
  PerfMap map(rfd, "/tmp/perf-1.map");
  REQUIRE(map.Refresh(1 << 20).ok());
  REQUIRE(map.Lookup(0x1000) != nullptr);
  CHECK(map.Lookup(0x1000)->name == "first");
  CHECK(map.Lookup(0x10ff)->name == "first");
  CHECK(map.Lookup(0x1100) == nullptr);
  CHECK(map.Lookup(0x2050)->name == "second");
  CHECK(map.Lookup(0x3000) == nullptr);  // half-written
  // The JIT finishes the line and replaces "first" with new code at an overlapping address.
  append("00 10 third\n1080 40 first v2\n");
  REQUIRE(map.Refresh(1 << 20).ok());
  CHECK(map.Lookup(0x3005)->name == "third");
  CHECK(map.Lookup(0x1090)->name == "first v2");
  CHECK(map.Lookup(0x1010)->name == "first");
  CHECK(map.stats().symbols == 4);
  CHECK(map.stats().invalid == 0);
  CHECK(map.path() == "/tmp/perf-1.map");
  CHECK(map.memory_bytes() > 0);
  close(wfd);
  std::filesystem::remove(path);
}

TEST_CASE("PerfMap stops at its byte bound") {
  std::string path = (std::filesystem::temp_directory_path() / "ps-perfmap-XXXXXX").string();
  int wfd = mkstemp(path.data());
  REQUIRE(wfd >= 0);
  std::string text;
  for (int i = 0; i < 1000; ++i) text += "1" + std::to_string(100000 + i) + "0 10 sym\n";
  REQUIRE(write(wfd, text.data(), text.size()) == (ssize_t)text.size());
  PerfMap map(open(path.c_str(), O_RDONLY));
  REQUIRE(map.Refresh(4096).ok());
  CHECK(map.truncated());
  CHECK(map.stats().symbols < 1000);
  CHECK(map.stats().symbols > 0);
  close(wfd);
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace parascope::symbolize
