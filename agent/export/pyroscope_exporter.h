// Pushes profiles to a Pyroscope-compatible server (SPEC sections 4 and 6; issue 4): one series
// with one sample per request, gzip pprof, a UUID v4 per sample, over gRPC or Connect.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/random/random.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "agent/export/exporter.h"
#include "agent/export/push_protocol.h"
#include "agent/export/push_transport.h"
#include "agent/export/pyroscope_options.h"
#include "agent/util/log.h"

namespace parascope {

// Series labels of a profile (SPEC section 4) without `__name__`, which the exporter adds.
using SeriesLabelsFn =
    std::function<std::vector<std::pair<std::string, std::string>>(const ProcessProfile&)>;

// Export() turns a profile into a push request (trimmed to the server's limits, gzip pprof,
// labels, a fresh UUID) and appends it to a queue bounded in bytes; one background sender thread
// delivers the queue in order, retrying with exponential backoff and full jitter (SPEC section
// 6). Export never waits on the network. Owns its transport and thread. Thread-safe.
//
// Queue invariant: queue_bytes (the serialized size of the queued requests, including the one
// being sent) <= queue_max_bytes after every Export. To make room, the oldest requests are dropped
// and counted (reason "queue_full"); the one on the wire at that moment leaves the queue at once
// and is counted as sent or dropped by its outcome, never both. A request larger than the whole
// queue is dropped at once.
//
// Logging: one line per endpoint state change (first success, down, back up), and at most one
// line a minute about rejected requests; never one per request. No header value (tenant, auth,
// custom headers) is ever logged.
class PyroscopeExporter : public Exporter {
 public:
  // Drop reasons (keys of Stats::dropped): "queue_full", "rejected" (a non-retryable response,
  // e.g. HTTP 400/401/403 or INVALID_ARGUMENT), "expired" (older than max_profile_age when its
  // turn came), "shutdown" (still queued when Shutdown's time ran out).
  struct Stats {
    uint64_t enqueued = 0;                     // requests accepted by Export
    uint64_t sent = 0;                         // requests the server acknowledged
    uint64_t bytes_sent = 0;                   // serialized request bytes of those
    uint64_t retries = 0;                      // failed attempts that were retried
    std::map<std::string, uint64_t> dropped;   // reason -> requests
    std::map<std::string, uint64_t> failures;  // failure code (PushResult::code) -> attempts
    uint64_t profiles_trimmed = 0;             // profiles folded to fit the server's limits
    uint64_t samples_folded = 0;               // samples folded into [other] in those
    size_t queue_bytes = 0;                    // current queue size (serialized requests)
    size_t queue_length = 0;                   // current queued requests
    std::string last_error;   // detail of the latest failed attempt ("" if none yet)
    bool endpoint_up = true;  // false after a retryable failure, until the next response
    bool ready = true;        // Ready() at the time of the snapshot
  };

  // Validates `options` and builds the transport (see MakePushTransport). `labels` gives each
  // profile's series labels (may be empty: then only __name__). Errors: InvalidArgument for a
  // bad URL, protocol, header or auth combination, or non-positive durations/queue size;
  // NotFound / PermissionDenied for unreadable TLS files. Starts the sender thread.
  static absl::StatusOr<std::unique_ptr<PyroscopeExporter>> Create(PyroscopeOptions options,
                                                                   SeriesLabelsFn labels);
  // As Create, with a given transport (tests: a fake) and clock (`now` drives readiness and
  // profile expiry; waits use real time).
  static absl::StatusOr<std::unique_ptr<PyroscopeExporter>> CreateWithTransport(
      PyroscopeOptions options, SeriesLabelsFn labels, std::unique_ptr<PushTransport> transport,
      std::function<absl::Time()> now = absl::Now);

  ~PyroscopeExporter() override;  // Shutdown()

  // Labels = labels(profile) plus __name__ = profile.type (a `__name__` from labels() is
  // replaced). Removes sample labels not in options.sample_label_keys (KeepSampleLabels), trims
  // the profile to kServerMaxSamples / kServerMaxProfileBytes if needed (TrimForServerLimits),
  // serializes it (gzip) and enqueues one request. Errors: FailedPrecondition after Shutdown;
  // Internal if gzip fails. Dropping for space is not an error (it is counted).
  absl::Status Export(const ProcessProfile& profile) override;

  // Keeps delivering the queue for at most options.shutdown_timeout (no attempt outlives it;
  // a pending backoff is cut short for one immediate attempt), then stops the sender thread;
  // whatever is still queued is dropped (reason "shutdown").
  // Idempotent; Export fails afterwards.
  void Shutdown();

  Stats GetStats() const;
  // False while the endpoint has been unreachable (retryable failures, no response since) for
  // longer than two windows; true otherwise, including before the first request.
  bool Ready() const;

 private:
  struct Item {
    push::v1::PushRequest request;
    size_t bytes = 0;
    int64_t time_nanos = 0;  // the profile's window start, for expiry
    bool in_flight = false;  // the sender is sending it now
    bool evicted = false;    // dropped from the queue while in flight
  };

  PyroscopeExporter(PyroscopeOptions options, RemoteUrl url, SeriesLabelsFn labels,
                    std::unique_ptr<PushTransport> transport, std::function<absl::Time()> now);
  void SenderLoop();
  // Removes `item` from the front of the queue if it is still there.
  void PopLocked(const std::shared_ptr<Item>& item) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Marks the endpoint reachable (a response arrived) and logs a state change.
  void MarkUpLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void MarkDownLocked(const PushResult& r) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReadyLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const PyroscopeOptions options_;
  const RemoteUrl url_;  // for log lines (never holds credentials)
  const SeriesLabelsFn labels_;
  const std::unique_ptr<PushTransport> transport_;  // used by the sender thread only
  const std::function<absl::Time()> now_;
  RateLimitedLog rejected_log_;

  mutable absl::Mutex mu_;
  absl::CondVar cv_;  // queue changed or shutdown requested
  std::deque<std::shared_ptr<Item>> queue_ ABSL_GUARDED_BY(mu_);
  Stats stats_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time shutdown_deadline_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  bool sender_done_ ABSL_GUARDED_BY(mu_) = false;
  bool ever_up_ ABSL_GUARDED_BY(mu_) = false;
  absl::Time down_since_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  uint64_t retries_at_down_ ABSL_GUARDED_BY(mu_) = 0;
  absl::BitGen jitter_ ABSL_GUARDED_BY(mu_);
  std::thread sender_;
  absl::Mutex shutdown_mu_;  // serializes Shutdown callers
};

}  // namespace parascope
