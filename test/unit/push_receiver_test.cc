// The exporter's real transports (gRPC via grpc++, Connect via cpp-httplib) against
// ps_test_receiver on localhost: wire format, headers, failure handling, outages, TLS. No
// privileges needed; every wait is on an event (a receiver line) or a condition, never a fixed
// sleep (a delay before Cancel() only chooses the phase it interrupts).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "agent/export/push_transport.h"
#include "agent/export/pyroscope_exporter.h"
#include "agent/profile/pprof_builder.h"
#include "test/receiver/receiver_client.h"

namespace parascope::testing {
namespace {

ProcessProfile Profile(int i, const std::string& type = "process_cpu") {
  PprofBuilder b({{"samples", "count"}, {"cpu", "nanoseconds"}}, {"cpu", "nanoseconds"}, 1000);
  uint64_t main_fn = b.AddFunction({"main", "main", ""});
  uint64_t leaf_fn = b.AddFunction({"leaf", "leaf", ""});
  uint64_t main_loc = b.AddLocation(0, 0x1000, {main_fn});
  uint64_t leaf_loc = b.AddLocation(0, 0x2000, {leaf_fn});
  std::vector<uint64_t> stack = {leaf_loc, main_loc};
  std::vector<int64_t> values = {i + 1, (i + 1) * 1000};
  b.AddSample(stack, values, {});
  ProcessProfile p;
  p.process.tgid = 4242;
  p.process_name = "worker";
  p.type = type;
  p.profile = std::move(b).Build(absl::ToUnixNanos(absl::Now()), 15000000000);
  return p;
}

SeriesLabelsFn Labels() {
  return [](const ProcessProfile& p) {
    return std::vector<std::pair<std::string, std::string>>{{"service_name", p.process_name},
                                                            {"hostname", "test-host"}};
  };
}

std::unique_ptr<PyroscopeExporter> MakeExporter(PyroscopeOptions o) {
  o.backoff_initial = absl::Milliseconds(10);
  o.backoff_max = absl::Milliseconds(200);
  o.shutdown_timeout = absl::Seconds(1);
  auto e = PyroscopeExporter::Create(o, Labels());
  INFO(e.status());
  REQUIRE(e.ok());
  return std::move(*e);
}

template <typename F>
bool StatsEventually(PyroscopeExporter* e, F cond, int timeout_s = 30) {
  auto deadline = absl::Now() + absl::Seconds(timeout_s);
  while (absl::Now() < deadline) {
    if (cond(e->GetStats())) return true;
    absl::SleepFor(absl::Milliseconds(5));
  }
  return cond(e->GetStats());
}

std::string UrlFor(const TestReceiver& r, const std::string& protocol, bool tls = false) {
  return protocol == "grpc" ? r.GrpcUrl(tls) : r.HttpUrl(tls);
}

// A localhost port whose connects hang, as an unreachable server's do: a listener that never
// accepts, its accept queue (backlog 0) filled by one connection, drops new SYNs (Linux checks a
// full accept queue before SYN cookies), so a client stays in SYN_SENT.
class HangingPort {
 public:
  HangingPort() {
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(listener_, 0) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port_ = ntohs(a.sin_port);
    filler_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(connect(filler_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  }
  ~HangingPort() {
    close(filler_);
    close(listener_);
  }
  std::string Url() const { return absl::StrCat("http://127.0.0.1:", port_); }

 private:
  int listener_ = -1, filler_ = -1, port_ = 0;
};

// Push of an empty request on a fresh transport; Cancel() from another thread after `cancel_after`
// if set. Returns the result and how long Push took.
std::pair<PushResult, absl::Duration> TimedPush(const std::string& url, const std::string& protocol,
                                                absl::Duration timeout,
                                                std::optional<absl::Duration> cancel_after) {
  PyroscopeOptions o;
  o.url = url;
  o.protocol = protocol;
  auto parsed = ParseRemoteUrl(o.url);
  REQUIRE(parsed.ok());
  auto t = MakePushTransport(o, *parsed);
  REQUIRE(t.ok());
  std::thread canceller;
  if (cancel_after) {
    // The delay only decides which phase is interrupted; a Cancel() before Push is also final.
    canceller = std::thread([&] {
      absl::SleepFor(*cancel_after);
      (*t)->Cancel();
    });
  }
  absl::Time start = absl::Now();
  PushResult r = (*t)->Push(push::v1::PushRequest(), timeout);
  absl::Duration took = absl::Now() - start;
  if (canceller.joinable()) canceller.join();
  return {r, took};
}

}  // namespace

TEST_CASE("receiver: both protocols deliver labels, headers, IDs and the profile", "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--strict"});
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol);
      o.protocol = protocol;
      o.tenant_id = "tenant-7";
      o.basic_auth_user = "alice";
      o.basic_auth_password = "s3cret";
      o.headers = {{"X-Team", "perf"}};
      auto e = MakeExporter(o);
      for (int i = 0; i < 3; ++i) {
        REQUIRE(e->Export(Profile(i, i == 2 ? "wall" : "process_cpu")).ok());
      }
      REQUIRE(receiver.WaitForOk(3));
      e->Shutdown();
      auto records = receiver.Records();
      REQUIRE(records.size() == 3);
      std::set<std::string> ids;
      for (size_t i = 0; i < records.size(); ++i) {
        const auto& r = records[i];
        INFO(r.DebugString());
        CHECK(r.protocol() == protocol);
        CHECK(r.result() == "ok");
        CHECK(r.violations().empty());
        CHECK(r.headers().at("x-scope-orgid") == "tenant-7");
        CHECK(r.headers().at("authorization") == "Basic " + absl::Base64Escape("alice:s3cret"));
        CHECK(r.headers().at("x-team") == "perf");
        CHECK(absl::StrContains(r.user_agent(), "parascope"));
        if (protocol == "connect") CHECK(r.content_type() == "application/proto");
        REQUIRE(r.series_size() == 1);
        std::map<std::string, std::string> labels(r.series(0).labels().begin(),
                                                  r.series(0).labels().end());
        CHECK(labels ==
              std::map<std::string, std::string>{{"__name__", i == 2 ? "wall" : "process_cpu"},
                                                 {"service_name", "worker"},
                                                 {"hostname", "test-host"}});
        REQUIRE(r.series(0).samples_size() == 1);
        const auto& s = r.series(0).samples(0);
        ids.insert(s.id());
        CHECK(s.profile().sample_types(1) == "cpu/nanoseconds");
        CHECK(s.profile().totals(1) == static_cast<int64_t>(i + 1) * 1000);
        // The raw profile file reads back with the real pprof tool.
        RawProfile p = ReadWithPprof(s.file());
        CHECK(p.Total(1) == static_cast<int64_t>(i + 1) * 1000);
      }
      CHECK(ids.size() == 3);
      auto st = e->GetStats();
      CHECK(st.sent == 3);
      CHECK(st.retries == 0);
    }
  }
}

TEST_CASE("receiver: a bearer token reaches the server", "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol);
      o.protocol = protocol;
      o.bearer_token = "tok-123";
      auto e = MakeExporter(o);
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(1));
      auto r = receiver.Records();
      REQUIRE(r.size() == 1);
      CHECK(r[0].headers().at("authorization") == "Bearer tok-123");
      CHECK(r[0].headers().count("x-scope-orgid") == 0);
    }
  }
}

TEST_CASE("receiver: 429 / RESOURCE_EXHAUSTED is retried, 400 / INVALID_ARGUMENT is not",
          "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol);
      o.protocol = protocol;
      auto e = MakeExporter(o);

      receiver.Command("fail count=3 status=429 grpc=RESOURCE_EXHAUSTED");
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(1));
      auto records = receiver.Records();
      REQUIRE(records.size() == 4);  // three refusals, then delivered: same ID throughout
      for (const auto& r : records) {
        CHECK(r.series(0).samples(0).id() == records[0].series(0).samples(0).id());
      }
      CHECK(records[0].result() == (protocol == "grpc" ? "grpc RESOURCE_EXHAUSTED" : "http 429"));
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.sent == 1; }));
      auto st = e->GetStats();
      CHECK(st.retries == 3);
      CHECK(st.failures.at(protocol == "grpc" ? "RESOURCE_EXHAUSTED" : "429") == 3);

      receiver.Command("fail count=1 status=400 grpc=INVALID_ARGUMENT");
      REQUIRE(e->Export(Profile(1)).ok());  // rejected
      REQUIRE(e->Export(Profile(2)).ok());  // delivered after it: the rejected one is not retried
      REQUIRE(receiver.WaitForOk(2));
      records = receiver.Records();
      REQUIRE(records.size() == 6);
      CHECK(records[4].result() == (protocol == "grpc" ? "grpc INVALID_ARGUMENT" : "http 400"));
      CHECK(records[5].result() == "ok");
      CHECK(records[5].series(0).samples(0).id() != records[4].series(0).samples(0).id());
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.sent == 2; }));
      st = e->GetStats();
      CHECK(st.retries == 3);
      CHECK(st.dropped.at("rejected") == 1);
      CHECK(st.failures.at(protocol == "grpc" ? "INVALID_ARGUMENT" : "400") == 1);
    }
  }
}

TEST_CASE("receiver: an outage (connections refused) is retried and nothing is lost",
          "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol);
      o.protocol = protocol;
      auto e = MakeExporter(o);
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(1));  // the connection is up (and pooled)
      receiver.Command("refuse");
      for (int i = 1; i <= 5; ++i) REQUIRE(e->Export(Profile(i)).ok());
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.retries >= 3; }));
      auto st = e->GetStats();
      CHECK_FALSE(st.endpoint_up);
      CHECK(st.queue_length >= 5);
      INFO("failures: " << st.failures.size());
      CHECK(st.failures.count(protocol == "grpc" ? "UNAVAILABLE" : "connect") == 1);
      receiver.Command("accept");
      REQUIRE(receiver.WaitForOk(6));
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.sent == 6; }));
      st = e->GetStats();
      CHECK(st.endpoint_up);
      CHECK(st.dropped.empty());
      CHECK(st.queue_bytes == 0);
      // In order, each exactly once.
      auto ok = receiver.OkRecords();
      REQUIRE(ok.size() == 6);
      for (int i = 0; i < 6; ++i) {
        CHECK(ok[i].series(0).samples(0).profile().totals(1) == (i + 1) * 1000);
      }
    }
  }
}

TEST_CASE("receiver: a slow server hits the request timeout and the push is retried",
          "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol);
      o.protocol = protocol;
      o.request_timeout = absl::Milliseconds(300);
      auto e = MakeExporter(o);
      receiver.Command("delay ms=3000 count=1");
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(2));  // the slow one (answered after the client gave up), then
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.sent == 1; }));
      auto st = e->GetStats();
      CHECK(st.retries >= 1);
      CHECK(st.failures.count(protocol == "grpc" ? "DEADLINE_EXCEEDED" : "timeout") == 1);
    }
  }
}

TEST_CASE("receiver: TLS verifies the server with the given CA, a wrong CA fails clearly",
          "[receiver]") {
  TempDir certs_dir;
  TestCerts certs(certs_dir.path());
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key});
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol, /*tls=*/true);
      o.protocol = protocol;
      o.tls_ca_file = certs.ca;
      {
        auto e = MakeExporter(o);
        REQUIRE(e->Export(Profile(0)).ok());
        REQUIRE(receiver.WaitForOk(1));
      }
      o.tls_ca_file = certs.other_ca;
      auto e = MakeExporter(o);
      REQUIRE(e->Export(Profile(1)).ok());
      REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.retries >= 2; }));
      auto st = e->GetStats();
      CHECK(st.sent == 0);
      CHECK_FALSE(st.endpoint_up);
      INFO("last error: " << st.last_error);
      CHECK(st.failures.count(protocol == "grpc" ? "UNAVAILABLE" : "tls") == 1);
      std::string lower = absl::AsciiStrToLower(st.last_error);
      CHECK((absl::StrContains(lower, "certificate") || absl::StrContains(lower, "handshake")));
      CHECK(receiver.CountOk() == 1);
    }
  }
}

TEST_CASE("receiver: TLS to a host name checks the certificate's name", "[receiver]") {
  TempDir certs_dir;
  TestCerts certs(certs_dir.path());
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key});
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol, /*tls=*/true);
      REQUIRE(absl::StrContains(o.url, "127.0.0.1"));
      o.url = absl::StrReplaceAll(o.url, {{"127.0.0.1", "localhost"}});  // SAN DNS:localhost
      o.protocol = protocol;
      o.tls_ca_file = certs.ca;
      auto e = MakeExporter(o);
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(1));
    }
  }
}

TEST_CASE("receiver: client certificates (mutual TLS)", "[receiver]") {
  TempDir certs_dir;
  TestCerts certs(certs_dir.path());
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key,
                             "--tls-client-ca=" + certs.ca});
      PyroscopeOptions o;
      o.url = UrlFor(receiver, protocol, /*tls=*/true);
      o.protocol = protocol;
      o.tls_ca_file = certs.ca;
      o.tls_cert_file = certs.client_cert;
      o.tls_key_file = certs.client_key;
      auto e = MakeExporter(o);
      REQUIRE(e->Export(Profile(0)).ok());
      REQUIRE(receiver.WaitForOk(1));
      // Without a client certificate the handshake fails.
      o.tls_cert_file.clear();
      o.tls_key_file.clear();
      auto anonymous = MakeExporter(o);
      REQUIRE(anonymous->Export(Profile(1)).ok());
      REQUIRE(StatsEventually(anonymous.get(), [](const auto& s) { return s.retries >= 2; }));
      CHECK(anonymous->GetStats().sent == 0);
      CHECK(receiver.CountOk() == 1);
    }
  }
}

TEST_CASE("receiver: a hanging connect ends at the request deadline, and at once on Cancel()",
          "[receiver]") {
  HangingPort port;
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      auto [r, took] = TimedPush(port.Url(), protocol, absl::Milliseconds(500), std::nullopt);
      INFO(r.code << ": " << r.message);
      CHECK_FALSE(r.ok);
      CHECK(r.retryable);
      if (protocol == "connect") CHECK(r.code == "timeout");
      CHECK(took >= absl::Milliseconds(400));
      CHECK(took < absl::Seconds(3));

      auto [c, ctook] = TimedPush(port.Url(), protocol, absl::Seconds(20), absl::Milliseconds(200));
      INFO(c.code << ": " << c.message);
      CHECK_FALSE(c.ok);
      CHECK_FALSE(c.retryable);
      CHECK(c.code == (protocol == "grpc" ? "CANCELLED" : "cancelled"));
      CHECK(ctook < absl::Seconds(3));
    }
  }
}

TEST_CASE("receiver: Cancel() ends a request waiting for a slow server's answer", "[receiver]") {
  for (std::string protocol : {"grpc", "connect"}) {
    DYNAMIC_SECTION(protocol) {
      TestReceiver receiver;
      receiver.Command("delay ms=10000 count=1");
      auto [r, took] = TimedPush(UrlFor(receiver, protocol), protocol, absl::Seconds(20),
                                 absl::Milliseconds(500));
      INFO(r.code << ": " << r.message);
      CHECK_FALSE(r.ok);
      CHECK(r.code == (protocol == "grpc" ? "CANCELLED" : "cancelled"));
      CHECK(took < absl::Seconds(5));
    }
  }
}

TEST_CASE("receiver: Connect picks up a rotated CA file without a restart", "[receiver]") {
  TempDir certs_dir;
  TestCerts certs(certs_dir.path());
  TestReceiver receiver({"--tls-cert=" + certs.server_cert, "--tls-key=" + certs.server_key});
  std::string ca = certs_dir.path() + "/rotating_ca.pem";
  auto install = [&](const std::string& from) {  // as rotation tools do: write, then rename
    std::filesystem::copy_file(from, ca + ".new",
                               std::filesystem::copy_options::overwrite_existing);
    std::filesystem::rename(ca + ".new", ca);
  };
  install(certs.other_ca);
  PyroscopeOptions o;
  o.url = receiver.HttpUrl(/*tls=*/true);
  o.protocol = "connect";
  o.tls_ca_file = ca;
  auto e = MakeExporter(o);
  REQUIRE(e->Export(Profile(0)).ok());
  REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.retries >= 1; }));
  CHECK(e->GetStats().failures.count("tls") == 1);
  install(certs.ca);
  REQUIRE(receiver.WaitForOk(1));
  REQUIRE(StatsEventually(e.get(), [](const auto& s) { return s.sent == 1; }));
}

}  // namespace parascope::testing
