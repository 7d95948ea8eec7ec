// End-to-end tests of how operators run the agent (issue: deployment, acceptance 5): --config
// files, --log-format=json, and the signals a service manager or an operator sends.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

std::string WriteFile(const std::string& path, const std::string& text) {
  std::ofstream(path) << text;
  return path;
}

// The window start (unix ms) in a profile file's name, <type>-<t0>.pb.gz.
int64_t WindowOf(const std::string& path) {
  std::string name = path.substr(path.rfind('-') + 1);
  int64_t t0 = 0;
  REQUIRE(absl::SimpleAtoi(name.substr(0, name.find('.')), &t0));
  return t0;
}

// Distinct window starts of the process_cpu profiles of `pid` under `dir`.
std::set<int64_t> Windows(const std::string& dir, int pid) {
  std::set<int64_t> w;
  for (const std::string& f : ProfileFiles(dir, pid, "process_cpu-")) w.insert(WindowOf(f));
  return w;
}

// Polls (every 20 ms, up to timeout_s) until `pred` holds.
template <typename F>
bool WaitUntil(F pred, int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return pred();
}

// A CPU-bound workload that runs until its stdin closes.
struct Spinner {
  Child child{{std::string(PS_WORKLOAD_DIR) + "/cpu_ratio", "60"}};
  int pid = 0;
  Spinner() {
    std::string line;
    REQUIRE(child.ReadStdoutLine(&line));
    REQUIRE(absl::StartsWith(line, "ready "));
    pid = std::stoi(line.substr(6));
    child.WriteStdin("go\n");
  }
  ~Spinner() {
    kill(child.pid(), SIGKILL);
    child.Wait(10);
  }
};

}  // namespace

TEST_CASE("cli: a bad --config key or value exits 2 naming the key and the file", "[cli]") {
  TempDir dir;
  struct Case {
    std::string yaml, key;
  } cases[] = {{"collect-interval: 15s\nsampling-frequncy: 99\n", "sampling-frequncy"},
               {"sampling-frequency: fast\n", "sampling-frequency"},
               {"log-format: xml\n", "--log-format"},
               {"sampling-frequency: 0\n", "--sampling-frequency"},
               {"profiles: [cpu, bogus]\n", "--profiles"}};
  for (const Case& c : cases) {
    std::string path = WriteFile(dir.path() + "/agent.yaml", c.yaml);
    Child agent({PS_AGENT_BIN, "--config=" + path});
    int status = agent.Wait(30);
    INFO(c.yaml << " -> " << agent.stderr_text());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK(absl::StrContains(agent.stderr_text(), c.key));
    CHECK(absl::StrContains(agent.stderr_text(), path + ":"));
  }
}

TEST_CASE("cli: bad --latency-group and command mode usage exits 2 naming the flag", "[cli]") {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  } cases[] = {
      {{"--latency-group=pod"}, "--latency-group: expected process, cgroup or tree, got 'pod'"},
      {{"--latency-group=tree"}, "--latency-group: tree needs command mode"},
      {{"--pid=1", "--", "true"}, "--pid: cannot be combined with a command"},
      {{"make"}, "unexpected argument 'make' (to profile a command, put it after '--'"},
  };
  for (const Case& c : cases) {
    std::vector<std::string> argv = {PS_AGENT_BIN};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    Child agent(argv);
    int status = agent.Wait(30);
    INFO(absl::StrJoin(argv, " ") << " -> " << agent.stderr_text());
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 2);
    CHECK(absl::StrContains(agent.stderr_text(), c.message));
  }
}

// The example config documents every flag: its keys are exactly --help's flags (but --config),
// and the agent accepts it as it is.
TEST_CASE("cli: deploy/config.example.yaml holds every flag and parses", "[cli]") {
  const std::string example = std::string(PS_SOURCE_DIR) + "/deploy/config.example.yaml";
  Child agent({PS_AGENT_BIN, "--config=" + example, "--help"});
  int status = agent.Wait(30);
  INFO(agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::set<std::string> flags, keys;
  std::regex flag_re("^  --([a-z0-9-]+) \\(default:");
  for (absl::string_view l : absl::StrSplit(agent.stdout_text(), '\n')) {
    std::smatch m;
    std::string line(l);
    if (std::regex_search(line, m, flag_re) && m[1] != "config") flags.insert(m[1]);
  }
  std::ifstream in(example);
  std::regex key_re("^([a-z0-9-]+):");
  for (std::string line; std::getline(in, line);) {
    std::smatch m;
    if (std::regex_search(line, m, key_re)) keys.insert(m[1]);
  }
  CHECK(flags.size() > 30);
  CHECK(keys == flags);
}

// The file's values apply (output dir, duration, profile types, JSON logs); a flag given on the
// command line wins over the file (the sampling frequency, seen in the profile's period).
TEST_CASE("config: a --config file applies, command-line flags win, logs are JSON lines",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Spinner work;
  std::string config = WriteFile(out.path() + "/agent.yaml",
                                 absl::StrCat("sampling-frequency: 49\n"
                                              "duration: 3s\n"
                                              "profiles: [cpu]\n"
                                              "log-format: json\n"
                                              "http-address: \"\"\n"
                                              "output-dir: ",
                                              out.path(), "/profiles\n"));
  Child agent({PS_AGENT_BIN, "--config", config, "--sampling-frequency=99",
               absl::StrCat("--pid=", work.pid)});
  int status = agent.Wait(60);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::vector<std::string> files = ProfileFiles(out.path() + "/profiles", work.pid, "");
  REQUIRE(!files.empty());
  for (const std::string& f : files) {
    CHECK(absl::StrContains(f, "/process_cpu-"));  // profiles: [cpu] only
    RawProfile p = ReadWithPprof(f);
    CHECK(p.period == (1000000000 + 99 / 2) / 99);  // 99 Hz from the command line, not 49
  }
  int lines = 0;
  for (absl::string_view line : absl::StrSplit(agent.stderr_text(), '\n', absl::SkipEmpty())) {
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    INFO(line);
    REQUIRE(j.is_object());
    CHECK(j.size() == 3);
    CHECK(j["ts"].is_string());
    CHECK(j["level"].is_string());
    CHECK(j["msg"].is_string());
    ++lines;
  }
  CHECK(lines >= 3);  // unwind tables, attached, stopped
}

// SIGHUP leaves the agent running and every window written (the grid of window starts has no
// gap); SIGUSR1, whose default action kills, flushes the current window and exits 0 like SIGTERM.
TEST_CASE("signals: SIGHUP loses no window, SIGUSR1 and SIGQUIT flush and stop", "[root][e2e]") {
  if (!RequireRoot()) return;
  for (int stop_signal : {SIGUSR1, SIGQUIT}) {
    TempDir out;
    Spinner work;
    Child agent({PS_AGENT_BIN, absl::StrCat("--pid=", work.pid), "--profiles=cpu",
                 "--sampling-frequency=99", "--collect-interval=1s", "--http-address=127.0.0.1:0",
                 "--output-dir=" + out.path()});
    std::string line;
    int port = 0;
    std::regex port_re("serving /metrics.*\\(port ([0-9]+)\\)");
    while (agent.ReadStderrLine(&line, 60) && !absl::StrContains(line, "attached:")) {
      std::smatch m;
      if (std::regex_search(line, m, port_re)) port = std::stoi(m[1]);
    }
    INFO("agent stderr:\n" << agent.stderr_text());
    REQUIRE(port > 0);
    auto samples = [&] {
      std::string text;
      RunCommand(absl::StrCat("curl -sS -m 10 http://127.0.0.1:", port, "/metrics"), &text);
      // Read from the BPF counters at scrape time: it advances within a window.
      return MetricValue(text, "parascope_bpf_samples_taken_total");
    };
    REQUIRE(WaitUntil([&] { return Windows(out.path(), work.pid).size() >= 1; }, 30));
    REQUIRE(kill(agent.pid(), SIGHUP) == 0);
    REQUIRE(kill(agent.pid(), SIGHUP) == 0);
    REQUIRE(WaitUntil([&] { return Windows(out.path(), work.pid).size() >= 3; }, 30));
    CHECK(agent.Running());
    // Right after a window's profile appeared, the next window has samples once the counter
    // moved on (the spinner runs): the stop signal then comes mid-window, and the flush must
    // write that partial window's profile.
    size_t whole = 0;
    REQUIRE(WaitUntil(
        [&] {
          whole = Windows(out.path(), work.pid).size();
          const double base = samples();
          if (!WaitUntil([&] { return samples() >= base + 5; }, 30)) return false;
          return Windows(out.path(), work.pid).size() == whole;  // still the same window
        },
        30));
    REQUIRE(kill(agent.pid(), stop_signal) == 0);
    int status = agent.Wait(30);
    REQUIRE(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    std::set<int64_t> w = Windows(out.path(), work.pid);
    INFO("signal " << stop_signal << ", windows " << w.size() << ", whole before it " << whole);
    REQUIRE(w.size() >= whole + 1);  // the flushed partial window
    // No window missing: consecutive starts about 1 s apart (a window starts when the previous
    // one was cut, later than its nominal end on a busy machine), never 2 s.
    for (auto it = std::next(w.begin()); it != w.end(); ++it) {
      CHECK(*it - *std::prev(it) >= 500);
      CHECK(*it - *std::prev(it) < 1500);
    }
  }
}

// Acceptance 6: the agent profiles the whole host in 1 s windows, which writes more than the
// 1 MiB bound within a few windows; at 30 moments during the run the agent is stopped (SIGSTOP,
// so no file is half-counted) and the directory measured from the disk: every regular file's
// allocated bytes, .tmp files included, stays within the bound. The deletions show on /metrics,
// and the newest windows are the ones kept.
TEST_CASE("retention: --output-max-bytes keeps --output-dir under its bound during a run",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Spinner work;
  const int64_t bound = int64_t{1} << 20;
  Child agent({PS_AGENT_BIN, "--collect-interval=1s", "--sampling-frequency=99",
               "--http-address=127.0.0.1:0", "--output-dir=" + out.path(),
               absl::StrCat("--output-max-bytes=", bound)});
  std::string line;
  int port = 0;
  std::regex port_re("serving /metrics.*\\(port ([0-9]+)\\)");
  while (agent.ReadStderrLine(&line, 60) && !absl::StrContains(line, "attached:")) {
    std::smatch m;
    if (std::regex_search(line, m, port_re)) port = std::stoi(m[1]);
  }
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(port > 0);
  auto metrics = [&] {
    std::string text;
    RunCommand(absl::StrCat("curl -sS -m 10 http://127.0.0.1:", port, "/metrics"), &text);
    return text;
  };
  auto disk_bytes = [&] {
    int64_t bytes = 0;
    std::error_code ec;
    for (auto it = std::filesystem::recursive_directory_iterator(out.path(), ec);
         it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
      struct stat st;
      if (lstat(it->path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
        bytes += static_cast<int64_t>(st.st_blocks) * 512;
      }
    }
    return bytes;
  };
  int64_t peak = 0;
  int snapshots = 0;
  // Until the bound has been hit and files deleted for it for a few windows.
  REQUIRE(WaitUntil(
      [&] {
        REQUIRE(kill(agent.pid(), SIGSTOP) == 0);
        const int64_t b = disk_bytes();
        REQUIRE(kill(agent.pid(), SIGCONT) == 0);
        peak = std::max(peak, b);
        ++snapshots;
        CHECK(b <= bound);
        if (snapshots < 30) return false;
        const std::string text = metrics();
        return MetricValue(text, "parascope_output_deleted_files_total{reason=\"max_bytes\"}") >
                   0 &&
               MetricValue(text, "parascope_output_deleted_bytes_total") > 3 * bound;
      },
      90));
  const std::string text = metrics();
  const double deleted_bytes = MetricValue(text, "parascope_output_deleted_bytes_total");
  const double gauge = MetricValue(text, "parascope_output_bytes");
  REQUIRE(kill(agent.pid(), SIGTERM) == 0);
  int status = agent.Wait(30);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  const int64_t final_bytes = disk_bytes();
  INFO("peak " << peak << " final " << final_bytes << " gauge " << gauge << " deleted "
               << deleted_bytes << " snapshots " << snapshots);
  CHECK(final_bytes <= bound);
  CHECK(peak > bound / 2);                  // the bound was approached, not idle
  CHECK(deleted_bytes > 3 * bound);  // the run wrote more than 4 times the bound
  CHECK(gauge <= bound);
  // The newest windows are the ones kept: the spinner's last (flushed) window is the newest,
  // and the kept windows follow each other without a gap (about 1 s apart).
  std::set<int64_t> w = Windows(out.path(), work.pid);
  REQUIRE(!w.empty());
  std::set<int64_t> all;
  for (const auto& e : std::filesystem::recursive_directory_iterator(out.path())) {
    if (absl::EndsWith(e.path().string(), ".pb.gz")) all.insert(WindowOf(e.path().string()));
  }
  CHECK(*w.rbegin() == *all.rbegin());
  for (auto it = std::next(all.begin()); it != all.end(); ++it) CHECK(*it - *std::prev(it) < 1500);
}

}  // namespace parascope::testing
