// Keeps a PodStore equal to the API server's pods of one node: list, then watch from the list's
// resourceVersion, relist on 410 Gone, on any error (after a backoff) and every `resync`.
//
// Requests (Kubernetes API reference, "List" and "Watch" of core/v1 Pod; API concepts, "Efficient
// detection of changes"):
//   GET /api/v1/pods?fieldSelector=spec.nodeName%3D<node>&limit=500[&continue=<token>]
//   GET /api/v1/pods?fieldSelector=...&watch=1&resourceVersion=<rv>&allowWatchBookmarks=true
//       &timeoutSeconds=<watch_timeout>
// with `Authorization: Bearer <service account token>`. The token file is read again before each
// request: the kubelet rotates projected service account tokens (about hourly).
//
// An unreachable or failing API server never blocks profiling: the store keeps what it had,
// stats().up is false, errors are counted by reason, and retries back off exponentially (with
// jitter) from backoff_initial to backoff_max. The backoff is reset only once a list has been
// followed by a minute of healthy watching, so a server that lists but refuses or cuts watches
// (RBAC without watch, a proxy, 410 at once) is not listed again every second by every node.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/k8s/pods.h"

namespace httplib {
class ClientImpl;
}

namespace parascope::k8s {

struct PodWatcherOptions {
  // Base URL of the API server: "https://10.96.0.1:443" in a pod (KUBERNETES_SERVICE_HOST/PORT),
  // "http://127.0.0.1:<port>" for a test server. A path after the authority is a prefix.
  std::string api_url;
  std::string node_name;   // only pods with spec.nodeName == node_name
  std::string token_file;  // bearer token file ("" = none)
  std::string ca_file;     // CA bundle for https ("" = OpenSSL's default paths)
  absl::Duration resync = absl::Minutes(10);         // full relist at least this often
  absl::Duration watch_timeout = absl::Minutes(5);   // timeoutSeconds of one watch request
  absl::Duration request_timeout = absl::Seconds(5);  // connect, and read of a list page
  absl::Duration backoff_initial = absl::Seconds(1);
  absl::Duration backoff_max = absl::Seconds(30);
};

// Counts since start (errors and events are monotonic).
struct PodWatcherStats {
  bool up = false;      // the last list or watch request succeeded
  bool synced = false;  // at least one full list was stored
  uint64_t lists = 0;   // complete lists stored
  // Errors by reason: connect (no connection, TLS, timeout), status (HTTP status other than
  // 200), decode (a body or event that is not what the API reference describes), expired (410
  // Gone: relisted), token (the token file is unreadable).
  uint64_t errors_connect = 0, errors_status = 0, errors_decode = 0, errors_expired = 0,
           errors_token = 0;
  uint64_t events_added = 0, events_modified = 0, events_deleted = 0, events_bookmark = 0;
};

class PodWatcher {
 public:
  // `store` must outlive the watcher.
  PodWatcher(PodWatcherOptions options, PodStore* store);
  ~PodWatcher();  // Stop()
  PodWatcher(const PodWatcher&) = delete;
  PodWatcher& operator=(const PodWatcher&) = delete;

  // Starts the watcher thread. InvalidArgument for an api_url that is not http(s)://host[:port].
  absl::Status Start();
  // Stops the thread, interrupting a request in flight. Idempotent.
  void Stop();

  PodWatcherStats stats() const;
  const PodWatcherOptions& options() const { return options_; }

 private:
  enum class Outcome { kOk, kExpired, kStopped, kFailed };
  void Run();
  // One complete list (all pages) into the store; *resource_version receives where to watch from.
  Outcome List(std::string* resource_version);
  // One watch request from *resource_version (updated as events arrive) until the server ends
  // it, an error, or the resync deadline.
  Outcome Watch(std::string* resource_version);
  // A client for one request, registered so Stop() can interrupt it; nullptr after Stop().
  std::shared_ptr<httplib::ClientImpl> NewClient(absl::Duration read_timeout);
  // The Authorization header's value, or false (counted) when the token file is unreadable.
  bool Token(std::string* bearer);
  void MarkUp(bool up, const std::string& why);
  // Sleeps for the current backoff (or until Stop()), then doubles it.
  void Backoff();

  const PodWatcherOptions options_;
  PodStore* const store_;
  // From api_url: host (IPv6 without brackets: httplib 0.11's URL parser takes only [digits and
  // colons]), port, scheme, path prefix.
  std::string host_, path_prefix_;
  int port_ = 0;
  bool https_ = false;
  std::thread thread_;
  absl::Duration backoff_;

  mutable absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;  // Run() returned
  std::shared_ptr<httplib::ClientImpl> current_ ABSL_GUARDED_BY(mu_);
  PodWatcherStats stats_ ABSL_GUARDED_BY(mu_);
  // What was last logged: the first failure is logged too, not only changes after an "up".
  enum class Logged { kNothing, kUp, kDown };
  Logged logged_ ABSL_GUARDED_BY(mu_) = Logged::kNothing;
};

}  // namespace parascope::k8s
