#include "agent/server/metrics.h"

#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "agent/util/log.h"

namespace parascope::server {
namespace {

constexpr absl::string_view kMetricPrefix = "parascope_";

[[noreturn]] void Fatal(absl::string_view message) {
  LogLine(LogLevel::kError, absl::StrCat("metrics registry: ", message));
  std::abort();
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool IsNameChar(char c) { return IsNameStart(c) || (c >= '0' && c <= '9'); }

bool MatchesNameRule(absl::string_view name) {
  if (name.empty() || !IsNameStart(name[0])) return false;
  for (char c : name) {
    if (!IsNameChar(c)) return false;
  }
  return true;
}

// HELP text escaping of the 0.0.4 format: backslash and newline.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// A series' value summed over its sources: exact while every source is an integer counter.
struct Accumulator {
  uint64_t integer = 0;
  double real = 0;
  bool has_real = false;
};

std::string FormatAccumulator(const Accumulator& a) {
  if (!a.has_real) return absl::StrCat(a.integer);
  return FormatMetricValue(static_cast<double>(a.integer) + a.real);
}

}  // namespace

std::string FormatMetricValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integral values within the exactly representable range print without exponent or ".0".
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0 /* 2^53 */) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value);
  return std::string(buf, end);
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// ---- MetricFamily ----

template <typename T>
T& MetricFamily<T>::With(const std::vector<std::string>& label_values) {
  if (label_values.size() != num_labels_) {
    Fatal(absl::StrCat(name_, ": ", label_values.size(), " label values for ", num_labels_,
                       " label names"));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<T>& slot = series_[label_values];
  if (slot == nullptr) slot = std::make_unique<T>();
  return *slot;
}

template <typename T>
void MetricFamily<T>::ForEach(
    const std::function<void(const std::vector<std::string>&, const T&)>& fn) const {
  absl::MutexLock lock(&mu_);
  for (const auto& [values, series] : series_) fn(values, *series);
}

template class MetricFamily<Counter>;
template class MetricFamily<Gauge>;

// ---- CallbackRegistration ----

CallbackRegistration::CallbackRegistration(CallbackRegistration&& other) noexcept
    : registry_(other.registry_), name_(std::move(other.name_)), id_(other.id_) {
  other.registry_ = nullptr;
}

CallbackRegistration& CallbackRegistration::operator=(CallbackRegistration&& other) noexcept {
  if (this != &other) {
    Reset();
    registry_ = other.registry_;
    name_ = std::move(other.name_);
    id_ = other.id_;
    other.registry_ = nullptr;
  }
  return *this;
}

CallbackRegistration::~CallbackRegistration() { Reset(); }

void CallbackRegistration::Reset() {
  if (registry_ != nullptr) registry_->RemoveCallback(name_, id_);
  registry_ = nullptr;
}

// ---- MetricsRegistry ----

absl::Status MetricsRegistry::ValidateMetricName(absl::string_view name) {
  if (!absl::StartsWith(name, kMetricPrefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" does not start with \"", kMetricPrefix, "\""));
  }
  if (name.size() == kMetricPrefix.size() || !MatchesNameRule(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name \"", name, "\" does not match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  return absl::OkStatus();
}

absl::Status MetricsRegistry::ValidateLabelName(absl::string_view name) {
  if (!MatchesNameRule(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name, "\" does not match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  if (absl::StartsWith(name, "__")) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name, "\" starts with \"__\" (reserved)"));
  }
  return absl::OkStatus();
}

MetricsRegistry::Family& MetricsRegistry::GetFamily(MetricType type, const std::string& name,
                                                    const std::string& help,
                                                    const std::vector<std::string>& label_names) {
  if (absl::Status s = ValidateMetricName(name); !s.ok()) Fatal(s.message());
  for (size_t i = 0; i < label_names.size(); ++i) {
    if (absl::Status s = ValidateLabelName(label_names[i]); !s.ok()) {
      Fatal(absl::StrCat(name, ": ", s.message()));
    }
    for (size_t j = 0; j < i; ++j) {
      if (label_names[i] == label_names[j]) {
        Fatal(absl::StrCat(name, ": duplicate label name \"", label_names[i], "\""));
      }
    }
  }

  absl::MutexLock lock(&mu_);
  std::unique_ptr<Family>& slot = families_[name];
  if (slot == nullptr) {
    slot = std::make_unique<Family>();
    slot->name = name;
    slot->help = help;
    slot->type = type;
    slot->label_names = label_names;
    if (type == MetricType::kCounter) {
      slot->counters = std::make_unique<CounterFamily>(name, label_names.size());
    } else {
      slot->gauges = std::make_unique<GaugeFamily>(name, label_names.size());
    }
    return *slot;
  }
  if (slot->type != type) {
    Fatal(absl::StrCat(name, ": registered again with another type"));
  }
  if (slot->label_names != label_names) {
    Fatal(absl::StrCat(name, ": registered again with labels {", absl::StrJoin(label_names, ","),
                       "}, first with {", absl::StrJoin(slot->label_names, ","), "}"));
  }
  return *slot;
}

CounterFamily& MetricsRegistry::GetCounterFamily(const std::string& name, const std::string& help,
                                                 const std::vector<std::string>& label_names) {
  return *GetFamily(MetricType::kCounter, name, help, label_names).counters;
}

GaugeFamily& MetricsRegistry::GetGaugeFamily(const std::string& name, const std::string& help,
                                             const std::vector<std::string>& label_names) {
  return *GetFamily(MetricType::kGauge, name, help, label_names).gauges;
}

Counter& MetricsRegistry::GetCounter(const std::string& name, const std::string& help) {
  return GetCounterFamily(name, help, {}).With({});
}

Gauge& MetricsRegistry::GetGauge(const std::string& name, const std::string& help) {
  return GetGaugeFamily(name, help, {}).With({});
}

CallbackRegistration MetricsRegistry::AddCallback(MetricType type, const std::string& name,
                                                  const std::string& help,
                                                  const std::vector<std::string>& label_names,
                                                  MetricCallback callback) {
  Family& family = GetFamily(type, name, help, label_names);
  uint64_t id;
  {
    absl::MutexLock lock(&mu_);
    id = next_callback_id_++;
  }
  {
    absl::MutexLock lock(&family.callbacks_mu);
    family.callbacks.emplace(id, std::move(callback));
  }
  return CallbackRegistration(this, name, id);
}

void MetricsRegistry::RemoveCallback(const std::string& name, uint64_t id) {
  Family* family = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = families_.find(name);
    if (it == families_.end()) return;
    family = it->second.get();
  }
  absl::MutexLock lock(&family->callbacks_mu);
  family->callbacks.erase(id);
}

std::string MetricsRegistry::RenderPrometheusText() const {
  std::vector<Family*> families;
  {
    absl::MutexLock lock(&mu_);
    families.reserve(families_.size());
    for (const auto& [name, family] : families_) families.push_back(family.get());
  }

  std::string out;
  for (Family* family : families) {
    std::map<std::vector<std::string>, Accumulator> series;
    if (family->counters != nullptr) {
      family->counters->ForEach([&](const std::vector<std::string>& values, const Counter& c) {
        series[values].integer += c.value();
      });
    } else {
      family->gauges->ForEach([&](const std::vector<std::string>& values, const Gauge& g) {
        Accumulator& a = series[values];
        a.real += g.value();
        a.has_real = true;
      });
    }
    {
      absl::MutexLock lock(&family->callbacks_mu);
      for (const auto& [id, callback] : family->callbacks) {
        for (CallbackSample& sample : callback()) {
          if (sample.label_values.size() != family->label_names.size()) continue;
          Accumulator& a = series[std::move(sample.label_values)];
          a.real += sample.value;
          a.has_real = true;
        }
      }
    }

    absl::StrAppend(&out, "# HELP ", family->name, " ", EscapeHelp(family->help), "\n");
    absl::StrAppend(&out, "# TYPE ", family->name, " ",
                    family->type == MetricType::kCounter ? "counter" : "gauge", "\n");
    for (const auto& [values, acc] : series) {
      out += family->name;
      if (!values.empty()) {
        out += '{';
        for (size_t i = 0; i < values.size(); ++i) {
          if (i > 0) out += ',';
          absl::StrAppend(&out, family->label_names[i], "=\"", EscapeLabelValue(values[i]), "\"");
        }
        out += '}';
      }
      absl::StrAppend(&out, " ", FormatAccumulator(acc), "\n");
    }
  }
  return out;
}

}  // namespace parascope::server
