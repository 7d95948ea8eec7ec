#include "agent/server/http_server.h"

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <catch2/catch.hpp>
#include <string>

#include "absl/strings/match.h"

namespace parascope::server {
namespace {

TEST_CASE("ParseHostPort accepts host:port, [v6]:port and :port") {
  auto a = ParseHostPort("127.0.0.1:7070");
  REQUIRE(a.ok());
  CHECK(a->host == "127.0.0.1");
  CHECK(a->port == 7070);
  auto b = ParseHostPort("[::1]:0");
  REQUIRE(b.ok());
  CHECK(b->host == "::1");
  CHECK(b->port == 0);
  auto c = ParseHostPort(":65535");
  REQUIRE(c.ok());
  CHECK(c->host == "0.0.0.0");
  CHECK(c->port == 65535);
  auto d = ParseHostPort("localhost:80");
  REQUIRE(d.ok());
  CHECK(d->host == "localhost");
  CHECK(d->port == 80);
}

TEST_CASE("ParseHostPort rejects malformed addresses") {
  CHECK(ParseHostPort("127.0.0.1").status().message() ==
        "--http-address 127.0.0.1: expected host:port");
  CHECK(ParseHostPort("127.0.0.1:x").status().message() ==
        "--http-address 127.0.0.1:x: port is not a number 0..65535");
  CHECK(ParseHostPort("127.0.0.1:65536").status().message() ==
        "--http-address 127.0.0.1:65536: port is not a number 0..65535");
  CHECK(ParseHostPort("127.0.0.1:").status().message() ==
        "--http-address 127.0.0.1:: port is not a number 0..65535");
  CHECK(ParseHostPort("127.0.0.1:-1").status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(ParseHostPort("::1:7070").status().message() ==
        "--http-address ::1:7070: IPv6 addresses need brackets, e.g. [::1]:7070");
  CHECK(ParseHostPort("[::1:7070").status().message() ==
        "--http-address [::1:7070: missing ']' after an IPv6 address");
  CHECK(ParseHostPort("[::1]7070").status().message() ==
        "--http-address [::1]7070: expected host:port");
}

TEST_CASE("HttpServer serves /metrics, /healthz and /readyz") {
  MetricsRegistry metrics;
  metrics.GetCounter("parascope_samples_total", "Samples taken.").Increment(7);
  std::atomic<bool> ready{false};
  HttpServerOptions options;
  options.address = "127.0.0.1:0";
  options.metrics = &metrics;
  options.readiness = [&ready]() -> absl::Status {
    if (ready) return absl::OkStatus();
    return absl::UnavailableError("endpoint unreachable for 31s (> 2 windows)");
  };
  HttpServer server(options);
  CHECK(server.port() == 0);
  absl::Status started = server.Start();
  REQUIRE(started.ok());
  REQUIRE(server.port() != 0);

  httplib::Client client("127.0.0.1", server.port());
  auto metrics_res = client.Get("/metrics");
  REQUIRE(metrics_res);
  CHECK(metrics_res->status == 200);
  CHECK(metrics_res->get_header_value("Content-Type") ==
        "text/plain; version=0.0.4; charset=utf-8");
  CHECK(metrics_res->body ==
        "# HELP parascope_samples_total Samples taken.\n"
        "# TYPE parascope_samples_total counter\n"
        "parascope_samples_total 7\n");

  auto health = client.Get("/healthz");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(health->body == "ok\n");

  auto not_ready = client.Get("/readyz");
  REQUIRE(not_ready);
  CHECK(not_ready->status == 503);
  CHECK(not_ready->body == "not ready: endpoint unreachable for 31s (> 2 windows)\n");
  ready = true;
  auto is_ready = client.Get("/readyz");
  REQUIRE(is_ready);
  CHECK(is_ready->status == 200);
  CHECK(is_ready->body == "ok\n");

  auto missing = client.Get("/nope");
  REQUIRE(missing);
  CHECK(missing->status == 404);

  // Values are rendered per scrape.
  metrics.GetCounter("parascope_samples_total", "").Increment();
  auto again = client.Get("/metrics");
  REQUIRE(again);
  CHECK(again->body ==
        "# HELP parascope_samples_total Samples taken.\n"
        "# TYPE parascope_samples_total counter\n"
        "parascope_samples_total 8\n");

  CHECK(server.Start().code() == absl::StatusCode::kFailedPrecondition);
  server.Stop();
  server.Stop();  // idempotent
  auto after = client.Get("/healthz");
  CHECK(!after);
}

TEST_CASE("HttpServer without registry or readiness check") {
  HttpServer server(HttpServerOptions{"127.0.0.1:0", nullptr, nullptr});
  REQUIRE(server.Start().ok());
  httplib::Client client("127.0.0.1", server.port());
  auto m = client.Get("/metrics");
  REQUIRE(m);
  CHECK(m->status == 200);
  CHECK(m->body == "");
  auto r = client.Get("/readyz");
  REQUIRE(r);
  CHECK(r->status == 200);
  CHECK(r->body == "ok\n");
}

TEST_CASE("HttpServer reports an address in use, also against another HttpServer") {
  HttpServer first(HttpServerOptions{"127.0.0.1:0", nullptr, nullptr});
  REQUIRE(first.Start().ok());
  std::string address = "127.0.0.1:" + std::to_string(first.port());
  HttpServer second(HttpServerOptions{address, nullptr, nullptr});
  absl::Status s = second.Start();
  CHECK(s.code() == absl::StatusCode::kUnavailable);
  CHECK(s.message() == "--http-address " + address + ": address in use");
  CHECK(second.port() == 0);

  // A plain listening socket (no SO_REUSEPORT) too.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in sin{};
  sin.sin_family = AF_INET;
  sin.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&sin), sizeof(sin)) == 0);
  REQUIRE(listen(fd, 1) == 0);
  socklen_t len = sizeof(sin);
  REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&sin), &len) == 0);
  std::string taken = "127.0.0.1:" + std::to_string(ntohs(sin.sin_port));
  HttpServer third(HttpServerOptions{taken, nullptr, nullptr});
  CHECK(third.Start().message() == "--http-address " + taken + ": address in use");
  close(fd);
}

TEST_CASE("HttpServer reports unusable addresses") {
  HttpServer bad_port(HttpServerOptions{"127.0.0.1:http", nullptr, nullptr});
  CHECK(bad_port.Start().message() ==
        "--http-address 127.0.0.1:http: port is not a number 0..65535");
  // 192.0.2.0/24 is TEST-NET-1 (RFC 5737): not an address of this host.
  HttpServer foreign(HttpServerOptions{"192.0.2.1:0", nullptr, nullptr});
  absl::Status s = foreign.Start();
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(s.message() ==
        "--http-address 192.0.2.1:0: address not available (not an address of this host)");
  HttpServer unresolvable(HttpServerOptions{"no-such-host.invalid:0", nullptr, nullptr});
  absl::Status u = unresolvable.Start();
  CHECK(u.code() == absl::StatusCode::kNotFound);
  CHECK(absl::StartsWith(u.message(),
                         "--http-address no-such-host.invalid:0: cannot resolve host: "));
}

TEST_CASE("HttpServer stops right after starting") {
  for (int i = 0; i < 20; ++i) {
    HttpServer server(HttpServerOptions{"127.0.0.1:0", nullptr, nullptr});
    REQUIRE(server.Start().ok());
    server.Stop();
  }
}

}  // namespace
}  // namespace parascope::server
