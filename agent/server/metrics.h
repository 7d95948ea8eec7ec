// A small thread-safe metrics registry rendered in the Prometheus text exposition format 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/), served on /metrics.
//
// Components register families once (at construction), keep the returned references and
// increment them; values are atomics, so an increment is one relaxed fetch_add. Looking up a
// labeled series (CounterFamily::With) takes a mutex: do it once per window or cache the
// reference, not once per sample. Counters that live elsewhere (per-CPU BPF counter arrays,
// ProfileStats) report through callbacks sampled at scrape time.
//
//   MetricsRegistry metrics;
//   Counter& pushed = metrics.GetCounter("parascope_profiles_pushed_total", "Profiles pushed.");
//   CounterFamily& failures = metrics.GetCounterFamily(
//       "parascope_push_failures_total", "Failed push attempts by code.", {"code"});
//   pushed.Increment();
//   failures.With({"UNAVAILABLE"}).Increment();
//
// Names: every metric name must start with "parascope_" and match [a-zA-Z_][a-zA-Z0-9_]* (colons
// are reserved for recording rules); label names match [a-zA-Z_][a-zA-Z0-9_]* and must not start
// with "__" (reserved by Prometheus). Counters should end in "_total" and use base units (seconds,
// bytes) per Prometheus naming practice (not enforced). Names are constants in code, so a bad name, a family registered
// twice with a different type or label names, or With() called with the wrong number of label
// values is a programming error: the registry logs it and aborts (as prometheus-cpp throws).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace parascope::server {

enum class MetricType { kCounter, kGauge };

// A monotonic count. Thread-safe; lives as long as its registry.
class Counter {
 public:
  Counter() = default;
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;

  void Increment(uint64_t n = 1) { value_.fetch_add(n, std::memory_order_relaxed); }
  uint64_t value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> value_{0};
};

// A value that goes up and down (queue bytes, processes tracked). Thread-safe; lives as long as
// its registry.
class Gauge {
 public:
  Gauge() = default;
  Gauge(const Gauge&) = delete;
  Gauge& operator=(const Gauge&) = delete;

  void Set(double v) { value_.store(v, std::memory_order_relaxed); }
  void Add(double d) { value_.fetch_add(d, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// The series of one family, one per distinct list of label values. Thread-safe.
template <typename T>
class MetricFamily {
 public:
  MetricFamily(std::string name, size_t num_labels)
      : name_(std::move(name)), num_labels_(num_labels) {}
  MetricFamily(const MetricFamily&) = delete;
  MetricFamily& operator=(const MetricFamily&) = delete;

  // Returns the series for `label_values` (in the order of the family's label names), creating
  // it at 0 on first use. The reference stays valid for the registry's lifetime. Takes a mutex:
  // cache the result on hot paths. Aborts when the number of values differs from the number of
  // label names.
  T& With(const std::vector<std::string>& label_values);

  // Calls fn(label_values, series) for each series, in label-value order.
  void ForEach(const std::function<void(const std::vector<std::string>&, const T&)>& fn) const;

 private:
  const std::string name_;
  const size_t num_labels_;
  mutable absl::Mutex mu_;
  // std::map: series render sorted by label values; unique_ptr keeps references stable.
  std::map<std::vector<std::string>, std::unique_ptr<T>> series_ ABSL_GUARDED_BY(mu_);
};

using CounterFamily = MetricFamily<Counter>;
using GaugeFamily = MetricFamily<Gauge>;

// One sample reported by a callback: values for the family's label names, in order.
struct CallbackSample {
  std::vector<std::string> label_values;
  double value = 0;
};
// Sampled at each scrape, on the HTTP server's thread: must be thread-safe and quick (e.g. sum
// a per-CPU BPF array). Samples with the wrong number of label values are skipped.
using MetricCallback = std::function<std::vector<CallbackSample>()>;

class MetricsRegistry;

// Keeps a callback registered; unregisters it on destruction (waiting for a scrape that is
// running it), so a component that owns the counted state can hold it as a member. Movable.
class CallbackRegistration {
 public:
  CallbackRegistration() = default;
  CallbackRegistration(CallbackRegistration&& other) noexcept;
  CallbackRegistration& operator=(CallbackRegistration&& other) noexcept;
  ~CallbackRegistration();

  // Unregisters now; idempotent.
  void Reset();

 private:
  friend class MetricsRegistry;
  CallbackRegistration(MetricsRegistry* registry, std::string name, uint64_t id)
      : registry_(registry), name_(std::move(name)), id_(id) {}

  MetricsRegistry* registry_ = nullptr;
  std::string name_;
  uint64_t id_ = 0;
};

// Owns all families. Thread-safe. Must outlive every reference and CallbackRegistration it handed
// out.
class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // Returns the family `name`, registering it on first use; later calls with the same name must
  // give the same type and label names (the first help text is kept). Aborts on invalid names or
  // a conflicting registration (see the file comment).
  CounterFamily& GetCounterFamily(const std::string& name, const std::string& help,
                                  const std::vector<std::string>& label_names);
  GaugeFamily& GetGaugeFamily(const std::string& name, const std::string& help,
                              const std::vector<std::string>& label_names);
  // Unlabeled shorthands: the single series of a family without labels.
  Counter& GetCounter(const std::string& name, const std::string& help);
  Gauge& GetGauge(const std::string& name, const std::string& help);

  // Adds a callback to family `name` (registered like the Get* methods, with `type`). A family
  // may have series and several callbacks: samples with the same label values are added up
  // (e.g. two BPF programs' lost-sample counters). Aborts like the Get* methods.
  [[nodiscard]] CallbackRegistration AddCallback(MetricType type, const std::string& name,
                                                 const std::string& help,
                                                 const std::vector<std::string>& label_names,
                                                 MetricCallback callback);

  // Renders every family in the text format 0.0.4, families sorted by name (bytewise), series
  // by label values: "# HELP <name> <help>\n# TYPE <name> counter|gauge\n" then one line
  // `name{l1="v1",l2="v2"} value\n` per series. HELP text escapes \ and newline; label values
  // escape \, " and newline. Integral values print as integers, others in the shortest form
  // that round-trips (std::to_chars), non-finite ones as NaN, +Inf, -Inf. A family with no
  // series and no callback samples renders its HELP and TYPE lines only. Callbacks run without
  // the registry lock held.
  std::string RenderPrometheusText() const;

  // Name checks used above (exposed for tests and for code building names at run time).
  // InvalidArgument naming the name and the rule it breaks.
  static absl::Status ValidateMetricName(absl::string_view name);
  static absl::Status ValidateLabelName(absl::string_view name);

 private:
  friend class CallbackRegistration;

  struct Family {
    std::string name;
    std::string help;
    MetricType type = MetricType::kCounter;
    std::vector<std::string> label_names;
    std::unique_ptr<CounterFamily> counters;  // set for kCounter
    std::unique_ptr<GaugeFamily> gauges;      // set for kGauge
    // Held while a callback runs, so RemoveCallback waits for a running scrape.
    absl::Mutex callbacks_mu;
    std::map<uint64_t, MetricCallback> callbacks ABSL_GUARDED_BY(callbacks_mu);
  };

  Family& GetFamily(MetricType type, const std::string& name, const std::string& help,
                    const std::vector<std::string>& label_names);
  void RemoveCallback(const std::string& name, uint64_t id);

  mutable absl::Mutex mu_;
  // Families are never removed; unique_ptr keeps them stable while rendering without mu_.
  std::map<std::string, std::unique_ptr<Family>> families_ ABSL_GUARDED_BY(mu_);
  uint64_t next_callback_id_ ABSL_GUARDED_BY(mu_) = 1;
};

// Formats a sample value as RenderPrometheusText does (exposed for tests).
std::string FormatMetricValue(double value);
// Escapes a label value: \ -> \\, " -> \", newline -> \n.
std::string EscapeLabelValue(absl::string_view value);

}  // namespace parascope::server
