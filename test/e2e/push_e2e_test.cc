// Root end-to-end tests of the Pyroscope push (issue 4, acceptance 1-7): the agent binary profiles
// ground-truth workloads and pushes to ps_test_receiver over gRPC and Connect. Outages and
// failures are scripted through the receiver's stdin; waits are on events (receiver lines, the
// agent's per-window debug line), durations of outages are counted in the agent's own windows.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "test/e2e/e2e_util.h"
#include "test/k8s/fake_apiserver.h"
#include "test/receiver/receiver_client.h"

namespace parascope::testing {
namespace {

constexpr const char* kProtocols[] = {"grpc", "connect"};

std::string Hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof(buf) - 1);
  return buf;
}

std::string ReadAll(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The 3:1 workload (test/workloads/cpu_ratio.c), optionally with environment variables.
struct Workload {
  explicit Workload(double seconds, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv;
    if (!env.empty()) {
      argv.push_back("/usr/bin/env");
      argv.insert(argv.end(), env.begin(), env.end());
    }
    argv.push_back(std::string(PS_WORKLOAD_DIR) + "/cpu_ratio");
    argv.push_back(absl::StrCat(seconds));
    child = std::make_unique<Child>(argv);
    std::string line;
    REQUIRE(child->ReadStdoutLine(&line));
    REQUIRE(absl::StartsWith(line, "ready "));
    pid = std::stoi(line.substr(6));
  }
  void Go() { child->WriteStdin("go\n"); }
  std::unique_ptr<Child> child;
  int pid = 0;
};

// The agent, started with /metrics on an ephemeral port; construction waits for "attached:".
struct Agent {
  explicit Agent(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {PS_AGENT_BIN, "--http-address=127.0.0.1:0"};
    argv.insert(argv.end(), args.begin(), args.end());
    child = std::make_unique<Child>(argv);
    http_port = AttachedMetricsPort(child.get());
    INFO("agent stderr:\n" << child->stderr_text());
    REQUIRE(http_port > 0);
  }
  // Waits for the agent's debug line of window n (needs --log-level=debug).
  bool WaitForWindow(int n, int timeout_s) {
    std::string line;
    return child->WaitForStderr(absl::StrCat("window ", n, ":"), &line, timeout_s);
  }
  std::string Get(const std::string& path) const {
    std::string out;
    RunCommand(absl::StrCat("curl -sS -m 10 http://127.0.0.1:", http_port, path), &out);
    return out;
  }
  int HttpStatus(const std::string& path) const {
    std::string out;
    RunCommand(absl::StrCat("curl -s -o /dev/null -w '%{http_code}' -m 10 http://127.0.0.1:",
                            http_port, path),
               &out);
    int code = 0;
    (void)absl::SimpleAtoi(out, &code);
    return code;
  }
  // SIGTERM (flushes the queue for at most --shutdown-timeout), then the exit status.
  int Stop(int timeout_s = 120) {
    kill(child->pid(), SIGTERM);
    return child->Wait(timeout_s);
  }
  std::unique_ptr<Child> child;
  int http_port = 0;
};

// "key=N" from the agent's log (e.g. the "push: sent=.. retries=.. dropped=.." line).
int64_t LogValue(const std::string& log, const std::string& prefix, const std::string& key) {
  std::regex re(prefix + ".*[ (]" + key + "=([0-9]+)");
  std::smatch m;
  if (!std::regex_search(log, m, re)) return -1;
  return std::stoll(m[1]);
}

std::string UrlFor(const TestReceiver& r, const std::string& protocol, bool tls = false) {
  return protocol == "grpc" ? r.GrpcUrl(tls) : r.HttpUrl(tls);
}

std::map<std::string, std::string> Labels(const receiver::PushRecord& r) {
  return std::map<std::string, std::string>(r.series(0).labels().begin(),
                                            r.series(0).labels().end());
}

size_t CountOkNamed(const std::vector<TestReceiver::Event>& events, const std::string& name) {
  size_t n = 0;
  for (const auto& e : events) {
    if (e.count("result") && e.at("result") == "ok" && e.count("name") && e.at("name") == name) {
      ++n;
    }
  }
  return n;
}

bool Contains(const std::vector<std::string>& frames, const std::string& fn) {
  return std::find(frames.begin(), frames.end(), fn) != frames.end();
}

}  // namespace

TEST_CASE("push: 3:1 workload over gRPC and Connect, exact labels, 0.75/0.25 shares",
          "[root][e2e][push]") {
  if (!RequireRoot()) return;
  for (std::string protocol : kProtocols) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--strict"});
      Workload work(4);
      Agent agent({absl::StrCat("--pid=", work.pid), "--sampling-frequency=499",
                   "--collect-interval=2s", "--duration=4s",
                   "--remote-url=" + UrlFor(receiver, protocol), "--remote-protocol=" + protocol});
      work.Go();
      std::string line;
      REQUIRE(work.child->ReadStdoutLine(&line, 30));
      REQUIRE(absl::StartsWith(line, "done "));
      int status = agent.child->Wait(90);
      INFO("agent stderr:\n"
           << agent.child->stderr_text() << "\nreceiver stderr:\n"
           << receiver.Stderr());
      REQUIRE(WIFEXITED(status));
      REQUIRE(WEXITSTATUS(status) == 0);

      const std::set<std::string> kNames = {"process_cpu", "off_cpu", "wall", "latency"};
      std::set<std::string> names;
      std::set<int64_t> cpu_windows;
      int64_t total = 0, with_a = 0, with_b = 0;
      auto records = receiver.Records();
      REQUIRE(!records.empty());
      for (const auto& r : records) {
        INFO(r.DebugString());
        CHECK(r.result() == "ok");
        CHECK(r.violations().empty());
        CHECK(r.protocol() == protocol);
        REQUIRE(r.series_size() == 1);
        auto labels = Labels(r);
        std::string name = labels["__name__"];
        CHECK(kNames.count(name) == 1);
        names.insert(name);
        CHECK(labels == std::map<std::string, std::string>{{"__name__", name},
                                                           {"service_name", "cpu_ratio"},
                                                           {"hostname", Hostname()}});
        if (name != "process_cpu") continue;
        const auto& s = r.series(0).samples(0);
        cpu_windows.insert(s.profile().time_nanos());
        RawProfile p = ReadWithPprof(s.file());
        int cpu = p.ValueIndex("cpu");
        REQUIRE(cpu >= 0);
        for (const auto& smp : p.samples) {
          std::vector<std::string> frames = p.Frames(smp);
          total += smp.values[cpu];
          if (Contains(frames, "spin_a")) with_a += smp.values[cpu];
          if (Contains(frames, "spin_b")) with_b += smp.values[cpu];
        }
      }
      INFO("series: " << absl::StrJoin(names, ","));
      CHECK(names.count("process_cpu") == 1);
      CHECK(cpu_windows.size() >= 2);
      REQUIRE(total > 0);
      double share_a = double(with_a) / total, share_b = double(with_b) / total;
      INFO("share spin_a=" << share_a << " spin_b=" << share_b);
      CHECK(share_a == Approx(0.75).margin(0.05));
      CHECK(share_b == Approx(0.25).margin(0.05));
      CHECK(LogValue(agent.child->stderr_text(), "push:", "dropped") == 0);
      work.child->CloseStdin();
    }
  }
}

TEST_CASE("push: service_name from OTEL_SERVICE_NAME, else the executable name",
          "[root][e2e][push]") {
  if (!RequireRoot()) return;
  TestReceiver receiver({"--strict"});
  Workload named(2, {"OTEL_SERVICE_NAME=checkout-svc"});
  Workload plain(2);
  Agent agent({absl::StrCat("--pid=", named.pid, ",", plain.pid), "--profiles=cpu", "--pid-label",
               "--collect-interval=2s", "--duration=2s", "--remote-url=" + receiver.GrpcUrl()});
  named.Go();
  plain.Go();
  int status = agent.child->Wait(90);
  INFO("agent stderr:\n" << agent.child->stderr_text());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  std::map<std::string, std::set<std::string>> service_by_pid;
  for (const auto& r : receiver.OkRecords()) {
    auto labels = Labels(r);
    service_by_pid[labels["pid"]].insert(labels["service_name"]);
  }
  CHECK(service_by_pid[std::to_string(named.pid)] == std::set<std::string>{"checkout-svc"});
  CHECK(service_by_pid[std::to_string(plain.pid)] == std::set<std::string>{"cpu_ratio"});
}

TEST_CASE("push: a 20 s outage loses nothing and /metrics shows the retries", "[root][e2e][push]") {
  if (!RequireRoot()) return;
  for (std::string protocol : kProtocols) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--strict"});
      receiver.Command("refuse");
      Workload work(300);
      Agent agent({absl::StrCat("--pid=", work.pid), "--profiles=cpu", "--sampling-frequency=99",
                   "--collect-interval=2s", "--log-level=debug", "--shutdown-timeout=30s",
                   "--remote-url=" + UrlFor(receiver, protocol), "--remote-protocol=" + protocol});
      work.Go();
      // 20 s of outage, counted in the agent's 2 s windows.
      REQUIRE(agent.WaitForWindow(10, 60));
      std::string metrics = agent.Get("/metrics");
      INFO("metrics during the outage:\n" << metrics);
      CHECK(MetricValue(metrics, "parascope_push_retries_total") > 0);
      CHECK(MetricValue(metrics, "parascope_queue_bytes") > 0);
      CHECK(MetricValue(metrics, absl::StrCat("parascope_push_failures_total{code=\"",
                                         protocol == "grpc" ? "UNAVAILABLE" : "connect", "\"}")) >
            0);
      CHECK(MetricValue(metrics, "parascope_profiles_pushed_total") == 0);
      // Unreachable for more than two windows: not ready.
      CHECK(agent.HttpStatus("/readyz") == 503);
      CHECK(agent.HttpStatus("/healthz") == 200);

      receiver.Command("accept");
      bool delivered = receiver.WaitFor(
          [](const auto& events) { return CountOkNamed(events, "process_cpu") >= 10; }, 90);
      INFO("agent stderr:\n" << agent.child->stderr_text());
      REQUIRE(delivered);
      CHECK(agent.HttpStatus("/readyz") == 200);
      metrics = agent.Get("/metrics");
      CHECK(MetricValue(metrics, "parascope_push_retries_total") > 0);

      int status = agent.Stop();
      const std::string& log = agent.child->stderr_text();
      INFO("agent stderr:\n" << log);
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      int64_t windows = LogValue(log, "stopped:", "windows");
      CHECK(LogValue(log, "push:", "dropped") == 0);
      CHECK(LogValue(log, "push:", "retries") > 0);
      // One state change each way, not a line per attempt.
      size_t down = 0, up = 0;
      for (absl::string_view l : absl::StrSplit(log, '\n')) {
        if (absl::StrContains(l, ") down:")) ++down;
        if (absl::StrContains(l, ") back up after")) ++up;
      }
      CHECK(down == 1);
      CHECK(up == 1);

      // Every window arrived, exactly once, in order: consecutive window starts 2 s apart.
      std::vector<int64_t> starts;
      std::set<std::string> ids;
      for (const auto& r : receiver.OkRecords()) {
        CHECK(r.violations().empty());
        if (Labels(r)["__name__"] != "process_cpu") continue;
        starts.push_back(r.series(0).samples(0).profile().time_nanos());
        ids.insert(r.series(0).samples(0).id());
      }
      INFO("windows=" << windows << " delivered=" << starts.size());
      // (A final partial window cut by SIGTERM right after a boundary may hold no sample.)
      CHECK(static_cast<int64_t>(starts.size()) >= windows - 1);
      CHECK(static_cast<int64_t>(starts.size()) <= windows);
      CHECK(ids.size() == starts.size());
      CHECK(std::is_sorted(starts.begin(), starts.end()));
      // A window ends when the agent's loop flips the buffers, so one can run long by the loop's
      // wake-up delay (CI once measured 2.209 s with the workload busy on both CPUs); a lost or
      // doubled window would be 4 s or 0 s apart.
      for (size_t i = 1; i + 1 < starts.size(); ++i) {  // the last window may be partial
        CHECK(starts[i] - starts[i - 1] == Approx(2e9).margin(3e8));
      }
      work.child->CloseStdin();
    }
  }
}

TEST_CASE(
    "push: a 1 MiB queue during a 60 s outage stays bounded, drops are counted, delivery "
    "resumes",
    "[root][e2e][push]") {
  if (!RequireRoot()) return;
  constexpr int64_t kQueueMax = 1 << 20;
  TestReceiver receiver;
  receiver.Command("refuse");
  // System-wide, all four profile types, at a high rate: enough data to overflow 1 MiB.
  Agent agent({"--sampling-frequency=999", "--collect-interval=2s", "--log-level=debug",
               absl::StrCat("--queue-max-bytes=", kQueueMax), "--shutdown-timeout=10s",
               "--remote-url=" + receiver.GrpcUrl()});
  // Busy processes on every CPU, so every window has profiles to push.
  std::vector<std::unique_ptr<Workload>> load;
  for (int i = 0; i < 4; ++i) {
    load.push_back(std::make_unique<Workload>(300));
    load.back()->Go();
  }
  double max_queue = 0, drops = 0;
  for (int w = 5; w <= 30; w += 5) {  // 60 s in 2 s windows
    REQUIRE(agent.WaitForWindow(w, 60));
    std::string metrics = agent.Get("/metrics");
    double q = MetricValue(metrics, "parascope_queue_bytes");
    INFO("window " << w << " metrics:\n" << metrics);
    REQUIRE(q >= 0);
    max_queue = std::max(max_queue, q);
    CHECK(q <= kQueueMax);
    drops = MetricValue(metrics, "parascope_queue_dropped_total{reason=\"queue_full\"}");
  }
  INFO("max queue bytes " << max_queue << ", dropped " << drops);
  CHECK(max_queue > kQueueMax / 2);  // the bound was actually reached
  CHECK(drops > 0);

  size_t before = receiver.CountOk();
  int64_t accepted_at = absl::ToUnixNanos(absl::Now());
  receiver.Command("accept");
  REQUIRE(receiver.WaitForOk(before + 10, 90));
  // Two windows produced after the outage; then stop (the queue is flushed for up to 10 s).
  REQUIRE(agent.WaitForWindow(33, 60));
  std::string metrics = agent.Get("/metrics");
  CHECK(MetricValue(metrics, "parascope_queue_bytes") <= kQueueMax);
  CHECK(MetricValue(metrics, "parascope_profiles_pushed_total") > 0);
  int status = agent.Stop();
  INFO("agent stderr:\n" << agent.child->stderr_text());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  // Delivery resumed: windows that started after the outage arrived, not only the backlog.
  size_t fresh = 0, total = 0;
  for (const auto& r : receiver.OkRecords()) {
    ++total;
    fresh += r.series(0).samples(0).profile().time_nanos() > accepted_at;
  }
  INFO("delivered " << total << ", of windows after the outage " << fresh);
  CHECK(fresh > 0);
  CHECK(LogValue(agent.child->stderr_text(), "push:", "sent") > 0);
}

TEST_CASE("push: 429 / RESOURCE_EXHAUSTED is retried with backoff, 400 / INVALID_ARGUMENT is not",
          "[root][e2e][push]") {
  if (!RequireRoot()) return;
  for (std::string protocol : kProtocols) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      receiver.Command("fail count=3 status=429 grpc=RESOURCE_EXHAUSTED");
      Workload work(300);
      Agent agent({absl::StrCat("--pid=", work.pid), "--profiles=cpu", "--sampling-frequency=99",
                   "--collect-interval=2s", "--remote-url=" + UrlFor(receiver, protocol),
                   "--remote-protocol=" + protocol});
      work.Go();
      REQUIRE(receiver.WaitForOk(1, 60));
      auto records = receiver.Records();
      REQUIRE(records.size() >= 4);
      const std::string id = records[0].series(0).samples(0).id();
      for (int i = 0; i < 4; ++i) {
        INFO(records[i].DebugString());
        CHECK(records[i].series(0).samples(0).id() == id);
        CHECK(records[i].result() ==
              (i < 3 ? (protocol == "grpc" ? "grpc RESOURCE_EXHAUSTED" : "http 429") : "ok"));
      }
      // Backoff: the three waits are random in [0, 0.5 s), [0, 1 s), [0, 2 s) (full jitter);
      // together under 0.1 s has a probability of about 1e-4.
      int64_t waited = records[3].time_unix_nanos() - records[0].time_unix_nanos();
      INFO("retried over " << waited / 1e6 << " ms");
      CHECK(waited > 100000000);
      CHECK(waited < 4000000000);
      std::string metrics = agent.Get("/metrics");
      CHECK(MetricValue(metrics, "parascope_push_retries_total") == 3);
      CHECK(MetricValue(metrics,
                   absl::StrCat("parascope_push_failures_total{code=\"",
                                protocol == "grpc" ? "RESOURCE_EXHAUSTED" : "429", "\"}")) == 3);

      receiver.Command("fail count=1 status=400 grpc=INVALID_ARGUMENT");
      size_t ok_before = receiver.CountOk();
      size_t n_before = receiver.Records().size();
      // Two more windows delivered after the rejected one: it was not retried in between.
      REQUIRE(receiver.WaitForOk(ok_before + 2, 60));
      records = receiver.Records();
      REQUIRE(records.size() > n_before);
      const auto& rejected = records[n_before];
      CHECK(rejected.result() == (protocol == "grpc" ? "grpc INVALID_ARGUMENT" : "http 400"));
      const std::string rejected_id = rejected.series(0).samples(0).id();
      int seen = 0;
      for (const auto& r : records) seen += r.series(0).samples(0).id() == rejected_id;
      CHECK(seen == 1);
      metrics = agent.Get("/metrics");
      CHECK(MetricValue(metrics, "parascope_push_retries_total") == 3);
      CHECK(MetricValue(metrics, "parascope_queue_dropped_total{reason=\"rejected\"}") == 1);
      CHECK(MetricValue(metrics, absl::StrCat("parascope_push_failures_total{code=\"",
                                         protocol == "grpc" ? "INVALID_ARGUMENT" : "400", "\"}")) ==
            1);
      int status = agent.Stop();
      INFO("agent stderr:\n" << agent.child->stderr_text());
      REQUIRE(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      work.child->CloseStdin();
    }
  }
}

TEST_CASE("push: tenant, basic auth and bearer token reach the server, never logs or argv",
          "[root][e2e][push]") {
  if (!RequireRoot()) return;
  TempDir secrets;
  const std::string password = "pa55-w0rd-9f3e";
  const std::string token = "tok-6d1b-secret";
  const std::string password_file = secrets.path() + "/password";
  const std::string token_file = secrets.path() + "/token";
  std::ofstream(password_file) << password << "\n";
  std::ofstream(token_file) << token << "\n";
  const std::string basic = absl::Base64Escape("alice:" + password);

  for (std::string protocol : kProtocols) {
    DYNAMIC_SECTION(protocol) {
      struct Case {
        std::vector<std::string> flags;
        std::string tenant, authorization, secret, encoded, team;
      };
      std::vector<Case> cases = {
          {{"--tenant-id=team-a", "--basic-auth-user=alice",
            "--basic-auth-password-file=" + password_file, "--remote-header=X-Team=perf"},
           "team-a",
           "Basic " + basic,
           password,
           basic,
           "perf"},
          {{"--tenant-id=team-b", "--bearer-token-file=" + token_file},
           "team-b",
           "Bearer " + token,
           token,
           token,
           ""},
      };
      for (const Case& c : cases) {
        TestReceiver receiver({"--strict"});
        Workload work(2);
        std::vector<std::string> args = {absl::StrCat("--pid=", work.pid),
                                         "--profiles=cpu",
                                         "--collect-interval=2s",
                                         "--duration=2s",
                                         "--log-level=debug",
                                         "--remote-url=" + UrlFor(receiver, protocol),
                                         "--remote-protocol=" + protocol};
        args.insert(args.end(), c.flags.begin(), c.flags.end());
        Agent agent(args);
        std::string cmdline = ReadAll(absl::StrCat("/proc/", agent.child->pid(), "/cmdline"));
        REQUIRE(!cmdline.empty());
        CHECK(cmdline.find(c.secret) == std::string::npos);
        CHECK(cmdline.find(c.encoded) == std::string::npos);
        work.Go();
        int status = agent.child->Wait(90);
        const std::string& log = agent.child->stderr_text();
        INFO("agent stderr:\n" << log);
        REQUIRE(WIFEXITED(status));
        REQUIRE(WEXITSTATUS(status) == 0);
        CHECK(log.find(c.secret) == std::string::npos);
        CHECK(log.find(c.encoded) == std::string::npos);
        CHECK(agent.child->stdout_text().find(c.secret) == std::string::npos);
        auto records = receiver.OkRecords();
        REQUIRE(!records.empty());
        for (const auto& r : records) {
          CHECK(r.headers().at("authorization") == c.authorization);
          CHECK(r.headers().at("x-scope-orgid") == c.tenant);
          if (!c.team.empty()) CHECK(r.headers().at("x-team") == c.team);
        }
        work.child->CloseStdin();
      }
    }
  }
}

TEST_CASE("push: TLS verifies the server with --tls-ca-file, a wrong CA fails clearly, mTLS works",
          "[root][e2e][push]") {
  if (!RequireRoot()) return;
  TempDir dir;
  TestCerts certs(dir.path());
  for (std::string protocol : kProtocols) {
    DYNAMIC_SECTION(protocol) {
      auto run = [&](TestReceiver& receiver, std::vector<std::string> extra) {
        Workload work(2);
        std::vector<std::string> args = {absl::StrCat("--pid=", work.pid),
                                         "--profiles=cpu",
                                         "--collect-interval=2s",
                                         "--duration=2s",
                                         "--shutdown-timeout=2s",
                                         "--remote-url=" + UrlFor(receiver, protocol, /*tls=*/true),
                                         "--remote-protocol=" + protocol};
        args.insert(args.end(), extra.begin(), extra.end());
        Agent agent(args);
        work.Go();
        int status = agent.child->Wait(90);
        work.child->CloseStdin();
        INFO("agent stderr:\n" << agent.child->stderr_text());
        CHECK(WIFEXITED(status));
        CHECK(WEXITSTATUS(status) == 0);
        return agent.child->stderr_text();
      };
      {
        TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key});
        std::string log = run(receiver, {"--tls-ca-file=" + certs.ca});
        CHECK(receiver.OkRecords().size() > 0);
        CHECK(LogValue(log, "push:", "dropped") == 0);

        // The wrong CA: nothing is delivered and the log says why, once.
        size_t ok = receiver.OkRecords().size();
        log = run(receiver, {"--tls-ca-file=" + certs.other_ca});
        CHECK(receiver.OkRecords().size() == ok);
        size_t down_lines = 0;
        std::string down;
        for (absl::string_view l : absl::StrSplit(log, '\n')) {
          if (absl::StrContains(l, ") down:")) {
            ++down_lines;
            down = std::string(l);
          }
        }
        INFO("down line: " << down);
        CHECK(down_lines == 1);
        std::string lower = absl::AsciiStrToLower(down);
        CHECK(absl::StrContains(lower, "certificate"));
        CHECK((absl::StrContains(lower, "verify") || absl::StrContains(lower, "issuer")));
      }
      {
        TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key,
                               "--tls-client-ca=" + certs.ca});
        run(receiver, {"--tls-ca-file=" + certs.ca, "--tls-cert-file=" + certs.client_cert,
                       "--tls-key-file=" + certs.client_key});
        CHECK(receiver.OkRecords().size() > 0);
      }
    }
  }
}

// ---- Kubernetes metadata (issue 12): a fake API server, workloads in pod cgroups ----

// One pod's container: a cgroup v2 as the kubelet's systemd driver and the runtime name them
// (kubepods.slice/kubepods-<qos>.slice/kubepods-<qos>-pod<uid with _>.slice/<runtime>-<id>.scope),
// made below a test directory of the cgroup2 mount, with a 3:1 workload moved into it before the
// agent starts (as runc places a container's process before it execs).
struct PodContainer {
  PodContainer(const testing::FakePod& pod, const std::string& qos, const std::string& scope_prefix,
               double seconds)
      : workload(seconds) {
    std::string mount;
    {
      std::ifstream mounts("/proc/self/mounts");
      std::string dev, dir, type, rest;
      while (mounts >> dev >> dir >> type) {
        std::getline(mounts, rest);
        if (type == "cgroup2") mount = dir;
      }
    }
    INFO("no cgroup2 mount (/sys/fs/cgroup or /sys/fs/cgroup/unified)");
    REQUIRE(!mount.empty());
    std::string uid = pod.uid;
    std::replace(uid.begin(), uid.end(), '-', '_');
    top = absl::StrCat(mount, "/parascope-e2e-", getpid(), "-", pod.name);
    dirs = {top, top + "/kubepods.slice",
            top + "/kubepods.slice/kubepods-" + qos + ".slice",
            top + "/kubepods.slice/kubepods-" + qos + ".slice/kubepods-" + qos + "-pod" + uid +
                ".slice"};
    dirs.push_back(dirs.back() + "/" + scope_prefix + pod.container_id + ".scope");
    for (const std::string& d : dirs) mkdir(d.c_str(), 0755);
    std::ofstream procs(dirs.back() + "/cgroup.procs");
    procs << workload.pid << "\n";
    procs.close();
    REQUIRE(procs.good());
  }
  ~PodContainer() {
    workload.child.reset();  // kills and reaps it: a cgroup with a process cannot be removed
    for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) rmdir(it->c_str());
  }
  Workload workload;
  std::string top;
  std::vector<std::string> dirs;
};

// Two pods of node "node-e2e": checkout (namespace shop, containerd, burstable) and report
// (namespace batch, CRI-O, besteffort, annotated parascope.io/service-name=nightly-report).
struct TwoPods {
  TwoPods() {
    checkout.uid = "5f0c3a9e-2b7d-4c1a-8e6f-9d3b2a1c0e4f";
    checkout.name = "checkout-1";
    checkout.namespace_name = "shop";
    checkout.node = "node-e2e";
    checkout.app = "checkout";
    checkout.tier = "api";
    checkout.container = "checkout";
    checkout.container_id = std::string(56, 'a') + absl::StrCat(absl::Hex(getpid(), absl::kZeroPad8));
    report = checkout;
    report.uid = "c1d2e3f4-a5b6-4c7d-8e9f-0a1b2c3d4e5f";
    report.name = "report-1";
    report.namespace_name = "batch";
    report.app = "report";
    report.tier = "batch";
    report.container = "report";
    report.runtime = "cri-o";
    report.container_id = std::string(56, 'b') + absl::StrCat(absl::Hex(getpid(), absl::kZeroPad8));
    report.service_annotation = "nightly-report";
  }
  testing::FakePod checkout, report;
};

std::string WriteToken(const TempDir& dir) {
  std::string path = dir.path() + "/token";
  std::ofstream(path) << "e2e-token\n";
  return path;
}

// Acceptance 4 of issue 12: labels from the API server's pods; a dead API server does not stop
// profiling, raises the metric, and pods known before keep their labels.
TEST_CASE("kubernetes: pushed series carry namespace, pod, container, node, service_name, and a dead "
          "API server keeps profiling",
          "[root][e2e][push][kubernetes]") {
  if (!RequireRoot()) return;
  TwoPods pods;
  testing::FakeApiServer api("node-e2e", "e2e-token");
  // checkout comes from the list; report only from the watch, after the agent started: ADDED
  // while Pending (no container id yet), MODIFIED once its container runs.
  api.Apply(pods.checkout);
  PodContainer checkout(pods.checkout, "burstable", "cri-containerd-", 40);
  PodContainer report(pods.report, "besteffort", "crio-", 40);
  TempDir dir;
  TestReceiver receiver({"--strict"});
  Agent agent({"--kubernetes=true", "--kubernetes-api-url=" + api.url(),
               "--kubernetes-node-name=node-e2e", "--kubernetes-token-file=" + WriteToken(dir),
               "--profiles=cpu", "--sampling-frequency=49", "--collect-interval=2s",
               "--pid-label", "--remote-url=" + receiver.GrpcUrl()});
  checkout.workload.Go();
  report.workload.Go();
  const std::string a = std::to_string(checkout.workload.pid);
  const std::string b = std::to_string(report.workload.pid);
  auto pushed_for = [&](const std::string& pid) {
    std::vector<std::map<std::string, std::string>> out;
    for (const auto& r : receiver.OkRecords()) {
      auto l = Labels(r);
      if (l["pid"] == pid && l["__name__"] == "process_cpu") out.push_back(l);
    }
    return out;
  };
  REQUIRE(receiver.WaitFor([&](const auto&) { return !pushed_for(a).empty(); }, 60));
  testing::FakePod pending = pods.report;
  pending.container_id = "";
  api.Apply(pending);
  // The pod is known, its container not yet: the pod's labels without `container`.
  REQUIRE(receiver.WaitFor([&](const auto&) {
    for (const auto& l : pushed_for(b)) {
      if (l.count("pod") > 0) return true;
    }
    return false;
  }, 60));
  for (const auto& l : pushed_for(b)) {
    if (l.count("pod") == 0) continue;
    CHECK(l.at("pod") == "report-1");
    CHECK(l.count("container") == 0);
    CHECK(l.at("container_id") == pods.report.container_id.substr(0, 12));  // its short id instead
    CHECK(l.at("service_name") == "nightly-report");  // the annotation, there from the start
    break;
  }
  api.Apply(pods.report);
  REQUIRE(receiver.WaitFor([&](const auto&) {
    auto l = pushed_for(b);
    return !l.empty() && l.back().count("container") > 0;
  }, 60));
  std::map<std::string, std::string> want_a = {
      {"__name__", "process_cpu"}, {"service_name", "shop/checkout"}, {"hostname", "node-e2e"},
      {"namespace", "shop"}, {"pod", "checkout-1"}, {"container", "checkout"},
      {"node", "node-e2e"}, {"pid", a}};
  std::map<std::string, std::string> want_b = {
      {"__name__", "process_cpu"}, {"service_name", "nightly-report"}, {"hostname", "node-e2e"},
      {"namespace", "batch"}, {"pod", "report-1"}, {"container", "report"},
      {"node", "node-e2e"}, {"pid", b}};
  CHECK(pushed_for(a).front() == want_a);
  CHECK(pushed_for(b).back() == want_b);
  // Processes outside the pods' cgroups get no Kubernetes labels.
  for (const auto& r : receiver.OkRecords()) {
    auto l = Labels(r);
    if (l["pid"] != a && l["pid"] != b) {
      INFO("pid " << l["pid"] << " service_name " << l["service_name"]);
      CHECK(l.count("namespace") == 0);
      CHECK(l.count("pod") == 0);
    }
  }
  std::string metrics = agent.Get("/metrics");
  CHECK(MetricValue(metrics, "parascope_kubernetes_api_up") == 1);
  CHECK(MetricValue(metrics, "parascope_kubernetes_pods") == 2);
  CHECK(MetricValue(metrics, "parascope_kubernetes_lookups_total{result=\"pod\"}") >= 2);
  CHECK(MetricValue(metrics, "parascope_kubernetes_watch_events_total{type=\"added\"}") == 1);
  CHECK(MetricValue(metrics, "parascope_kubernetes_watch_events_total{type=\"modified\"}") == 1);
  // DELETED: the store forgets the pod; a process labeled before keeps its labels.
  api.Remove(pods.checkout.uid);
  bool deleted = false;
  for (int i = 0; i < 100 && !deleted; ++i) {
    deleted = MetricValue(agent.Get("/metrics"), "parascope_kubernetes_pods") == 1;
    if (!deleted) absl::SleepFor(absl::Milliseconds(100));
  }
  CHECK(deleted);
  CHECK(api.refused().empty());

  // The API server dies mid-run.
  api.Stop();
  const size_t before = pushed_for(a).size();
  bool down = false;
  for (int i = 0; i < 300 && !down; ++i) {
    metrics = agent.Get("/metrics");
    down = MetricValue(metrics, "parascope_kubernetes_api_up") == 0 &&
           MetricValue(metrics, "parascope_kubernetes_api_errors_total{reason=\"connect\"}") >= 1;
    if (!down) absl::SleepFor(absl::Milliseconds(100));
  }
  INFO(metrics);
  CHECK(down);
  // Profiling goes on: two more windows of the checkout workload, still labeled.
  REQUIRE(receiver.WaitFor([&](const auto&) { return pushed_for(a).size() >= before + 2; }, 60));
  CHECK(pushed_for(a).back() == want_a);
  CHECK(pushed_for(b).back() == want_b);
  // A pod's container started while the API server is down: its series carry the container's
  // short id (and the node), so containers stay apart until the pod is known.
  testing::FakePod unseen = pods.checkout;
  unseen.uid = "0a9b8c7d-6e5f-4a3b-9c2d-1e0f9a8b7c6d";
  unseen.name = "unseen-1";
  unseen.container_id = std::string(56, 'c') + absl::StrCat(absl::Hex(getpid(), absl::kZeroPad8));
  PodContainer third(unseen, "guaranteed", "cri-containerd-", 20);
  third.workload.Go();
  const std::string c = std::to_string(third.workload.pid);
  REQUIRE(receiver.WaitFor([&](const auto&) { return !pushed_for(c).empty(); }, 60));
  std::map<std::string, std::string> got_c = pushed_for(c).back();
  CHECK(got_c.at("container_id") == unseen.container_id.substr(0, 12));
  CHECK(got_c.at("node") == "node-e2e");
  CHECK(got_c.at("hostname") == "node-e2e");
  CHECK(got_c.count("namespace") == 0);
  CHECK(got_c.count("pod") == 0);
  CHECK(got_c.count("container") == 0);
  CHECK(MetricValue(agent.Get("/metrics"),
                    "parascope_kubernetes_lookups_total{result=\"pod_unknown\"}") >= 1);
  CHECK(agent.Stop() == 0);
}

// Targeting: --target-namespaces and --target-pod-selector keep exactly the selected pods'
// processes (files and pushes); every other process, host ones included, is left out and counted.
TEST_CASE("kubernetes: --target-namespaces and --target-pod-selector profile only selected pods",
          "[root][e2e][kubernetes]") {
  if (!RequireRoot()) return;
  TwoPods pods;
  testing::FakeApiServer api("node-e2e", "e2e-token");
  api.Apply(pods.checkout);
  api.Apply(pods.report);
  PodContainer checkout(pods.checkout, "burstable", "cri-containerd-", 30);
  PodContainer report(pods.report, "besteffort", "crio-", 30);
  checkout.workload.Go();
  report.workload.Go();
  TempDir dir;
  const std::string token = WriteToken(dir);
  struct Case {
    std::string flag;
    int want_pid;
  };
  for (const Case& c : {Case{"--target-namespaces=shop,web", checkout.workload.pid},
                        Case{"--target-pod-selector=tier in (batch),app!=checkout",
                             report.workload.pid}}) {
    INFO(c.flag);
    const std::string out = dir.path() + "/out-" + std::to_string(c.want_pid);
    Child agent({PS_AGENT_BIN, "--kubernetes=true", "--kubernetes-api-url=" + api.url(),
                 "--kubernetes-node-name=node-e2e", "--kubernetes-token-file=" + token, c.flag,
                 "--profiles=cpu", "--sampling-frequency=49", "--collect-interval=2s",
                 "--duration=5s", "--http-address=", "--output-dir=" + out});
    int status = agent.Wait(120);
    INFO(agent.stderr_text());
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    std::set<int> pids;
    for (const auto& e : std::filesystem::directory_iterator(out)) {
      int pid = 0;
      if (absl::SimpleAtoi(e.path().filename().string(), &pid)) pids.insert(pid);
    }
    CHECK(pids == std::set<int>{c.want_pid});
    CHECK(ProfileFiles(out, c.want_pid, "process_cpu").size() >= 2);
  }
}

}  // namespace parascope::testing
