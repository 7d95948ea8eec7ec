#include "agent/export/push_transport.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "agent/proc/read_file.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "proto/push.grpc.pb.h"
#include "agent/util/thread_name.h"

namespace parascope {
namespace {

constexpr char kUserAgent[] = "parascope";
// The system's CA bundle (Debian's ca-certificates), used when --tls-ca-file is not given so
// both transports trust the same roots.
constexpr char kSystemCaBundle[] = "/etc/ssl/certs/ca-certificates.crt";
// At most this much of an error response body is kept for the log line.
constexpr size_t kMaxErrorBody = 4096;

// Printable one-line excerpt of a server message.
std::string Excerpt(absl::string_view text, size_t max = 300) {
  std::string out;
  for (char c : text.substr(0, max)) {
    out.push_back(absl::ascii_isprint(static_cast<unsigned char>(c)) ? c : ' ');
  }
  if (text.size() > max) out += "...";
  return std::string(absl::StripAsciiWhitespace(out));
}

// The string value of "key" in a flat JSON object such as Connect's error body
// {"code":"resource_exhausted","message":"..."}; "" if absent. Handles \" and \\ escapes only.
std::string JsonStringField(absl::string_view json, absl::string_view key) {
  std::string needle = absl::StrCat("\"", key, "\"");
  size_t at = json.find(needle);
  if (at == absl::string_view::npos) return "";
  size_t colon = json.find(':', at + needle.size());
  if (colon == absl::string_view::npos) return "";
  size_t q = json.find_first_not_of(" \t\r\n", colon + 1);
  if (q == absl::string_view::npos || json[q] != '"') return "";
  std::string out;
  for (size_t i = q + 1; i < json.size(); ++i) {
    if (json[i] == '\\' && i + 1 < json.size()) {
      out.push_back(json[++i]);
    } else if (json[i] == '"') {
      return out;
    } else {
      out.push_back(json[i]);
    }
  }
  return "";
}

// ---- gRPC ----

// gRPC's own log lines (e.g. one per failed TLS handshake, every reconnect attempt) go to the
// agent's log at debug level: the exporter logs endpoint state changes itself, once.
void GrpcLogToDebug(gpr_log_func_args* args) {
  Log(LogLevel::kDebug, "grpc %s:%d: %s", args->file, args->line, args->message);
}

class GrpcTransport : public PushTransport {
 public:
  GrpcTransport(std::shared_ptr<grpc::Channel> channel,
                std::vector<std::pair<std::string, std::string>> headers)
      : channel_(channel),
        stub_(push::v1::PusherService::NewStub(channel)),
        headers_(std::move(headers)) {
    // gRPC metadata keys are lowercase.
    for (auto& h : headers_) h.first = absl::AsciiStrToLower(h.first);
  }

  PushResult Push(const push::v1::PushRequest& request, absl::Duration timeout) override {
    if (channel_->GetState(/*try_to_connect=*/true) != GRPC_CHANNEL_READY) {
      // The synchronous API polls a channel's connections only while a call or a watch is
      // pending, and a fail-fast call in TRANSIENT_FAILURE does not wait: a reconnect to a
      // recovered server would be noticed only by gRPC's 5 s backup poller. Watching the state
      // for a moment drives the connection attempt; the call below then reports its outcome.
      absl::Duration wait = std::min(timeout / 2, absl::Seconds(1));
      channel_->WaitForConnected(absl::ToChronoTime(absl::Now() + wait));
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    for (const auto& [k, v] : headers_) ctx.AddMetadata(k, v);
    push::v1::PushResponse response;
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return PushResult{false, false, "CANCELLED", "cancelled at shutdown"};
      current_ = &ctx;
    }
    grpc::Status s = stub_->Push(&ctx, request, &response);
    {
      absl::MutexLock l(&mu_);
      current_ = nullptr;
    }
    PushResult r;
    if (s.ok()) {
      r.ok = true;
      return r;
    }
    int code = static_cast<int>(s.error_code());
    r.code = GrpcCodeName(code);
    r.retryable = IsRetryableGrpcCode(code);
    r.message = absl::StrCat("gRPC ", r.code, ": ", Excerpt(s.error_message(), 500));
    return r;
  }

  void Cancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (current_ != nullptr) current_->TryCancel();
  }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<push::v1::PusherService::Stub> stub_;
  std::vector<std::pair<std::string, std::string>> headers_;
  absl::Mutex mu_;
  grpc::ClientContext* current_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

absl::StatusOr<std::unique_ptr<PushTransport>> MakeGrpc(
    const PyroscopeOptions& o, const RemoteUrl& url,
    std::vector<std::pair<std::string, std::string>> headers) {
  static std::once_flag log_once;
  std::call_once(log_once, [] { gpr_set_log_function(GrpcLogToDebug); });
  if (!url.path.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--remote-url \"", o.url,
        "\": a path prefix needs --remote-protocol=connect (gRPC method paths are fixed)"));
  }
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (url.tls()) {
    grpc::SslCredentialsOptions ssl;
    if (!o.tls_ca_file.empty()) {
      PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, proc::ReadFileToString(o.tls_ca_file));
    } else if (access(kSystemCaBundle, R_OK) == 0) {
      PS_ASSIGN_OR_RETURN(ssl.pem_root_certs, proc::ReadFileToString(kSystemCaBundle));
    }
    if (!o.tls_cert_file.empty()) {
      PS_ASSIGN_OR_RETURN(ssl.pem_cert_chain, proc::ReadFileToString(o.tls_cert_file));
      PS_ASSIGN_OR_RETURN(ssl.pem_private_key, proc::ReadFileToString(o.tls_key_file));
    }
    creds = grpc::SslCredentials(ssl);
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  grpc::ChannelArguments args;
  args.SetUserAgentPrefix(kUserAgent);
  // The sender retries with its own policy; no second layer of retries inside gRPC.
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  // While the endpoint is down the channel reconnects on its own backoff; an RPC issued before
  // that backoff expires fails at once with UNAVAILABLE. Keep it no slower than ours (and at
  // most 10 s), so delivery resumes promptly once the server is back.
  auto ms = [](absl::Duration d) {
    return static_cast<int>(std::clamp<int64_t>(absl::ToInt64Milliseconds(d), 100, 10000));
  };
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, ms(o.backoff_initial));
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, ms(o.backoff_max));
  // Re-resolve a moved endpoint's name sooner than the default 30 s.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 5000);
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(url.Authority(), creds, args);
  return std::make_unique<GrpcTransport>(std::move(channel), std::move(headers));
}

// ---- Connect over HTTP/1.1 (cpp-httplib) ----

// OpenSSL's queued error reasons of this thread, "; "-separated (at most 3), and clears the queue.
std::string TakeOpenSslErrors() {
  std::vector<std::string> reasons;
  while (unsigned long e = ERR_get_error()) {
    const char* reason = ERR_reason_error_string(e);
    std::string text = reason != nullptr ? reason : absl::StrCat("error ", e);
    // cpp-httplib's SSL_shutdown of a failed connection adds this one; it says nothing.
    if (text == "shutdown while in init") continue;
    if (reasons.size() < 3 && std::find(reasons.begin(), reasons.end(), text) == reasons.end()) {
      reasons.push_back(std::move(text));
    }
  }
  return absl::StrJoin(reasons, "; ");
}

// What identifies a version of a file: a rotated file (renamed over, or a Kubernetes secret's
// symlink swapped) has a new inode, size or mtime. "-" if stat fails.
std::string FileStamp(const std::string& path) {
  struct stat st;
  if (path.empty() || stat(path.c_str(), &st) != 0) return "-";
  return absl::StrCat(st.st_dev, ":", st.st_ino, ":", st.st_size, ":", st.st_mtim.tv_sec, ".",
                      st.st_mtim.tv_nsec);
}

// Blocks SIGPIPE in this thread while alive and discards one raised meanwhile: cpp-httplib writes
// with plain send()/SSL_write, and a server that closes mid-request must not kill a process that
// has not ignored SIGPIPE (the agent does; a library user or a test binary may not).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      struct timespec zero = {0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Connect unary (SPEC section 6) over HTTP/1.1 with cpp-httplib's client, keeping one connection
// alive between requests (a new one when the server closed it, once more on a fresh connection
// when a reused one turns out dead before any response, as libcurl did).
//
// cpp-httplib 0.11 has no total deadline, and its stop() waits for a connect or TLS handshake in
// progress (send() holds the socket mutex meanwhile). So the deadline and Cancel() are enforced
// here: when cpp-httplib creates a socket (its socket-options hook), a duplicate of the
// descriptor is kept, and a watchdog thread at the deadline, or Cancel() at once, shuts the
// socket down through it. That fails a connect, a handshake, a write or a read at once, from any
// thread, without touching the client object; the duplicate is ours, so its number cannot be
// reused under us. Name resolution (getaddrinfo) cannot be interrupted: a socket created after
// the deadline or Cancel() is shut down as soon as it exists.
//
// TLS files are loaded into the client's SSL_CTX; when one of them changes on disk (rotation),
// the next request builds a new client, so renewed certificates are used without a restart.
class ConnectTransport : public PushTransport {
 public:
  ConnectTransport(const PyroscopeOptions& o, const RemoteUrl& url,
                   std::vector<std::pair<std::string, std::string>> headers)
      : url_(url),
        path_(absl::StrCat(url.path, kPushMethodPath)),
        ca_file_(o.tls_ca_file),
        cert_file_(o.tls_cert_file),
        key_file_(o.tls_key_file) {
    // The system's roots, as the gRPC transport uses, when no CA file is given.
    if (url_.tls() && ca_file_.empty() && access(kSystemCaBundle, R_OK) == 0) {
      ca_file_ = kSystemCaBundle;
      ca_is_system_ = true;
    }
    // Host as curl and browsers send it: the default port left out, IPv6 in brackets.
    host_header_ = absl::StrContains(url.host, ':') ? absl::StrCat("[", url.host, "]") : url.host;
    if (url.port != (url.tls() ? 443 : 80)) absl::StrAppend(&host_header_, ":", url.port);
    for (auto& [k, v] : headers) headers_.emplace(std::move(k), std::move(v));
    // Header names compare case-insensitively (httplib::Headers); a --remote-header User-Agent
    // replaces ours, as it did with libcurl.
    if (headers_.find("User-Agent") == headers_.end()) headers_.emplace("User-Agent", kUserAgent);
    watchdog_ = std::thread([this] {
      NameThisThread("ps-push-watch");
      Watch();
    });
  }

  ~ConnectTransport() override {
    {
      absl::MutexLock l(&mu_);
      exiting_ = true;
      cv_.Signal();
    }
    watchdog_.join();
    client_.reset();
    absl::MutexLock l(&mu_);
    DropSocketLocked();
  }

  // Builds the first client: errors in the TLS files (not PEM, key not matching the certificate)
  // surface at start. InvalidArgument naming the file and OpenSSL's reason.
  absl::Status Init() {
    stamp_ = TlsStamp();
    PS_ASSIGN_OR_RETURN(client_, NewClient());
    return absl::OkStatus();
  }

  PushResult Push(const push::v1::PushRequest& request, absl::Duration timeout) override {
    {
      absl::MutexLock l(&mu_);
      if (cancelled_) return PushResult{false, false, "cancelled", "cancelled at shutdown"};
    }
    if (url_.tls()) {
      std::string stamp = TlsStamp();
      if (stamp != stamp_ || client_ == nullptr) {
        client_.reset();
        {
          absl::MutexLock l(&mu_);
          DropSocketLocked();
        }
        auto client = NewClient();
        if (!client.ok()) {
          return PushResult{false, true, "tls", std::string(client.status().message())};
        }
        client_ = std::move(*client);
        stamp_ = std::move(stamp);
        Log(LogLevel::kInfo, "push: TLS files changed on disk, reloaded them");
      }
    }
    int64_t timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
    std::chrono::milliseconds t(timeout_ms);
    client_->set_connection_timeout(t);
    client_->set_read_timeout(t);
    client_->set_write_timeout(t);

    std::string body = request.SerializeAsString();
    std::string response;  // at most kMaxErrorBody of it
    auto make_request = [&] {
      httplib::Request req;
      req.method = "POST";
      req.path = path_;
      req.headers = headers_;
      req.headers.emplace("Host", host_header_);
      req.headers.emplace("Content-Type", "application/proto");
      req.headers.emplace("Connect-Protocol-Version", "1");
      req.headers.emplace("Connect-Timeout-Ms", absl::StrCat(timeout_ms));
      req.body = body;
      req.content_receiver = [&response](const char* data, size_t len, uint64_t, uint64_t) {
        if (response.size() < kMaxErrorBody) {
          response.append(data, std::min(len, kMaxErrorBody - response.size()));
        }
        return true;
      };
      return req;
    };

    absl::Time deadline = absl::Now() + absl::Milliseconds(timeout_ms);
    {
      absl::MutexLock l(&mu_);
      in_flight_ = true;
      aborted_ = false;
      sockets_created_ = 0;
      deadline_ = deadline;
      cv_.Signal();
    }
    httplib::Response res;
    httplib::Error err = httplib::Error::Success;
    bool sent;
    {
      SigpipeGuard no_sigpipe;
      ERR_clear_error();
      bool reused = client_->is_socket_open();
      httplib::Request req = make_request();
      sent = client_->send(req, res, err);
      if (!sent && reused && res.status == -1 &&
          (err == httplib::Error::Read || err == httplib::Error::Write) && !Aborted()) {
        // The kept-alive connection was closed by the server as this request went out.
        Log(LogLevel::kDebug, "push: kept-alive connection to %s was closed, reconnecting",
            url_.Base().c_str());
        response.clear();
        res = httplib::Response();
        err = httplib::Error::Success;
        ERR_clear_error();
        req = make_request();
        sent = client_->send(req, res, err);
      }
    }
    // Asked before taking mu_: OnSocket() takes mu_ under cpp-httplib's socket mutex.
    int open_fd = client_->is_socket_open() ? client_->socket() : -1;
    bool aborted, cancelled, socket_created;
    {
      absl::MutexLock l(&mu_);
      in_flight_ = false;
      aborted = aborted_;
      cancelled = cancelled_;
      socket_created = sockets_created_ > 0;
      // The duplicate must not keep a socket alive that cpp-httplib has let go of.
      if (open_fd < 0 || open_fd != socket_fd_) DropSocketLocked();
    }
    std::string ssl_errors = TakeOpenSslErrors();

    PushResult r;
    if (!sent) {
      r.retryable = true;
      if (aborted && cancelled) {
        r.retryable = false;
        r.code = "cancelled";
        r.message = "cancelled at shutdown";
        return r;
      }
      std::string where = absl::StrCat(url_.host, " port ", url_.port);
      if (aborted || err == httplib::Error::ConnectionTimeout) {
        bool connecting = err == httplib::Error::Connection ||
                          err == httplib::Error::ConnectionTimeout ||
                          err == httplib::Error::SSLConnection;
        r.code = "timeout";
        r.message = absl::StrCat(connecting ? "could not connect to " : "no response from ",
                                 connecting ? where : url_.Base(), " within ",
                                 absl::FormatDuration(absl::Milliseconds(timeout_ms)));
        return r;
      }
      switch (err) {
        case httplib::Error::Connection:
          r.code = "connect";
          r.message = socket_created ? absl::StrCat("could not connect to ", where,
                                                    " (refused, reset or unreachable)")
                                     : absl::StrCat("could not resolve host \"", url_.host, "\"");
          break;
        case httplib::Error::SSLConnection:
          r.code = "tls";
          r.message = absl::StrCat("TLS handshake with ", where, " failed",
                                   ssl_errors.empty() ? "" : ": ", ssl_errors);
          break;
        case httplib::Error::SSLServerVerification: {
          r.code = "tls";
          auto* ssl = static_cast<httplib::SSLClient*>(client_.get());
          long v = ssl->get_openssl_verify_result();
          r.message =
              v != X509_V_OK
                  ? absl::StrCat("server certificate of ", where,
                                 " not trusted: ", X509_verify_cert_error_string(v), " (CA file ",
                                 ca_file_.empty() ? "none" : ca_file_, ")")
                  : absl::StrCat("server certificate does not match host \"", url_.host, "\"");
          break;
        }
        case httplib::Error::SSLLoadingCerts:
          r.code = "tls";
          r.message = absl::StrCat("cannot load CA certificates from ", ca_file_,
                                   ssl_errors.empty() ? "" : ": ", ssl_errors);
          break;
        case httplib::Error::Write:
        case httplib::Error::Read:
          // With TLS 1.3 a server refusing the client certificate says so only after the
          // handshake: the request then fails here.
          r.code = "network";
          r.message = absl::StrCat(
              "connection to ", where, " closed ",
              err == httplib::Error::Write ? "while sending the request"
                                           : "before a complete response",
              ssl_errors.empty() ? "" : ": ", ssl_errors,
              url_.tls() ? " (did the server refuse the TLS client certificate?)" : "");
          break;
        default:
          r.code = "network";
          r.message = absl::StrCat("request to ", url_.Base(), " failed: ", httplib::to_string(err),
                                   ssl_errors.empty() ? "" : ": ", ssl_errors);
      }
      return r;
    }
    if (res.status == 200) {
      r.ok = true;
      return r;
    }
    r.code = absl::StrCat(res.status);
    if (res.has_header("Retry-After")) {
      int64_t seconds = 0;
      if (absl::SimpleAtoi(absl::StripAsciiWhitespace(res.get_header_value("Retry-After")),
                           &seconds) &&
          seconds >= 0) {
        r.retry_after = absl::Seconds(seconds);
      }
    }
    // A Connect error body names the code; classify by it when present (Connect maps ABORTED to
    // 409, which the HTTP rule alone would not retry), else by the HTTP status.
    std::string connect_code = JsonStringField(response, "code");
    int grpc_code = connect_code.empty() ? -1 : GrpcCodeFromName(connect_code);
    r.retryable =
        grpc_code >= 0 ? IsRetryableGrpcCode(grpc_code) : IsRetryableHttpStatus(res.status);
    std::string message = JsonStringField(response, "message");
    r.message = absl::StrCat("HTTP ", res.status, connect_code.empty() ? "" : " ", connect_code,
                             ": ", Excerpt(message.empty() ? response : message));
    return r;
  }

  void Cancel() override {
    absl::MutexLock l(&mu_);
    cancelled_ = true;
    if (in_flight_) AbortLocked();
  }

 private:
  std::string TlsStamp() const {
    if (!url_.tls()) return "";
    return absl::StrCat(FileStamp(ca_file_), "|", FileStamp(cert_file_), "|", FileStamp(key_file_));
  }

  // A configured client for url_, TLS files loaded. Errors: InvalidArgument naming the file.
  absl::StatusOr<std::unique_ptr<httplib::ClientImpl>> NewClient() {
    std::unique_ptr<httplib::ClientImpl> client;
    if (url_.tls()) {
      ERR_clear_error();
      auto ssl = std::make_unique<httplib::SSLClient>(url_.host, url_.port);
      SSL_CTX* ctx = ssl->ssl_context();
      if (ctx == nullptr) return absl::InternalError("SSL_CTX_new failed");
      SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
      if (!ca_file_.empty()) {
        // Checked here so a bad file is named at once; cpp-httplib loads it into the context on
        // the first connection, and only it: no default roots beside a given CA file.
        X509_STORE* store = X509_STORE_new();
        bool loaded = X509_STORE_load_file(store, ca_file_.c_str()) == 1;
        X509_STORE_free(store);
        if (!loaded) {
          return absl::InvalidArgumentError(
              absl::StrCat(ca_is_system_ ? "system CA bundle " : "--tls-ca-file ", ca_file_,
                           ": no PEM certificates: ", TakeOpenSslErrors()));
        }
        ssl->set_ca_cert_path(ca_file_);
      }
      if (!cert_file_.empty()) {
        // The whole chain (intermediates after the leaf), as libcurl sent it.
        if (SSL_CTX_use_certificate_chain_file(ctx, cert_file_.c_str()) != 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--tls-cert-file ", cert_file_, ": not a PEM certificate: ", TakeOpenSslErrors()));
        }
        if (SSL_CTX_use_PrivateKey_file(ctx, key_file_.c_str(), SSL_FILETYPE_PEM) != 1) {
          return absl::InvalidArgumentError(absl::StrCat(
              "--tls-key-file ", key_file_, ": not a PEM private key for --tls-cert-file ",
              cert_file_, ": ", TakeOpenSslErrors()));
        }
        if (SSL_CTX_check_private_key(ctx) != 1) {
          return absl::InvalidArgumentError(absl::StrCat("--tls-key-file ", key_file_,
                                                         " does not match --tls-cert-file ",
                                                         cert_file_, ": ", TakeOpenSslErrors()));
        }
      }
      // Host name (or IP address) checked by OpenSSL during the handshake, as libcurl had it
      // checked; cpp-httplib's own subjectAltName/CN check runs as well.
      X509_VERIFY_PARAM* param = SSL_CTX_get0_param(ctx);
      in6_addr a6;
      in_addr a4;
      bool is_ip = inet_pton(AF_INET6, url_.host.c_str(), &a6) == 1 ||
                   inet_pton(AF_INET, url_.host.c_str(), &a4) == 1;
      if (is_ip) {
        X509_VERIFY_PARAM_set1_ip_asc(param, url_.host.c_str());
      } else {
        X509_VERIFY_PARAM_set_hostflags(param, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
        X509_VERIFY_PARAM_set1_host(param, url_.host.c_str(), 0);
      }
      ssl->enable_server_certificate_verification(true);
      client = std::move(ssl);
    } else {
      client = std::make_unique<httplib::ClientImpl>(url_.host, url_.port);
    }
    client->set_keep_alive(true);
    client->set_follow_location(false);
    client->set_url_encode(false);  // the path goes out as given, like libcurl sent it
    client->set_decompress(false);  // no Accept-Encoding; the answer is tiny
    client->set_tcp_nodelay(true);
    client->set_socket_options([this](int fd) { OnSocket(fd); });
    return client;
  }

  // cpp-httplib created socket `fd` (before connecting it): keep a duplicate to shut it down from
  // another thread.
  void OnSocket(int fd) {
    absl::MutexLock l(&mu_);
    DropSocketLocked();
    socket_dup_ = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    socket_fd_ = fd;
    ++sockets_created_;
    if (aborted_) shutdown(fd, SHUT_RDWR);
  }

  void DropSocketLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (socket_dup_ >= 0) close(socket_dup_);
    socket_dup_ = -1;
    socket_fd_ = -1;
  }

  // Fails the request in flight now: shutting the socket down wakes any wait on it.
  void AbortLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    aborted_ = true;
    if (socket_dup_ >= 0) shutdown(socket_dup_, SHUT_RDWR);
  }

  bool Aborted() {
    absl::MutexLock l(&mu_);
    return aborted_;
  }

  // The watchdog thread: aborts a request still in flight at its deadline.
  void Watch() {
    absl::MutexLock l(&mu_);
    while (!exiting_) {
      if (in_flight_ && !aborted_) {
        if (absl::Now() >= deadline_) {
          AbortLocked();
        } else {
          cv_.WaitWithDeadline(&mu_, deadline_);
        }
      } else {
        cv_.Wait(&mu_);
      }
    }
  }

  const RemoteUrl url_;
  const std::string path_;
  std::string ca_file_;
  bool ca_is_system_ = false;
  const std::string cert_file_, key_file_;
  std::string host_header_;
  httplib::Headers headers_;
  // Used by the Push thread only.
  std::unique_ptr<httplib::ClientImpl> client_;
  std::string stamp_;

  absl::Mutex mu_;
  absl::CondVar cv_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  bool in_flight_ ABSL_GUARDED_BY(mu_) = false;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool exiting_ ABSL_GUARDED_BY(mu_) = false;
  int sockets_created_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time deadline_ ABSL_GUARDED_BY(mu_);
  // The socket cpp-httplib created last (its descriptor number) and our duplicate of it.
  int socket_fd_ ABSL_GUARDED_BY(mu_) = -1;
  int socket_dup_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread watchdog_;
};

absl::StatusOr<std::unique_ptr<PushTransport>> MakeConnect(
    const PyroscopeOptions& o, const RemoteUrl& url,
    std::vector<std::pair<std::string, std::string>> headers) {
  // Fail now on unreadable files, with the same errors as the gRPC path; a file changed later is
  // loaded again before the next request (so rotated certificates are picked up).
  for (const std::string* f : {&o.tls_ca_file, &o.tls_cert_file, &o.tls_key_file}) {
    if (!f->empty()) PS_RETURN_IF_ERROR(proc::ReadFileToString(*f).status());
  }
  auto t = std::make_unique<ConnectTransport>(o, url, std::move(headers));
  PS_RETURN_IF_ERROR(t->Init());
  return t;
}

}  // namespace

absl::StatusOr<std::unique_ptr<PushTransport>> MakePushTransport(const PyroscopeOptions& o,
                                                                 const RemoteUrl& url) {
  if (o.protocol != "grpc" && o.protocol != "connect") {
    return absl::InvalidArgumentError(
        absl::StrCat("--remote-protocol \"", o.protocol, "\": must be grpc or connect"));
  }
  bool any_tls_file = !o.tls_ca_file.empty() || !o.tls_cert_file.empty() || !o.tls_key_file.empty();
  if (any_tls_file && !url.tls()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--tls-ca-file/--tls-cert-file/--tls-key-file need an https:// --remote-url, got \"", o.url,
        "\""));
  }
  if (o.tls_cert_file.empty() != o.tls_key_file.empty()) {
    return absl::InvalidArgumentError("--tls-cert-file and --tls-key-file go together");
  }
  PS_ASSIGN_OR_RETURN(auto headers, PushHeaders(o));
  if (o.protocol == "grpc") return MakeGrpc(o, url, std::move(headers));
  return MakeConnect(o, url, std::move(headers));
}

}  // namespace parascope
