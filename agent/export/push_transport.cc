#include "agent/export/push_transport.h"

#include <curl/curl.h>
#include <grpc/support/log.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "agent/proc/read_file.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "proto/push.grpc.pb.h"

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

// ---- Connect over HTTP/1.1 (libcurl) ----

size_t AppendBody(char* data, size_t size, size_t n, void* user) {
  auto* body = static_cast<std::string*>(user);
  size_t len = size * n;
  if (body->size() < kMaxErrorBody) body->append(data, std::min(len, kMaxErrorBody - body->size()));
  return len;
}

size_t ReadRetryAfter(char* data, size_t size, size_t n, void* user) {
  absl::string_view line(data, size * n);
  if (absl::StartsWithIgnoreCase(line, "retry-after:")) {
    line.remove_prefix(12);
    int64_t seconds = 0;
    if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &seconds) && seconds >= 0) {
      *static_cast<absl::Duration*>(user) = absl::Seconds(seconds);
    }
  }
  return size * n;
}

int AbortIfCancelled(void* user, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
  return static_cast<std::atomic<bool>*>(user)->load() ? 1 : 0;
}

class ConnectTransport : public PushTransport {
 public:
  ConnectTransport(CURL* curl, std::string url,
                   std::vector<std::pair<std::string, std::string>> headers)
      : curl_(curl), url_(std::move(url)) {
    base_headers_.push_back("Content-Type: application/proto");
    base_headers_.push_back("Connect-Protocol-Version: 1");
    base_headers_.push_back("Expect:");  // no 100-continue round trip
    for (const auto& [k, v] : headers) base_headers_.push_back(absl::StrCat(k, ": ", v));
  }
  ~ConnectTransport() override { curl_easy_cleanup(curl_); }

  PushResult Push(const push::v1::PushRequest& request, absl::Duration timeout) override {
    if (cancelled_.load()) return PushResult{false, false, "cancelled", "cancelled at shutdown"};
    std::string body = request.SerializeAsString();
    int64_t timeout_ms = std::max<int64_t>(1, absl::ToInt64Milliseconds(timeout));
    curl_slist* list = nullptr;
    for (const auto& h : base_headers_) list = curl_slist_append(list, h.c_str());
    std::string deadline = absl::StrCat("Connect-Timeout-Ms: ", timeout_ms);
    list = curl_slist_append(list, deadline.c_str());

    std::string response;
    absl::Duration retry_after = absl::ZeroDuration();
    char errbuf[CURL_ERROR_SIZE] = {0};
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, list);
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(curl_, CURLOPT_TIMEOUT_MS, static_cast<long>(timeout_ms));
    curl_easy_setopt(curl_, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(timeout_ms));
    curl_easy_setopt(curl_, CURLOPT_WRITEFUNCTION, AppendBody);
    curl_easy_setopt(curl_, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(curl_, CURLOPT_HEADERFUNCTION, ReadRetryAfter);
    curl_easy_setopt(curl_, CURLOPT_HEADERDATA, &retry_after);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, errbuf);
    curl_easy_setopt(curl_, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl_, CURLOPT_XFERINFOFUNCTION, AbortIfCancelled);
    curl_easy_setopt(curl_, CURLOPT_XFERINFODATA, &cancelled_);
    CURLcode rc = curl_easy_perform(curl_);
    long status = 0;
    curl_easy_getinfo(curl_, CURLINFO_RESPONSE_CODE, &status);
    // Nothing may point at this call's locals after it returns.
    curl_easy_setopt(curl_, CURLOPT_HTTPHEADER, nullptr);
    curl_easy_setopt(curl_, CURLOPT_ERRORBUFFER, nullptr);
    curl_easy_setopt(curl_, CURLOPT_POSTFIELDS, nullptr);
    curl_slist_free_all(list);

    PushResult r;
    if (rc == CURLE_ABORTED_BY_CALLBACK) {
      r.code = "cancelled";
      r.message = "cancelled at shutdown";
      return r;
    }
    if (rc != CURLE_OK) {
      r.retryable = true;
      switch (rc) {
        case CURLE_COULDNT_CONNECT:
        case CURLE_COULDNT_RESOLVE_HOST:
        case CURLE_COULDNT_RESOLVE_PROXY:
          r.code = "connect";
          break;
        case CURLE_OPERATION_TIMEDOUT:
          r.code = "timeout";
          break;
        case CURLE_SSL_CONNECT_ERROR:
        case CURLE_PEER_FAILED_VERIFICATION:
        case CURLE_SSL_CERTPROBLEM:
        case CURLE_SSL_CIPHER:
        case CURLE_SSL_CACERT_BADFILE:
        case CURLE_SSL_ISSUER_ERROR:
        case CURLE_SSL_CRL_BADFILE:
          r.code = "tls";
          break;
        default:
          r.code = "network";
      }
      r.message = absl::StrCat(curl_easy_strerror(rc), errbuf[0] ? ": " : "", errbuf);
      return r;
    }
    if (status == 200) {
      r.ok = true;
      return r;
    }
    r.code = absl::StrCat(status);
    r.retry_after = retry_after;
    // A Connect error body names the code; classify by it when present (Connect maps ABORTED to
    // 409, which the HTTP rule alone would not retry), else by the HTTP status.
    std::string connect_code = JsonStringField(response, "code");
    int grpc_code = connect_code.empty() ? -1 : GrpcCodeFromName(connect_code);
    r.retryable = grpc_code >= 0 ? IsRetryableGrpcCode(grpc_code)
                                 : IsRetryableHttpStatus(static_cast<int>(status));
    std::string message = JsonStringField(response, "message");
    r.message = absl::StrCat("HTTP ", status, connect_code.empty() ? "" : " ", connect_code, ": ",
                             Excerpt(message.empty() ? response : message));
    return r;
  }

  void Cancel() override { cancelled_.store(true); }

 private:
  CURL* curl_;
  std::string url_;
  std::vector<std::string> base_headers_;
  std::atomic<bool> cancelled_{false};
};

absl::StatusOr<std::unique_ptr<PushTransport>> MakeConnect(
    const PyroscopeOptions& o, const RemoteUrl& url,
    std::vector<std::pair<std::string, std::string>> headers) {
  static std::once_flag init;
  std::call_once(init, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
  // Fail now on unreadable files, with the same errors as the gRPC path; libcurl reads them
  // again on each new connection (so rotated certificates are picked up).
  for (const std::string* f : {&o.tls_ca_file, &o.tls_cert_file, &o.tls_key_file}) {
    if (!f->empty()) PS_RETURN_IF_ERROR(proc::ReadFileToString(*f).status());
  }
  CURL* curl = curl_easy_init();
  if (curl == nullptr) return absl::InternalError("curl_easy_init failed");
  std::string endpoint = absl::StrCat(url.Base(), kPushMethodPath);
  curl_easy_setopt(curl, CURLOPT_URL, endpoint.c_str());
  curl_easy_setopt(curl, CURLOPT_POST, 1L);
  curl_easy_setopt(curl, CURLOPT_HTTP_VERSION, static_cast<long>(CURL_HTTP_VERSION_1_1));
  curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);  // threads: no SIGALRM for DNS timeouts
  curl_easy_setopt(curl, CURLOPT_USERAGENT, kUserAgent);
  curl_easy_setopt(curl, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(curl, CURLOPT_PROTOCOLS_STR, url.tls() ? "https" : "http");
  if (url.tls()) {
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, 1L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, 2L);
    if (!o.tls_ca_file.empty()) curl_easy_setopt(curl, CURLOPT_CAINFO, o.tls_ca_file.c_str());
    if (!o.tls_cert_file.empty()) {
      curl_easy_setopt(curl, CURLOPT_SSLCERT, o.tls_cert_file.c_str());
      curl_easy_setopt(curl, CURLOPT_SSLKEY, o.tls_key_file.c_str());
    }
  }
  return std::make_unique<ConnectTransport>(curl, std::move(endpoint), std::move(headers));
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
