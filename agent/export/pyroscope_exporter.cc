#include "agent/export/pyroscope_exporter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "agent/export/server_limits.h"
#include "agent/profile/pprof_builder.h"
#include "agent/util/status.h"
#include "agent/util/thread_name.h"

namespace parascope {
namespace {

absl::Status ValidateOptions(const PyroscopeOptions& o) {
  auto positive = [](absl::Duration d, const char* what) -> absl::Status {
    if (d <= absl::ZeroDuration()) {
      return absl::InvalidArgumentError(absl::StrCat(what, " must be positive"));
    }
    return absl::OkStatus();
  };
  if (o.queue_max_bytes == 0) return absl::InvalidArgumentError("--queue-max-bytes must be > 0");
  PS_RETURN_IF_ERROR(positive(o.request_timeout, "the push request timeout"));
  PS_RETURN_IF_ERROR(positive(o.backoff_initial, "the initial push backoff"));
  PS_RETURN_IF_ERROR(positive(o.window, "the collection interval"));
  if (o.backoff_max < o.backoff_initial) {
    return absl::InvalidArgumentError("the maximum push backoff is below the initial one");
  }
  if (o.shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown-timeout must not be negative");
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<PyroscopeExporter>> PyroscopeExporter::Create(
    PyroscopeOptions options, SeriesLabelsFn labels) {
  PS_RETURN_IF_ERROR(ValidateOptions(options));
  PS_ASSIGN_OR_RETURN(RemoteUrl url, ParseRemoteUrl(options.url));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<PushTransport> transport, MakePushTransport(options, url));
  return CreateWithTransport(std::move(options), std::move(labels), std::move(transport));
}

absl::StatusOr<std::unique_ptr<PyroscopeExporter>> PyroscopeExporter::CreateWithTransport(
    PyroscopeOptions options, SeriesLabelsFn labels, std::unique_ptr<PushTransport> transport,
    std::function<absl::Time()> now) {
  PS_RETURN_IF_ERROR(ValidateOptions(options));
  PS_ASSIGN_OR_RETURN(RemoteUrl url, ParseRemoteUrl(options.url));
  if (transport == nullptr) return absl::InvalidArgumentError("no push transport");
  std::unique_ptr<PyroscopeExporter> e(
      new PyroscopeExporter(std::move(options), std::move(url), std::move(labels),
                            std::move(transport), now ? std::move(now) : absl::Now));
  e->sender_ = std::thread(&PyroscopeExporter::SenderLoop, e.get());
  return e;
}

PyroscopeExporter::PyroscopeExporter(PyroscopeOptions options, RemoteUrl url, SeriesLabelsFn labels,
                                     std::unique_ptr<PushTransport> transport,
                                     std::function<absl::Time()> now)
    : options_(std::move(options)),
      url_(std::move(url)),
      labels_(std::move(labels)),
      transport_(std::move(transport)),
      now_(std::move(now)) {}

PyroscopeExporter::~PyroscopeExporter() { Shutdown(); }

absl::Status PyroscopeExporter::Export(const ProcessProfile& p) {
  auto item = std::make_shared<Item>();
  push::v1::RawProfileSeries* series = item->request.add_series();
  types::v1::LabelPair* name = series->add_labels();
  name->set_name("__name__");
  name->set_value(p.type);
  if (labels_) {
    for (auto& [k, v] : labels_(p)) {
      if (k == "__name__") continue;
      types::v1::LabelPair* l = series->add_labels();
      l->set_name(std::move(k));
      l->set_value(std::move(v));
    }
  }

  // Copied only when something has to change.
  const perftools::profiles::Profile* profile = p.profile.get();
  perftools::profiles::Profile edited;
  bool other_labels = false;
  for (const auto& s : p.profile->sample()) {
    for (const auto& l : s.label()) {
      static const std::string kNone;
      const std::string& key = l.key() >= 0 && l.key() < p.profile->string_table_size()
                                   ? p.profile->string_table(l.key())
                                   : kNone;
      if (std::find(options_.sample_label_keys.begin(), options_.sample_label_keys.end(), key) ==
          options_.sample_label_keys.end()) {
        other_labels = true;
        break;
      }
    }
    if (other_labels) break;
  }
  if (other_labels) {
    edited = *p.profile;
    KeepSampleLabels(&edited, options_.sample_label_keys);
    profile = &edited;
  }
  size_t folded = 0;
  if (profile->sample_size() > static_cast<int>(kServerMaxSamples) ||
      profile->ByteSizeLong() > kServerMaxProfileBytes) {
    if (profile != &edited) edited = *p.profile;
    folded = TrimForServerLimits(&edited, kServerMaxSamples, kServerMaxProfileBytes);
    profile = &edited;
  }
  PS_ASSIGN_OR_RETURN(std::string gz, SerializeGzip(*profile));
  push::v1::RawSample* sample = series->add_samples();
  sample->set_raw_profile(std::move(gz));
  sample->set_id(NewUuidV4());
  item->bytes = item->request.ByteSizeLong();
  item->time_nanos = p.profile->time_nanos();

  absl::MutexLock l(&mu_);
  if (stopping_) return absl::FailedPreconditionError("the Pyroscope exporter is shut down");
  if (folded > 0) {
    ++stats_.profiles_trimmed;
    stats_.samples_folded += folded;
  }
  if (item->bytes > options_.queue_max_bytes) {
    ++stats_.dropped["queue_full"];
    return absl::OkStatus();
  }
  while (!queue_.empty() && stats_.queue_bytes + item->bytes > options_.queue_max_bytes) {
    std::shared_ptr<Item> old = std::move(queue_.front());
    queue_.pop_front();
    stats_.queue_bytes -= old->bytes;
    if (old->in_flight) {
      old->evicted = true;  // counted by the sender once its outcome is known
    } else {
      ++stats_.dropped["queue_full"];
    }
  }
  stats_.queue_bytes += item->bytes;
  queue_.push_back(std::move(item));
  ++stats_.enqueued;
  cv_.Signal();
  return absl::OkStatus();
}

void PyroscopeExporter::PopLocked(const std::shared_ptr<Item>& item) {
  if (!queue_.empty() && queue_.front() == item) {
    stats_.queue_bytes -= item->bytes;
    queue_.pop_front();
  }
}

void PyroscopeExporter::MarkUpLocked() {
  if (down_since_ != absl::InfiniteFuture()) {
    Log(LogLevel::kInfo,
        "push endpoint %s (%s) back up after %s: %d failed attempts retried, queue %d bytes",
        url_.Base(), options_.protocol, absl::FormatDuration(now_() - down_since_),
        stats_.retries - retries_at_down_, stats_.queue_bytes);
    down_since_ = absl::InfiniteFuture();
  } else if (!ever_up_) {
    Log(LogLevel::kInfo, "push endpoint %s (%s) up", url_.Base(), options_.protocol);
  }
  ever_up_ = true;
}

void PyroscopeExporter::MarkDownLocked(const PushResult& r) {
  if (down_since_ != absl::InfiniteFuture()) return;
  down_since_ = now_();
  retries_at_down_ = stats_.retries;
  Log(LogLevel::kWarning,
      "push endpoint %s (%s) down: %s; retrying with backoff (queue %d of %d bytes)", url_.Base(),
      options_.protocol, r.message, stats_.queue_bytes, options_.queue_max_bytes);
}

bool PyroscopeExporter::ReadyLocked() const {
  return down_since_ == absl::InfiniteFuture() || now_() - down_since_ <= 2 * options_.window;
}

void PyroscopeExporter::SenderLoop() {
  NameThisThread("ps-push");
  int attempt = 0;  // consecutive retryable failures
  absl::MutexLock l(&mu_);
  for (;;) {
    while (queue_.empty() && !stopping_) cv_.Wait(&mu_);
    if (queue_.empty()) break;  // shutting down, everything delivered
    absl::Duration timeout = options_.request_timeout;
    if (stopping_) {
      absl::Duration left = shutdown_deadline_ - absl::Now();
      if (left <= absl::ZeroDuration()) break;
      timeout = std::min(timeout, left);
    }
    std::shared_ptr<Item> item = queue_.front();
    if (now_() - absl::FromUnixNanos(item->time_nanos) > options_.max_profile_age) {
      PopLocked(item);
      ++stats_.dropped["expired"];
      continue;
    }
    item->in_flight = true;
    const bool was_stopping = stopping_;

    mu_.Unlock();
    PushResult r = transport_->Push(item->request, timeout);
    mu_.Lock();

    item->in_flight = false;
    absl::Duration wait = absl::ZeroDuration();
    if (r.ok) {
      ++stats_.sent;
      stats_.bytes_sent += item->bytes;
      PopLocked(item);
      attempt = 0;
      MarkUpLocked();
    } else if (stopping_ && absl::Now() >= shutdown_deadline_) {
      // Cut short by the shutdown deadline (or cancelled): not the server's verdict.
      PopLocked(item);
      ++stats_.dropped[item->evicted ? "queue_full" : "shutdown"];
      break;
    } else {
      ++stats_.failures[r.code.empty() ? "unknown" : r.code];
      stats_.last_error = r.message;
      if (!r.retryable) {
        PopLocked(item);
        ++stats_.dropped["rejected"];
        attempt = 0;
        MarkUpLocked();
        rejected_log_.Log(LogLevel::kWarning,
                          "push to %s rejected, profile dropped (not retryable): %s", url_.Base(),
                          r.message);
      } else {
        MarkDownLocked(r);
        if (item->evicted) {
          ++stats_.dropped["queue_full"];
        } else {
          ++stats_.retries;
        }
        wait = BackoffDelay(attempt, options_.backoff_initial, options_.backoff_max,
                            absl::Uniform(jitter_, 0.0, 1.0));
        wait = std::max(wait, std::min(r.retry_after, options_.backoff_max));
        attempt = std::min(attempt + 1, 64);
      }
    }
    // Back off. A shutdown requested since this attempt began ends the wait: one more attempt
    // at once (the endpoint may be back while the backoff has grown long); later waits end at
    // its deadline.
    absl::Time wake = absl::Now() + wait;
    for (;;) {
      if (stopping_ && !was_stopping) break;
      absl::Time limit = stopping_ ? std::min(wake, shutdown_deadline_) : wake;
      if (absl::Now() >= limit) break;
      cv_.WaitWithDeadline(&mu_, limit);
    }
  }
  for (const auto& item : queue_) {
    (void)item;
    ++stats_.dropped["shutdown"];
  }
  queue_.clear();
  stats_.queue_bytes = 0;
  sender_done_ = true;
}

void PyroscopeExporter::Shutdown() {
  absl::MutexLock shutdown_lock(&shutdown_mu_);
  if (!sender_.joinable()) return;
  bool done;
  {
    absl::MutexLock l(&mu_);
    if (!stopping_) {
      stopping_ = true;
      shutdown_deadline_ = absl::Now() + options_.shutdown_timeout;
      cv_.SignalAll();
    }
    // A request started before Shutdown may run for the whole request timeout: cancel it when
    // the deadline passes.
    done = mu_.AwaitWithDeadline(absl::Condition(&sender_done_), shutdown_deadline_);
  }
  if (!done) transport_->Cancel();
  sender_.join();
}

PyroscopeExporter::Stats PyroscopeExporter::GetStats() const {
  absl::MutexLock l(&mu_);
  Stats s = stats_;
  s.queue_length = queue_.size();
  s.endpoint_up = down_since_ == absl::InfiniteFuture();
  s.ready = ReadyLocked();
  return s;
}

bool PyroscopeExporter::Ready() const {
  absl::MutexLock l(&mu_);
  return ReadyLocked();
}

}  // namespace parascope
