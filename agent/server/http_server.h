// The operator's HTTP endpoint (SPEC section 7, --http-address): /metrics, /healthz, /readyz.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "agent/server/metrics.h"

namespace httplib {
class Server;
}  // namespace httplib

namespace parascope::server {

// A parsed --http-address.
struct HostPort {
  std::string host;  // without brackets for IPv6 literals; "0.0.0.0" when the flag gave none
  uint16_t port = 0;
};

// Parses "host:port", "[v6]:port" or ":port" (all IPv4 interfaces). The port is a decimal number
// 0..65535 (0 = ephemeral). InvalidArgument naming the address and the problem.
absl::StatusOr<HostPort> ParseHostPort(absl::string_view address);

// Ready when OK; otherwise the status message is the reason shown by /readyz. Called on the
// server's thread for every /readyz request: must be thread-safe and quick.
using ReadinessCheck = std::function<absl::Status()>;

struct HttpServerOptions {
  std::string address = "127.0.0.1:7070";
  // Rendered by /metrics; not owned, must outlive the server. nullptr serves an empty page.
  const MetricsRegistry* metrics = nullptr;
  // nullptr: always ready.
  ReadinessCheck readiness;
};

// Serves, on its own thread (plus a pool of 2 request workers):
//   GET /metrics  200, Content-Type "text/plain; version=0.0.4; charset=utf-8",
//                 MetricsRegistry::RenderPrometheusText()
//   GET /healthz  200 "ok\n" while the process runs
//   GET /readyz   200 "ok\n" when the readiness check returns OK, else
//                 503 "not ready: <status message>\n"
// anything else 404. Connections are closed after each response (no keep-alive), so Stop() does
// not wait for idle clients. Start/Stop are not thread-safe with each other.
class HttpServer {
 public:
  explicit HttpServer(HttpServerOptions options);
  ~HttpServer();  // Stop()s.
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens (so connections are accepted once it returns), then serves on a new
  // thread. Errors name the flag and address, e.g.
  //   InvalidArgument "--http-address 127.0.0.1:x: port is not a number 0..65535"
  //   Unavailable     "--http-address 127.0.0.1:7070: address in use"
  //   NotFound        "--http-address nohost:7070: cannot resolve host: <gai_strerror>"
  //   PermissionDenied for ports < 1024 without CAP_NET_BIND_SERVICE,
  //   FailedPrecondition when already started.
  // The socket sets SO_REUSEADDR but not SO_REUSEPORT (httplib's default), so a second agent on
  // the same address fails instead of silently sharing the port.
  absl::Status Start();

  // Stops accepting, waits for in-flight requests (bounded by 2 s read / 5 s write timeouts) and
  // joins the thread. Idempotent.
  void Stop();

  // The bound port (the ephemeral one for port 0); 0 before Start().
  uint16_t port() const { return port_; }
  // The address as given.
  const std::string& address() const { return options_.address; }

 private:
  // Explains a failed bind by binding a probe socket the same way: errno -> status.
  absl::Status BindError(const HostPort& hp) const;

  HttpServerOptions options_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listen_done_{false};
  uint16_t port_ = 0;
};

}  // namespace parascope::server
