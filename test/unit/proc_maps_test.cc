#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "agent/proc/maps.h"
#include "agent/proc/read_file.h"

namespace parascope::proc {
namespace {

std::vector<MapEntry> ParseFixture(const std::string& name) {
  absl::StatusOr<std::string> text =
      ReadFileToString(std::string(PS_FIXTURE_DIR) + "/proc/" + name);
  REQUIRE(text.ok());
  absl::StatusOr<std::vector<MapEntry>> maps = ParseMaps(*text);
  INFO(maps.status().ToString());
  REQUIRE(maps.ok());
  return *maps;
}

TEST_CASE("ParseMaps parses a PIE process's maps") {
  std::vector<MapEntry> m = ParseFixture("maps_pie.txt");
  REQUIRE(m.size() == 30);

  SECTION("executable text segment") {
    const MapEntry& e = m[1];
    CHECK(e.start == 0x55d4c8a3f000);
    CHECK(e.end == 0x55d4c8a52000);
    CHECK(e.perms == "r-xp");
    CHECK(e.offset == 0x4000);
    CHECK(e.dev_major == 0xfd);
    CHECK(e.dev_minor == 0x01);
    CHECK(e.inode == 1835021);
    CHECK(e.path == "/usr/bin/myserver");
    CHECK_FALSE(e.deleted);
    CHECK(e.executable());
    CHECK(e.file_backed());
    CHECK_FALSE(m[0].executable());
    CHECK(m[4].perms == "rw-p");
    CHECK(m[4].offset == 0x1e000);
  }
  SECTION("heap and anonymous mappings") {
    CHECK(m[5].path == "[heap]");
    CHECK(m[5].start == 0x55d4c9f0e000);
    CHECK(m[5].inode == 0);
    CHECK_FALSE(m[5].file_backed());
    CHECK(m[6].path.empty());
    CHECK(m[6].start == 0x7f1b2c000000);
    CHECK(m[6].end == 0x7f1b2c021000);
    CHECK(m[6].dev_major == 0);
    CHECK(m[6].dev_minor == 0);
    CHECK_FALSE(m[6].file_backed());
    CHECK(m[7].perms == "---p");
    CHECK(m[7].path.empty());
  }
  SECTION("deleted files and memfds") {
    CHECK(m[8].path == "/memfd:jit-cache");
    CHECK(m[8].deleted);
    CHECK(m[8].file_backed());
    CHECK(m[8].executable());
    CHECK(m[8].inode == 4097);
    CHECK(m[9].path == "/tmp/libjit-7781.so");
    CHECK(m[9].deleted);
    CHECK(m[9].offset == 0x1000);
    CHECK(m[9].start == 0x7f1b33c00000);
    CHECK(m[9].end == 0x7f1b33c41000);
    CHECK(m[20].path == "/SYSV00000000");
    CHECK(m[20].perms == "---s");
    CHECK(m[20].deleted);
  }
  SECTION("path with a space and a 3-digit hex major") {
    const MapEntry& e = m[11];
    CHECK(e.path == "/opt/My App/lib/libplugin.so");
    CHECK(e.dev_major == 0x103);
    CHECK(e.dev_minor == 2);
    CHECK(e.inode == 524301);
    CHECK(e.offset == 0x5000);
    CHECK(e.executable());
    CHECK_FALSE(e.deleted);
  }
  SECTION("shared libraries") {
    CHECK(m[15].path == "/usr/lib/x86_64-linux-gnu/libc.so.6");
    CHECK(m[15].offset == 0x26000);
    CHECK(m[15].executable());
    CHECK(m[22].path == "/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2");
    CHECK(m[22].start == 0x7f1b3422d000);
  }
  SECTION("pseudo mappings") {
    CHECK(m[26].path == "[stack]");
    CHECK(m[27].path == "[vvar]");
    CHECK_FALSE(m[27].executable());
    CHECK(m[28].path == "[vdso]");
    CHECK(m[28].executable());
    CHECK_FALSE(m[28].file_backed());
    CHECK(m[29].path == "[vsyscall]");
    CHECK(m[29].start == 0xffffffffff600000);
    CHECK(m[29].end == 0xffffffffff601000);
    CHECK(m[29].perms == "--xp");
  }
  SECTION("entries are in ascending address order") {
    for (size_t i = 1; i < m.size(); ++i) CHECK(m[i - 1].end <= m[i].start);
  }
}

TEST_CASE("ParseMaps edge cases") {
  SECTION("empty text") {
    auto maps = ParseMaps("");
    REQUIRE(maps.ok());
    CHECK(maps->empty());
  }
  SECTION("no trailing newline, anonymous without trailing space") {
    auto maps = ParseMaps(
        "00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/dbus-daemon\n"
        "00e03000-00e24000 rw-p 00000000 00:00 0");
    REQUIRE(maps.ok());
    REQUIRE(maps->size() == 2);
    CHECK((*maps)[0].start == 0x400000);
    CHECK((*maps)[0].end == 0x452000);
    CHECK((*maps)[0].dev_major == 8);
    CHECK((*maps)[0].dev_minor == 2);
    CHECK((*maps)[0].path == "/usr/bin/dbus-daemon");
    CHECK((*maps)[1].path.empty());
    CHECK((*maps)[1].inode == 0);
  }
  SECTION("named anonymous mapping and a path ending in spaces") {
    auto maps = ParseMaps(
        "7f0000000000-7f0000001000 rw-p 00000000 00:00 0    [anon:jemalloc]\n"
        "7f0000001000-7f0000002000 r--p 00000000 fd:01 12   /a b  \n");
    REQUIRE(maps.ok());
    CHECK((*maps)[0].path == "[anon:jemalloc]");
    CHECK((*maps)[1].path == "/a b  ");
  }
  SECTION("full 64-bit offset") {
    auto maps = ParseMaps("1000-2000 r--s fffffffffffff000 00:05 7 /dev/mem\n");
    REQUIRE(maps.ok());
    CHECK((*maps)[0].offset == 0xfffffffffffff000);
    CHECK((*maps)[0].perms == "r--s");
  }
  SECTION("MapEntry helpers on an empty entry") {
    MapEntry e;
    CHECK_FALSE(e.executable());
    CHECK_FALSE(e.file_backed());
  }
}

TEST_CASE("ParseMaps rejects malformed lines naming the line number") {
  const std::string good = "1000-2000 r-xp 00000000 fd:01 12 /bin/x\n";
  const char* bad = GENERATE("1000 r-xp 00000000 fd:01 12 /bin/x",        // no '-'
                             "1000-zz00 r-xp 00000000 fd:01 12 /bin/x",   // non-hex end
                             "-2000 r-xp 00000000 fd:01 12 /bin/x",       // empty start
                             "2000-1000 r-xp 00000000 fd:01 12 /bin/x",   // start > end
                             "1000-1000 r-xp 00000000 fd:01 12 /bin/x",   // empty range
                             "1000-2000 r-x 00000000 fd:01 12 /bin/x",    // 3-char perms
                             "1000-2000 r-xp 0000g000 fd:01 12 /bin/x",   // non-hex offset
                             "1000-2000 r-xp 00000000 fd01 12 /bin/x",    // no ':'
                             "1000-2000 r-xp 00000000 fd:01 1x2 /bin/x",  // non-decimal inode
                             "1000-2000 r-xp 00000000 fd:01",             // no inode
                             "1000-2000 r-xp",                            // truncated
                             "10000000000000000-10000000000000001 r-xp 0 0:0 0",  // overflow
                             "garbage");
  auto maps = ParseMaps(good + bad + "\n" + good);
  INFO(bad);
  REQUIRE_FALSE(maps.ok());
  CHECK(absl::IsInvalidArgument(maps.status()));
  CHECK_THAT(std::string(maps.status().message()), Catch::Contains("line 2"));
}

}  // namespace
}  // namespace parascope::proc
