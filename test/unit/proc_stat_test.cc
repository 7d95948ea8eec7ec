#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <limits>
#include <string>

#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"

namespace parascope::proc {
namespace {

ProcStat ParseFixture(const std::string& name) {
  absl::StatusOr<std::string> text =
      ReadFileToString(std::string(PS_FIXTURE_DIR) + "/proc/" + name);
  REQUIRE(text.ok());
  absl::StatusOr<ProcStat> st = ParseStat(*text);
  INFO(st.status().ToString());
  REQUIRE(st.ok());
  return *st;
}

TEST_CASE("ParseStat parses a typical stat line") {
  ProcStat st = ParseFixture("stat_simple.txt");
  CHECK(st.pid == 4242);
  CHECK(st.comm == "myserver");
  CHECK(st.state == 'S');
  CHECK(st.ppid == 1);
  CHECK(st.utime_ticks == 1234);
  CHECK(st.stime_ticks == 567);
  CHECK(st.num_threads == 17);
  CHECK(st.start_time_ticks == 123456);
}

TEST_CASE("ParseStat takes comm up to the last ')'") {
  ProcStat st = ParseFixture("stat_weird_comm.txt");
  CHECK(st.pid == 777);
  CHECK(st.comm == "a) b (c");
  CHECK(st.state == 'R');
  CHECK(st.ppid == 4242);
  CHECK(st.utime_ticks == 5);
  CHECK(st.stime_ticks == 0);
  CHECK(st.num_threads == 1);
  CHECK(st.start_time_ticks == 9876543210);
}

TEST_CASE("ParseStat handles an empty comm and no trailing newline") {
  auto st = ParseStat("12 () Z 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99");
  REQUIRE(st.ok());
  CHECK(st->comm.empty());
  CHECK(st->state == 'Z');
  CHECK(st->utime_ticks == 7);
  CHECK(st->stime_ticks == 8);
  CHECK(st->start_time_ticks == 99);
}

TEST_CASE("ParseStat rejects malformed text") {
  const char* bad = GENERATE("",
                             "12 foo S 1",                                           // no parens
                             "12 (foo S 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99",   // no ')'
                             "x (foo) S 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99",   // bad pid
                             "12 (foo) S 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0",     // 21 fields
                             "12 (foo) S 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 -5",  // start < 0
                             "12 (foo) S 1 0 0 0 -1 0 0 0 0 0 x 8 0 0 20 0 1 0 99",  // utime
                             "12 (foo) SS 1 0 0 0 -1 0 0 0 0 0 7 8 0 0 20 0 1 0 99");
  INFO(bad);
  auto st = ParseStat(bad);
  REQUIRE_FALSE(st.ok());
  CHECK(absl::IsInvalidArgument(st.status()));
}

TEST_CASE("USER_HZ conversions") {
  CHECK(kUserHz == 100);
  CHECK(static_cast<uint64_t>(sysconf(_SC_CLK_TCK)) == kUserHz);
  CHECK(TicksToNs(0) == 0);
  CHECK(TicksToNs(1) == 10'000'000);
  CHECK(TicksToNs(123456) == 1'234'560'000'000);
  CHECK(TicksToNs(std::numeric_limits<uint64_t>::max()) == std::numeric_limits<uint64_t>::max());
  CHECK(BootNsToTicks(0) == 0);
  CHECK(BootNsToTicks(9'999'999) == 0);
  CHECK(BootNsToTicks(10'000'000) == 1);
  CHECK(BootNsToTicks(1'234'565'432'100) == 123456);
  CHECK(BootNsToTicks(TicksToNs(9876543210)) == 9876543210);
}

}  // namespace
}  // namespace parascope::proc
