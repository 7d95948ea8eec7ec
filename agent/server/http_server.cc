#include "agent/server/http_server.h"

#include <httplib.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "agent/util/log.h"
#include "agent/util/thread_name.h"

namespace parascope::server {
namespace {

constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";
constexpr char kTextContentType[] = "text/plain; charset=utf-8";
constexpr size_t kWorkerThreads = 2;

// Replaces httplib's default_socket_options, which sets SO_REUSEPORT (so two agents could listen
// on one port and split the scrapes between them).
void ReuseAddrOnly(int fd) {
  int yes = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
}

}  // namespace

absl::StatusOr<HostPort> ParseHostPort(absl::string_view address) {
  auto error = [&](absl::string_view what) {
    return absl::InvalidArgumentError(absl::StrCat("--http-address ", address, ": ", what));
  };
  HostPort hp;
  absl::string_view port_text;
  if (!address.empty() && address.front() == '[') {
    size_t close = address.find(']');
    if (close == absl::string_view::npos) return error("missing ']' after an IPv6 address");
    hp.host = std::string(address.substr(1, close - 1));
    if (hp.host.empty()) return error("empty IPv6 address");
    if (close + 1 >= address.size() || address[close + 1] != ':') {
      return error("expected host:port");
    }
    port_text = address.substr(close + 2);
  } else {
    size_t colon = address.rfind(':');
    if (colon == absl::string_view::npos) return error("expected host:port");
    hp.host = std::string(address.substr(0, colon));
    if (hp.host.find(':') != std::string::npos) {
      return error("IPv6 addresses need brackets, e.g. [::1]:7070");
    }
    if (hp.host.empty()) hp.host = "0.0.0.0";
    port_text = address.substr(colon + 1);
  }
  uint32_t port = 0;
  bool digits = !port_text.empty() && port_text.size() <= 5 &&
                port_text.find_first_not_of("0123456789") == absl::string_view::npos;
  if (!digits || !absl::SimpleAtoi(port_text, &port) || port > 65535) {
    return error("port is not a number 0..65535");
  }
  hp.port = static_cast<uint16_t>(port);
  return hp;
}

HttpServer::HttpServer(HttpServerOptions options) : options_(std::move(options)) {}

HttpServer::~HttpServer() { Stop(); }

absl::Status HttpServer::BindError(const HostPort& hp) const {
  std::string prefix = absl::StrCat("--http-address ", options_.address, ": ");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* result = nullptr;
  std::string service = absl::StrCat(hp.port);
  int rc = getaddrinfo(hp.host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    return absl::NotFoundError(absl::StrCat(prefix, "cannot resolve host: ", gai_strerror(rc)));
  }
  int err = 0;
  for (addrinfo* ai = result; ai != nullptr; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    ReuseAddrOnly(fd);
    if (bind(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
    } else if (listen(fd, 1) != 0) {
      err = errno;
    } else {
      err = 0;
    }
    close(fd);
    if (err == 0) break;
  }
  freeaddrinfo(result);
  switch (err) {
    case EADDRINUSE:
      return absl::UnavailableError(absl::StrCat(prefix, "address in use"));
    case EADDRNOTAVAIL:
      return absl::InvalidArgumentError(
          absl::StrCat(prefix, "address not available (not an address of this host)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat(prefix, "permission denied (ports below 1024 need CAP_NET_BIND_SERVICE)"));
    case 0:  // the probe bound: the failure was transient or inside httplib
      return absl::UnavailableError(absl::StrCat(prefix, "cannot listen"));
    default:
      return absl::UnavailableError(absl::StrCat(prefix, "cannot listen: ", std::strerror(err)));
  }
}

absl::Status HttpServer::Start() {
  if (server_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("--http-address ", options_.address, ": server already started"));
  }
  absl::StatusOr<HostPort> hp = ParseHostPort(options_.address);
  if (!hp.ok()) return hp.status();

  auto server = std::make_unique<httplib::Server>();
  server->new_task_queue = [] { return new httplib::ThreadPool(kWorkerThreads); };
  server->set_socket_options(ReuseAddrOnly);
  server->set_keep_alive_max_count(1);
  server->set_read_timeout(2, 0);
  server->set_write_timeout(5, 0);

  const MetricsRegistry* metrics = options_.metrics;
  server->Get("/metrics", [metrics](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics != nullptr ? metrics->RenderPrometheusText() : std::string(),
                    kMetricsContentType);
  });
  server->Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", kTextContentType);
  });
  ReadinessCheck readiness = options_.readiness;
  server->Get("/readyz", [readiness](const httplib::Request&, httplib::Response& res) {
    absl::Status ready = readiness ? readiness() : absl::OkStatus();
    if (ready.ok()) {
      res.set_content("ok\n", kTextContentType);
    } else {
      res.status = 503;
      res.set_content(absl::StrCat("not ready: ", ready.message(), "\n"), kTextContentType);
    }
  });

  int port;
  if (hp->port == 0) {
    port = server->bind_to_any_port(hp->host);
  } else {
    port = server->bind_to_port(hp->host, hp->port) ? hp->port : -1;
  }
  if (port <= 0) return BindError(*hp);
  port_ = static_cast<uint16_t>(port);

  listen_done_ = false;
  httplib::Server* raw = server.get();
  server_ = std::move(server);
  thread_ = std::thread([this, raw] {
    NameThisThread("ps-http");
    if (!raw->listen_after_bind()) {
      Log(LogLevel::kError, "--http-address %s: HTTP server stopped unexpectedly",
          options_.address);
    }
    listen_done_ = true;
  });
  // httplib::Server::stop() is a no-op until the listen loop has marked itself running (its first
  // statement); wait for that so a Stop() right after Start() cannot leave the loop running and
  // the join waiting forever.
  while (!raw->is_running() && !listen_done_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (listen_done_) {
    Stop();
    return absl::UnavailableError(
        absl::StrCat("--http-address ", options_.address, ": HTTP server did not start"));
  }
  Log(LogLevel::kInfo, "serving /metrics, /healthz, /readyz on %s (port %d)", options_.address,
      port_);
  return absl::OkStatus();
}

void HttpServer::Stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace parascope::server
