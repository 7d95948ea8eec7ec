#include "agent/util/log.h"

#include <unistd.h>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace parascope {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
constexpr char kLevelChar[] = {'D', 'I', 'W', 'E'};
constexpr const char* kLevelName[] = {"debug", "info", "warning", "error"};
std::atomic<bool> g_json{false};
}  // namespace

bool ParseLogLevel(absl::string_view text, LogLevel* out) {
  std::string t = absl::AsciiStrToLower(text);
  if (t == "debug") *out = LogLevel::kDebug;
  else if (t == "info") *out = LogLevel::kInfo;
  else if (t == "warning" || t == "warn") *out = LogLevel::kWarning;
  else if (t == "error") *out = LogLevel::kError;
  else return false;
  return true;
}

void SetLogLevel(LogLevel level) { g_level.store(static_cast<int>(level)); }

bool LogEnabled(LogLevel level) { return static_cast<int>(level) >= g_level.load(); }

void SetLogFormat(LogFormat format) { g_json.store(format == LogFormat::kJson); }

void LogLine(LogLevel level, absl::string_view message) {
  const std::string ts =
      absl::FormatTime("%Y-%m-%dT%H:%M:%E3SZ", absl::Now(), absl::UTCTimeZone());
  std::string line;
  if (g_json.load()) {
    nlohmann::ordered_json j;
    j["ts"] = ts;
    j["level"] = kLevelName[static_cast<int>(level)];
    j["msg"] = std::string(message);
    line = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    line += '\n';
  } else {
    line = absl::StrCat(ts, " ", std::string(1, kLevelChar[static_cast<int>(level)]), " ",
                        message, "\n");
  }
  // One write(2) keeps lines from concurrent threads whole.
  ssize_t rc = write(STDERR_FILENO, line.data(), line.size());
  (void)rc;
}

bool RateLimitedLog::Allow(uint64_t* suppressed) {
  int64_t now = absl::ToUnixNanos(absl::Now());
  int64_t next = next_ns_.load();
  if (now < next || !next_ns_.compare_exchange_strong(next, now + absl::ToInt64Nanoseconds(interval_))) {
    suppressed_.fetch_add(1);
    return false;
  }
  *suppressed = suppressed_.exchange(0);
  return true;
}

}  // namespace parascope
