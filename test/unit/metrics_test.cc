#include "agent/server/metrics.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace parascope::server {
namespace {

TEST_CASE("An empty registry renders nothing") {
  MetricsRegistry metrics;
  CHECK(metrics.RenderPrometheusText() == "");
}

TEST_CASE("Counters and gauges render in the 0.0.4 text format, sorted by name") {
  MetricsRegistry metrics;
  Gauge& queue = metrics.GetGauge("parascope_queue_bytes", "Bytes waiting in the push queue.");
  Counter& samples = metrics.GetCounter("parascope_samples_total", "Samples taken.");
  CounterFamily& failures = metrics.GetCounterFamily("parascope_push_failures_total",
                                                     "Failed push attempts by code.", {"code"});
  samples.Increment();
  samples.Increment(41);
  failures.With({"UNAVAILABLE"}).Increment(3);
  failures.With({"INVALID_ARGUMENT"}).Increment();
  queue.Set(4096);
  queue.Add(-96);

  CHECK(samples.value() == 42);
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_push_failures_total Failed push attempts by code.\n"
        "# TYPE parascope_push_failures_total counter\n"
        "parascope_push_failures_total{code=\"INVALID_ARGUMENT\"} 1\n"
        "parascope_push_failures_total{code=\"UNAVAILABLE\"} 3\n"
        "# HELP parascope_queue_bytes Bytes waiting in the push queue.\n"
        "# TYPE parascope_queue_bytes gauge\n"
        "parascope_queue_bytes 4000\n"
        "# HELP parascope_samples_total Samples taken.\n"
        "# TYPE parascope_samples_total counter\n"
        "parascope_samples_total 42\n");
}

TEST_CASE("Registering a family again returns the same series") {
  MetricsRegistry metrics;
  Counter& a = metrics.GetCounter("parascope_x_total", "First help.");
  Counter& b = metrics.GetCounter("parascope_x_total", "Ignored help.");
  CHECK(&a == &b);
  CounterFamily& f = metrics.GetCounterFamily("parascope_y_total", "Y.", {"a", "b"});
  CHECK(&f.With({"1", "2"}) == &f.With({"1", "2"}));
  CHECK(&f.With({"1", "2"}) != &f.With({"2", "1"}));
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_x_total First help.\n"
        "# TYPE parascope_x_total counter\n"
        "parascope_x_total 0\n"
        "# HELP parascope_y_total Y.\n"
        "# TYPE parascope_y_total counter\n"
        "parascope_y_total{a=\"1\",b=\"2\"} 0\n"
        "parascope_y_total{a=\"2\",b=\"1\"} 0\n");
}

TEST_CASE("Label values and help text are escaped") {
  MetricsRegistry metrics;
  metrics
      .GetGaugeFamily("parascope_escape", "Help with \\ backslash\nand newline \"quoted\".",
                      {"path"})
      .With({"C:\\dir \"x\"\nnext"})
      .Set(1);
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_escape Help with \\\\ backslash\\nand newline \"quoted\".\n"
        "# TYPE parascope_escape gauge\n"
        "parascope_escape{path=\"C:\\\\dir \\\"x\\\"\\nnext\"} 1\n");
  CHECK(EscapeLabelValue("a\\b\"c\nd") == "a\\\\b\\\"c\\nd");
}

TEST_CASE("Sample values format as integers, shortest doubles and non-finite names") {
  CHECK(FormatMetricValue(0) == "0");
  CHECK(FormatMetricValue(-3) == "-3");
  CHECK(FormatMetricValue(1e15) == "1000000000000000");
  CHECK(FormatMetricValue(0.1) == "0.1");
  CHECK(FormatMetricValue(2.5e-7) == "2.5e-07");
  CHECK(FormatMetricValue(1e300) == "1e+300");
  CHECK(FormatMetricValue(std::numeric_limits<double>::infinity()) == "+Inf");
  CHECK(FormatMetricValue(-std::numeric_limits<double>::infinity()) == "-Inf");
  CHECK(FormatMetricValue(std::nan("")) == "NaN");
}

TEST_CASE("Large counters render exactly") {
  MetricsRegistry metrics;
  metrics.GetCounter("parascope_big_total", "Big.").Increment(18446744073709551615ull);
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_big_total Big.\n"
        "# TYPE parascope_big_total counter\n"
        "parascope_big_total 18446744073709551615\n");
}

TEST_CASE("Callbacks are sampled at scrape time and add to series with the same labels") {
  MetricsRegistry metrics;
  CounterFamily& lost = metrics.GetCounterFamily("parascope_samples_lost_total",
                                                 "Samples lost by reason.", {"reason"});
  lost.With({"stack_fault"}).Increment(2);
  double ring_full = 5;
  CallbackRegistration oncpu = metrics.AddCallback(
      MetricType::kCounter, "parascope_samples_lost_total", "ignored", {"reason"}, [&] {
        return std::vector<CallbackSample>{{{"ring_full"}, ring_full}, {{"stack_fault"}, 1}};
      });
  CallbackRegistration sched = metrics.AddCallback(
      MetricType::kCounter, "parascope_samples_lost_total", "ignored", {"reason"}, [] {
        return std::vector<CallbackSample>{{{"ring_full"}, 10}, {{"a", "b"}, 99} /* skipped */};
      });
  CallbackRegistration run_time =
      metrics.AddCallback(MetricType::kCounter, "parascope_bpf_run_time_seconds_total",
                          "BPF program run time.", {"program"}, [] {
                            return std::vector<CallbackSample>{{{"oncpu"}, 0.25}};
                          });

  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_bpf_run_time_seconds_total BPF program run time.\n"
        "# TYPE parascope_bpf_run_time_seconds_total counter\n"
        "parascope_bpf_run_time_seconds_total{program=\"oncpu\"} 0.25\n"
        "# HELP parascope_samples_lost_total Samples lost by reason.\n"
        "# TYPE parascope_samples_lost_total counter\n"
        "parascope_samples_lost_total{reason=\"ring_full\"} 15\n"
        "parascope_samples_lost_total{reason=\"stack_fault\"} 3\n");

  ring_full = 7;
  sched.Reset();
  run_time = CallbackRegistration();  // move-assigning unregisters the old one
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_bpf_run_time_seconds_total BPF program run time.\n"
        "# TYPE parascope_bpf_run_time_seconds_total counter\n"
        "# HELP parascope_samples_lost_total Samples lost by reason.\n"
        "# TYPE parascope_samples_lost_total counter\n"
        "parascope_samples_lost_total{reason=\"ring_full\"} 7\n"
        "parascope_samples_lost_total{reason=\"stack_fault\"} 3\n");
}

TEST_CASE("A registration moved out of scope keeps the callback") {
  MetricsRegistry metrics;
  CallbackRegistration kept;
  {
    CallbackRegistration r =
        metrics.AddCallback(MetricType::kGauge, "parascope_tracked", "T.", {}, [] {
          return std::vector<CallbackSample>{{{}, 3}};
        });
    kept = std::move(r);
  }
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_tracked T.\n"
        "# TYPE parascope_tracked gauge\n"
        "parascope_tracked 3\n");
}

TEST_CASE("Metric and label names are validated") {
  CHECK(MetricsRegistry::ValidateMetricName("parascope_samples_total").ok());
  CHECK(MetricsRegistry::ValidateMetricName("samples_total").message() ==
        "metric name \"samples_total\" does not start with \"parascope_\"");
  CHECK(MetricsRegistry::ValidateMetricName("parascope_").message() ==
        "metric name \"parascope_\" does not match [a-zA-Z_][a-zA-Z0-9_]*");
  CHECK(MetricsRegistry::ValidateMetricName("parascope_a-b").message() ==
        "metric name \"parascope_a-b\" does not match [a-zA-Z_][a-zA-Z0-9_]*");
  CHECK(MetricsRegistry::ValidateMetricName("parascope_a:b").code() ==
        absl::StatusCode::kInvalidArgument);
  CHECK(MetricsRegistry::ValidateLabelName("reason").ok());
  CHECK(MetricsRegistry::ValidateLabelName("_x9").ok());
  CHECK(MetricsRegistry::ValidateLabelName("9x").message() ==
        "label name \"9x\" does not match [a-zA-Z_][a-zA-Z0-9_]*");
  CHECK(MetricsRegistry::ValidateLabelName("").code() == absl::StatusCode::kInvalidArgument);
  CHECK(MetricsRegistry::ValidateLabelName("__name__").message() ==
        "label name \"__name__\" starts with \"__\" (reserved)");
}

TEST_CASE("Concurrent increments are all counted") {
  MetricsRegistry metrics;
  CounterFamily& family = metrics.GetCounterFamily("parascope_c_total", "C.", {"t"});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&family, t] {
      Counter& c = family.With({t % 2 == 0 ? "even" : "odd"});
      for (int i = 0; i < 100000; ++i) c.Increment();
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(metrics.RenderPrometheusText() ==
        "# HELP parascope_c_total C.\n"
        "# TYPE parascope_c_total counter\n"
        "parascope_c_total{t=\"even\"} 200000\n"
        "parascope_c_total{t=\"odd\"} 200000\n");
}

}  // namespace
}  // namespace parascope::server
