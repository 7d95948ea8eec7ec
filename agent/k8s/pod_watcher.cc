#include "agent/k8s/pod_watcher.h"

#include <httplib.h>

#include <random>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "agent/proc/read_file.h"
#include "agent/util/log.h"
#include "agent/util/thread_name.h"

namespace parascope::k8s {
namespace {

// Percent-encodes everything but RFC 3986 unreserved characters (query values).
std::string QueryEscape(absl::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~') {
      out += static_cast<char>(c);
    } else {
      absl::StrAppend(&out, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return out;
}

int64_t Seconds(absl::Duration d) { return std::max<int64_t>(1, absl::ToInt64Seconds(d)); }

// What a failed request body says, shortened for a log line.
std::string Excerpt(const std::string& body) {
  std::string s(absl::StripAsciiWhitespace(body.substr(0, 300)));
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

PodWatcher::PodWatcher(PodWatcherOptions options, PodStore* store)
    : options_(std::move(options)), store_(store), backoff_(options_.backoff_initial) {}

PodWatcher::~PodWatcher() { Stop(); }

absl::Status PodWatcher::Start() {
  absl::string_view url = options_.api_url;
  absl::string_view rest = url;
  if (absl::ConsumePrefix(&rest, "https://")) {
    https_ = true;
  } else if (!absl::ConsumePrefix(&rest, "http://")) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", url, "\" is not an http:// or https:// URL"));
  }
  size_t slash = rest.find('/');
  absl::string_view authority = rest.substr(0, slash);
  if (slash != absl::string_view::npos) {
    path_prefix_ = std::string(absl::StripSuffix(rest.substr(slash), "/"));
  }
  absl::string_view host = authority, port;
  if (absl::ConsumePrefix(&host, "[")) {  // [IPv6]:port
    size_t close = host.find(']');
    if (close == absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": no ']' after the IPv6 host"));
    }
    absl::string_view after = host.substr(close + 1);
    host = host.substr(0, close);
    if (!after.empty() && !absl::ConsumePrefix(&after, ":")) {
      return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": bad port"));
    }
    port = after;
  } else if (size_t colon = host.rfind(':'); colon != absl::string_view::npos) {
    port = host.substr(colon + 1);
    host = host.substr(0, colon);
  }
  if (host.empty()) return absl::InvalidArgumentError(absl::StrCat("\"", url, "\" has no host"));
  host_ = std::string(host);
  port_ = https_ ? 443 : 80;
  if (!port.empty() && (!absl::SimpleAtoi(port, &port_) || port_ <= 0 || port_ > 65535)) {
    return absl::InvalidArgumentError(absl::StrCat("\"", url, "\": bad port"));
  }
  thread_ = std::thread([this] {
    NameThisThread("ps-k8s-watch");
    Run();
    absl::MutexLock lock(&mu_);
    finished_ = true;
    current_.reset();
  });
  return absl::OkStatus();
}

void PodWatcher::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (!thread_.joinable()) return;
  // httplib's stop() only interrupts a request whose socket is open: one called between
  // NewClient() and the connect would be lost and a quiet watch would run to its timeout. So it
  // is repeated until the thread has left Run().
  for (;;) {
    std::shared_ptr<httplib::ClientImpl> current;
    {
      absl::MutexLock lock(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&finished_), absl::Milliseconds(20))) break;
      current = current_;
    }
    if (current != nullptr) current->stop();
  }
  thread_.join();
}

PodWatcherStats PodWatcher::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

std::shared_ptr<httplib::ClientImpl> PodWatcher::NewClient(absl::Duration read_timeout) {
  std::shared_ptr<httplib::ClientImpl> client;
  if (https_) {
    client = std::make_shared<httplib::SSLClient>(host_, port_);
    if (!options_.ca_file.empty()) client->set_ca_cert_path(options_.ca_file);
    client->enable_server_certificate_verification(true);
  } else {
    client = std::make_shared<httplib::ClientImpl>(host_, port_);
  }
  client->set_url_encode(false);  // QueryEscape did it
  client->set_keep_alive(false);
  client->set_connection_timeout(Seconds(options_.request_timeout), 0);
  client->set_read_timeout(Seconds(read_timeout), 0);
  client->set_write_timeout(Seconds(options_.request_timeout), 0);
  absl::MutexLock lock(&mu_);
  if (stopping_) return nullptr;
  current_ = client;
  return client;
}

bool PodWatcher::Token(std::string* bearer) {
  bearer->clear();
  if (options_.token_file.empty()) return true;
  absl::StatusOr<std::string> token = proc::ReadFileToString(options_.token_file);
  if (!token.ok()) {
    MarkUp(false, absl::StrCat("service account token: ", token.status().message()));
    absl::MutexLock lock(&mu_);
    ++stats_.errors_token;
    return false;
  }
  *bearer = absl::StrCat("Bearer ", absl::StripAsciiWhitespace(*token));
  return true;
}

void PodWatcher::MarkUp(bool up, const std::string& why) {
  {
    absl::MutexLock lock(&mu_);
    stats_.up = up;
    const Logged now = up ? Logged::kUp : Logged::kDown;
    if (logged_ == now) return;
    logged_ = now;
  }
  if (up) {
    Log(LogLevel::kInfo, "kubernetes: API server %s up: %s", options_.api_url, why);
  } else {
    Log(LogLevel::kWarning,
        "kubernetes: API server %s down: %s (pods known so far keep their labels; retrying)",
        options_.api_url, why);
  }
}

void PodWatcher::Backoff() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  // Full jitter in [backoff/2, backoff].
  std::uniform_real_distribution<double> jitter(0.5, 1.0);
  absl::Duration wait = backoff_ * jitter(rng);
  backoff_ = std::min(backoff_ * 2, options_.backoff_max);
  absl::MutexLock lock(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&stopping_), wait);
}

PodWatcher::Outcome PodWatcher::List(std::string* resource_version) {
  std::vector<PodInfo> pods;
  std::string continue_token;
  const std::string selector = QueryEscape(absl::StrCat("spec.nodeName=", options_.node_name));
  do {
    std::string bearer;
    if (!Token(&bearer)) return Outcome::kFailed;
    std::shared_ptr<httplib::ClientImpl> client = NewClient(options_.request_timeout);
    if (client == nullptr) return Outcome::kStopped;
    std::string path = absl::StrCat(path_prefix_, "/api/v1/pods?fieldSelector=", selector,
                                    "&limit=500");
    if (!continue_token.empty()) absl::StrAppend(&path, "&continue=", QueryEscape(continue_token));
    httplib::Headers headers = {{"Accept", "application/json"}};
    if (!bearer.empty()) headers.emplace("Authorization", bearer);
    httplib::Result res = client->Get(path, headers);
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return Outcome::kStopped;
      if (!res) {
        ++stats_.errors_connect;
      } else if (res->status != 200) {
        ++stats_.errors_status;
      }
    }
    if (!res) {
      MarkUp(false, absl::StrCat("list: ", httplib::to_string(res.error()), " error"));
      return Outcome::kFailed;
    }
    if (res->status != 200) {
      MarkUp(false, absl::StrCat("list: HTTP ", res->status, " ", Excerpt(res->body)));
      return Outcome::kFailed;
    }
    absl::StatusOr<PodList> page = ParsePodList(res->body);
    if (!page.ok()) {
      {
        absl::MutexLock lock(&mu_);
        ++stats_.errors_decode;
      }
      MarkUp(false, absl::StrCat("list: ", page.status().message()));
      return Outcome::kFailed;
    }
    if (page->bad_items > 0) {
      absl::MutexLock lock(&mu_);
      stats_.errors_decode += page->bad_items;
    }
    for (PodInfo& p : page->pods) pods.push_back(std::move(p));
    continue_token = page->continue_token;
    *resource_version = page->resource_version;
  } while (!continue_token.empty());
  const size_t n = pods.size();
  store_->Replace(std::move(pods));
  {
    absl::MutexLock lock(&mu_);
    ++stats_.lists;
    stats_.synced = true;
  }
  MarkUp(true, absl::StrCat(n, " pods on node ", options_.node_name));
  Log(LogLevel::kDebug, "kubernetes: listed %d pods of node %s at resourceVersion %s",
      static_cast<int>(n), options_.node_name, *resource_version);
  return Outcome::kOk;
}

PodWatcher::Outcome PodWatcher::Watch(std::string* resource_version) {
  std::string bearer;
  if (!Token(&bearer)) return Outcome::kFailed;
  // The server ends the request after timeoutSeconds; a silent connection longer than that and
  // a margin is a dead one.
  std::shared_ptr<httplib::ClientImpl> client =
      NewClient(options_.watch_timeout + absl::Seconds(30));
  if (client == nullptr) return Outcome::kStopped;
  std::string path = absl::StrCat(
      path_prefix_, "/api/v1/pods?fieldSelector=",
      QueryEscape(absl::StrCat("spec.nodeName=", options_.node_name)), "&watch=1&resourceVersion=",
      QueryEscape(*resource_version), "&allowWatchBookmarks=true&timeoutSeconds=",
      Seconds(options_.watch_timeout));
  httplib::Headers headers = {{"Accept", "application/json"}};
  if (!bearer.empty()) headers.emplace("Authorization", bearer);
  int status = 0;
  std::string buffer, error_body;
  Outcome outcome = Outcome::kOk;
  std::string failure;
  auto on_line = [&](absl::string_view line) -> bool {
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) return true;
    absl::StatusOr<WatchEvent> e = ParseWatchEvent(line);
    if (!e.ok()) {
      absl::MutexLock lock(&mu_);
      ++stats_.errors_decode;
      return true;  // one bad event: skip it (the next relist repairs the store)
    }
    switch (e->type) {
      case WatchEvent::Type::kAdded:
      case WatchEvent::Type::kModified: {
        {
          absl::MutexLock lock(&mu_);
          ++(e->type == WatchEvent::Type::kAdded ? stats_.events_added : stats_.events_modified);
        }
        // A field selector watch reports a pod leaving the selection as DELETED, so every pod
        // here is this node's.
        store_->Upsert(e->pod);
        break;
      }
      case WatchEvent::Type::kDeleted: {
        {
          absl::MutexLock lock(&mu_);
          ++stats_.events_deleted;
        }
        store_->Delete(e->pod.uid);
        break;
      }
      case WatchEvent::Type::kBookmark: {
        absl::MutexLock lock(&mu_);
        ++stats_.events_bookmark;
        break;
      }
      case WatchEvent::Type::kError:
        if (e->error_code == 410) {
          outcome = Outcome::kExpired;
        } else {
          outcome = Outcome::kFailed;
          failure = absl::StrCat("watch: error event ", e->error_code, " ", e->error_message);
        }
        return false;
    }
    if (!e->resource_version.empty()) *resource_version = e->resource_version;
    return true;
  };
  bool first_byte = true;
  httplib::Result res = client->Get(
      path, headers,
      [&](const httplib::Response& r) {
        status = r.status;
        return true;
      },
      [&](const char* data, size_t n) {
        {
          absl::MutexLock lock(&mu_);
          if (stopping_) return false;
        }
        if (status != 200) {
          if (error_body.size() < 4096) error_body.append(data, std::min<size_t>(n, 4096));
          return true;
        }
        if (first_byte) {
          first_byte = false;
          MarkUp(true, "watching");
        }
        buffer.append(data, n);
        size_t start = 0;
        for (size_t nl; (nl = buffer.find('\n', start)) != std::string::npos; start = nl + 1) {
          if (!on_line(absl::string_view(buffer).substr(start, nl - start))) return false;
        }
        buffer.erase(0, start);
        // A line longer than any pod should be: the stream is not what it claims to be.
        if (buffer.size() > (size_t{16} << 20)) {
          outcome = Outcome::kFailed;
          failure = "watch: an event over 16 MiB";
          return false;
        }
        return true;
      });
  {
    absl::MutexLock lock(&mu_);
    if (stopping_) return Outcome::kStopped;
  }
  // A last event without its newline (the server closed the stream right after it).
  if (res && status == 200 && outcome == Outcome::kOk && !buffer.empty()) on_line(buffer);
  if (outcome == Outcome::kExpired) {
    absl::MutexLock lock(&mu_);
    ++stats_.errors_expired;
    return outcome;
  }
  if (outcome == Outcome::kFailed) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.errors_decode;
    }
    MarkUp(false, failure);
    return outcome;
  }
  if (status != 0 && status != 200) {
    {
      absl::MutexLock lock(&mu_);
      ++(status == 410 ? stats_.errors_expired : stats_.errors_status);
    }
    if (status == 410) return Outcome::kExpired;
    MarkUp(false, absl::StrCat("watch: HTTP ", status, " ", Excerpt(error_body)));
    return Outcome::kFailed;
  }
  if (!res) {
    {
      absl::MutexLock lock(&mu_);
      ++stats_.errors_connect;
    }
    MarkUp(false, absl::StrCat("watch: ", httplib::to_string(res.error()), " error"));
    return Outcome::kFailed;
  }
  return Outcome::kOk;  // the server ended the watch (timeoutSeconds): watch again
}

void PodWatcher::Run() {
  for (;;) {
    std::string rv;
    Outcome listed = List(&rv);
    if (listed == Outcome::kStopped) return;
    if (listed != Outcome::kOk) {
      Backoff();
      continue;
    }
    const absl::Time listed_at = absl::Now();
    const absl::Time relist_at = listed_at + options_.resync;
    Outcome watched = Outcome::kOk;
    while (watched == Outcome::kOk && absl::Now() < relist_at) {
      const absl::Time started = absl::Now();
      watched = Watch(&rv);
      // A server that ends every watch at once would make this loop spin.
      if (watched == Outcome::kOk && absl::Now() - started < absl::Seconds(1)) Backoff();
    }
    if (watched == Outcome::kStopped) return;
    // kExpired, kFailed or the resync deadline: list again, at once only after a healthy minute.
    const bool healthy = absl::Now() - listed_at >= absl::Minutes(1);
    if (healthy) backoff_ = options_.backoff_initial;
    if (watched == Outcome::kFailed || !healthy) Backoff();
  }
}

}  // namespace parascope::k8s
