#include "agent/config/config.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "agent/bpf/perf_event.h"
#include "agent/collect/window_clock.h"
#include "agent/config/config_file.h"
#include "agent/config/flags.h"

ABSL_FLAG(int32_t, ps_test_frequency, 19, "test flag");
ABSL_FLAG(absl::Duration, ps_test_interval, absl::Seconds(15), "test flag");
ABSL_FLAG(bool, ps_test_switch, false, "test flag");
ABSL_FLAG(std::vector<std::string>, ps_test_list, {}, "test flag");

namespace parascope {
namespace {

absl::Status Parse(std::vector<std::string> args, std::vector<std::string>* positional = nullptr) {
  std::vector<char*> argv;
  args.insert(args.begin(), "parascope");
  for (auto& a : args) argv.push_back(a.data());
  std::vector<std::string> pos;
  bool help = false;
  return ParseFlags(argv.size(), argv.data(), positional ? positional : &pos, &help);
}

}  // namespace

TEST_CASE("ParseFlags accepts SPEC's dashed names and Abseil types", "[config]") {
  REQUIRE(Parse({"--ps-test-frequency=499", "--ps_test_interval", "2s", "--ps-test-switch"}).ok());
  CHECK(absl::GetFlag(FLAGS_ps_test_frequency) == 499);
  CHECK(absl::GetFlag(FLAGS_ps_test_interval) == absl::Seconds(2));
  CHECK(absl::GetFlag(FLAGS_ps_test_switch));
  REQUIRE(Parse({"--nops-test-switch"}).ok());
  CHECK(!absl::GetFlag(FLAGS_ps_test_switch));
  std::vector<std::string> pos;
  REQUIRE(Parse({"extra", "--", "--ps-test-frequency=1"}, &pos).ok());
  CHECK(pos == std::vector<std::string>{"extra", "--ps-test-frequency=1"});
  CHECK(absl::GetFlag(FLAGS_ps_test_frequency) == 499);
}

TEST_CASE("ParseFlags hands the arguments after -- to command mode", "[config]") {
  std::vector<std::string> args = {"parascope", "--ps-test-frequency=7", "--", "make", "-j2",
                                   "--ps-test-frequency=1"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::vector<std::string> pos, command;
  bool help = false;
  REQUIRE(ParseFlags(argv.size(), argv.data(), &pos, &help, &command).ok());
  CHECK(pos.empty());
  CHECK(command == std::vector<std::string>{"make", "-j2", "--ps-test-frequency=1"});
  CHECK(absl::GetFlag(FLAGS_ps_test_frequency) == 7);
}

TEST_CASE("Config::Validate: --latency-group and command mode combinations", "[config]") {
  Config c;
  c.latency_group = Config::LatencyGroup::kTree;
  CHECK(absl::StartsWith(c.Validate().message(), "--latency-group: tree needs command mode"));
  c.command = {"make"};
  CHECK(c.Validate().ok());
  c.pids = {1};
  CHECK(absl::StartsWith(c.Validate().message(), "--pid:"));
  c = Config();
  c.latency_group = Config::LatencyGroup::kCgroup;
  CHECK(c.Validate().ok());
  c.profiles = *ParseProfileTypes("cpu");
  CHECK(absl::StartsWith(c.Validate().message(), "--latency-group: cgroup needs"));
}

TEST_CASE("ParseFlags errors name the flag as spelled", "[config]") {
  absl::Status s = Parse({"--ps-test-frequency=abc"});
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(absl::StartsWith(s.message(), "--ps-test-frequency:"));
  s = Parse({"--ps-test-interval=soon"});
  CHECK(absl::StartsWith(s.message(), "--ps-test-interval:"));
  s = Parse({"--bogus=1"});
  CHECK(s.message() == "--bogus: unknown flag");
  s = Parse({"--ps-test-frequency"});
  CHECK(s.message() == "--ps-test-frequency: missing value");
}

TEST_CASE("Config::Validate checks ranges and names the flag", "[config]") {
  Config c;
  CHECK(c.Validate().ok());
  c.sampling_frequency_hz = 0;
  CHECK(absl::StartsWith(c.Validate().message(), "--sampling-frequency:"));
  c = Config();
  c.collect_interval = absl::Milliseconds(10);
  CHECK(absl::StartsWith(c.Validate().message(), "--collect-interval:"));
  c = Config();
  c.duration = -absl::Seconds(1);
  CHECK(absl::StartsWith(c.Validate().message(), "--duration:"));
  c = Config();
  c.output_max_new_processes = -1;
  CHECK(absl::StartsWith(c.Validate().message(), "--output-max-new-processes:"));
  c.output_max_new_processes = 0;
  CHECK(c.Validate().ok());
  c = Config();
  c.off_cpu_stack_cpu_budget = -0.1;
  CHECK(absl::StartsWith(c.Validate().message(), "--off-cpu-stack-cpu-budget:"));
  c.off_cpu_stack_cpu_budget = 100.5;
  CHECK(absl::StartsWith(c.Validate().message(), "--off-cpu-stack-cpu-budget:"));
  c.off_cpu_stack_cpu_budget = std::nan("");
  CHECK(absl::StartsWith(c.Validate().message(), "--off-cpu-stack-cpu-budget:"));
  c.off_cpu_stack_cpu_budget = 0;
  CHECK(c.Validate().ok());
}

TEST_CASE("Repeated list flags accumulate and K=V items parse", "[config]") {
  REQUIRE(Parse({"--ps-test-list=A=1", "--ps-test-list", "B=2=x"}).ok());
  CHECK(absl::GetFlag(FLAGS_ps_test_list) == std::vector<std::string>{"A=1", "B=2=x"});
  auto kv = ParseKeyValues(absl::GetFlag(FLAGS_ps_test_list));
  REQUIRE(kv.ok());
  CHECK(*kv == std::vector<std::pair<std::string, std::string>>{{"A", "1"}, {"B", "2=x"}});
  CHECK(!ParseKeyValues({"novalue"}).ok());
  CHECK(!ParseKeyValues({"=v"}).ok());
  Config c;
  c.remote_url = "ftp://x";
  CHECK(absl::StartsWith(c.Validate().message(), "--remote-url:"));
  c.remote_url = "http://127.0.0.1:4040";
  c.remote_protocol = "udp";
  CHECK(absl::StartsWith(c.Validate().message(), "--remote-protocol:"));
}

TEST_CASE("debuginfod flags: URLs split on spaces, validated with the flag named", "[config]") {
  CHECK(SplitUrls("").empty());
  CHECK(SplitUrls("  http://a:8002  https://b/\tfile:///srv ") ==
        std::vector<std::string>{"http://a:8002", "https://b/", "file:///srv"});
  Config c;
  CHECK(c.debuginfod_urls.empty());  // off by default
  CHECK(c.debuginfod_cache_dir == "/var/cache/parascope/debuginfod");
  CHECK(c.debuginfod_cache_max_bytes == int64_t{1} << 30);
  c.debuginfod_urls = SplitUrls("http://a:8002 https://b");
  CHECK(c.Validate().ok());
  c.debuginfod_urls = {"http://a", "debuginfod.example.org"};
  CHECK(absl::StartsWith(c.Validate().message(), "--debuginfod-urls: 'debuginfod.example.org'"));
  c.debuginfod_urls = {"http://a"};
  c.symbolize_server = true;
  CHECK(absl::StartsWith(c.Validate().message(), "--debuginfod-urls:"));
  c = Config();
  c.debuginfod_cache_dir = "cache";
  CHECK(absl::StartsWith(c.Validate().message(), "--debuginfod-cache-dir:"));
  c = Config();
  c.debuginfod_cache_max_bytes = 1000;
  CHECK(absl::StartsWith(c.Validate().message(), "--debuginfod-cache-max-bytes:"));
  c.debuginfod_cache_max_bytes = 1 << 20;
  CHECK(c.Validate().ok());
  c.debug_dirs = {"/usr/lib/debug", "debug"};
  CHECK(absl::StartsWith(c.Validate().message(), "--debug-dirs:"));
}

TEST_CASE("ParsePidList", "[config]") {
  CHECK(*ParsePidList("") == std::vector<uint32_t>{});
  CHECK(*ParsePidList("1,23,456") == std::vector<uint32_t>{1, 23, 456});
  CHECK(!ParsePidList("1,,2").ok());
  CHECK(!ParsePidList("0").ok());
  CHECK(!ParsePidList("12x").ok());
  CHECK(!ParsePidList("-3").ok());
}

TEST_CASE("ParseCpuList reads kernel CPU lists", "[config]") {
  CHECK(*ParseCpuList("0-3,8,10-11\n") == std::vector<int>{0, 1, 2, 3, 8, 10, 11});
  CHECK(*ParseCpuList("0") == std::vector<int>{0});
  CHECK(!ParseCpuList("3-1").ok());
  CHECK(!ParseCpuList("a").ok());
}

TEST_CASE("WindowSchedule keeps a drift-free grid and cuts the last window", "[collect]") {
  const int64_t s = 1000;
  WindowSchedule w(0, s, 2500);
  CHECK(w.boundary_ns() == 1000);
  CHECK(!w.final());
  w.Advance(1003);  // drained a little late: next boundary stays on the grid
  CHECK(w.boundary_ns() == 2000);
  w.Advance(2001);
  CHECK(w.boundary_ns() == 2500);
  CHECK(w.final());
  WindowSchedule slow(0, s, 0);
  slow.Advance(3500);  // fell behind by more than a window: skip passed boundaries
  CHECK(slow.boundary_ns() == 4000);
  CHECK(!slow.final());
}

}  // namespace parascope

namespace parascope {
namespace {

// A YAML file in a fresh temporary directory.
std::string WriteYaml(const std::string& text) {
  char dir[] = "/tmp/ps_config_test_XXXXXX";
  REQUIRE(mkdtemp(dir) != nullptr);
  std::string path = std::string(dir) + "/agent.yaml";
  FILE* f = fopen(path.c_str(), "w");
  REQUIRE(f != nullptr);
  fputs(text.c_str(), f);
  fclose(f);
  return path;
}

}  // namespace

TEST_CASE("ApplyConfigFile sets flags by name, lists from sequences, and flags win after it",
          "[config]") {
  std::string path = WriteYaml(
      "# comment\nps-test-frequency: 97\nps_test_interval: 3s\nps-test-switch: true\n"
      "ps-test-list: [a=1, b=2]\n");
  std::vector<std::string> keys;
  REQUIRE(ApplyConfigFile(path, "test/unit/config_test.cc", &keys).ok());
  CHECK(keys == std::vector<std::string>{"ps_test_frequency", "ps_test_interval",
                                         "ps_test_switch", "ps_test_list"});
  CHECK(absl::GetFlag(FLAGS_ps_test_frequency) == 97);
  CHECK(absl::GetFlag(FLAGS_ps_test_interval) == absl::Seconds(3));
  CHECK(absl::GetFlag(FLAGS_ps_test_switch));
  CHECK(absl::GetFlag(FLAGS_ps_test_list) == std::vector<std::string>{"a=1", "b=2"});
  // The command line, parsed after the file, replaces its values (a list too, not appended).
  REQUIRE(Parse({"--ps-test-frequency=5", "--ps-test-list=c=3"}).ok());
  CHECK(absl::GetFlag(FLAGS_ps_test_frequency) == 5);
  CHECK(absl::GetFlag(FLAGS_ps_test_list) == std::vector<std::string>{"c=3"});
  CHECK(absl::GetFlag(FLAGS_ps_test_interval) == absl::Seconds(3));
  REQUIRE(ApplyConfigFile(WriteYaml(""), "test/unit/config_test.cc", nullptr).ok());
}

TEST_CASE("ApplyConfigFile errors name the file, the line and the key", "[config]") {
  struct Case {
    std::string yaml, expect;
  } cases[] = {
      {"ps-test-frequency: 1\nps-test-nope: 2\n", ":2: ps-test-nope: unknown key"},
      {"ps-test-frequency: fast\n", ":1: ps-test-frequency: Illegal value 'fast'"},
      {"ps-test-frequency: 1\nps-test-frequency: 2\n", ":2: ps-test-frequency: given twice"},
      {"ps-test-frequency:\n", ":1: ps-test-frequency: no value"},
      {"ps-test-frequency: {a: 1}\n", ":1: ps-test-frequency: expected a value, not a mapping"},
      {"ps-test-frequency: [1, 2]\n", ":1: ps-test-frequency: expected a single value"},
      {"ps-test-list: [\"a,b\"]\n", ":1: ps-test-list: a list item cannot contain a comma"},
      {"config: other.yaml\n", ":1: config: not allowed in a config file"},
      {"- a\n- b\n", ": expected a mapping of flag names"},
      {"a: [\n", ":2:1: not YAML"},
      {"ps-test-frequency: 1\n---\nps-test-frequency: 2\n", ": holds 2 YAML documents"},
  };
  for (const Case& c : cases) {
    std::string path = WriteYaml(c.yaml);
    absl::Status s = ApplyConfigFile(path, "test/unit/config_test.cc", nullptr);
    INFO(c.yaml << " -> " << s);
    CHECK(absl::IsInvalidArgument(s));
    CHECK(absl::StartsWith(s.message(), path));
    CHECK(absl::StrContains(s.message(), c.expect));
  }
  absl::Status missing = ApplyConfigFile("/nonexistent/agent.yaml", "x", nullptr);
  CHECK(absl::StrContains(missing.message(), "/nonexistent/agent.yaml: cannot read"));
  absl::Status dir = ApplyConfigFile("/tmp", "x", nullptr);
  CHECK(absl::StrContains(dir.message(), "/tmp: not a regular file"));
  std::map<std::string, std::string> origins;
  std::string path = WriteYaml("\nps-test-interval: 4s\n");
  REQUIRE(ApplyConfigFile(path, "test/unit/config_test.cc", nullptr, &origins).ok());
  CHECK(origins == std::map<std::string, std::string>{{"ps_test_interval", path + ":2"}});
}

TEST_CASE("FindConfigFlag finds --config in both spellings, the last one winning", "[config]") {
  std::vector<std::string> args = {"parascope", "--config", "/a.yaml", "--x=1",
                                   "--config=/b.yaml", "--", "--config=/c.yaml"};
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  CHECK(FindConfigFlag(argv.size(), argv.data()) == "/b.yaml");
  CHECK(!FindConfigFlag(1, argv.data()).has_value());
}

}  // namespace parascope
