// Minimal leveled logging to stderr (Debian's Abseil 20220623 has no absl/log).
//
// Lines look like `2026-11-30T17:49:48.123Z I attached on-CPU sampling ...`. Use PS_LOG for state
// changes only (attach, detach, endpoint up/down); repeated faults go through RateLimitedLog so a
// broken binary or a vanished process costs one line per interval, not one per sample.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include "absl/strings/string_view.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

namespace parascope {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

// Parses "debug", "info", "warning"/"warn", "error". False on anything else.
bool ParseLogLevel(absl::string_view text, LogLevel* out);
void SetLogLevel(LogLevel level);
// kText: `<RFC 3339 UTC time, ms> <D|I|W|E> <message>`. kJson (--log-format=json): one JSON
// object a line, {"ts":"2026-12-02T01:02:03.456Z","level":"info","msg":"..."}, invalid UTF-8 in
// a message (a process's name, a path) replaced by U+FFFD (nlohmann-json's dump).
enum class LogFormat { kText, kJson };
void SetLogFormat(LogFormat format);
bool LogEnabled(LogLevel level);
// Writes one line (thread-safe, a single write(2)).
void LogLine(LogLevel level, absl::string_view message);

template <typename... Args>
void Log(LogLevel level, const absl::FormatSpec<Args...>& format, const Args&... args) {
  if (LogEnabled(level)) LogLine(level, absl::StrFormat(format, args...));
}

// Emits at most one line per `interval` per instance and reports how many were suppressed.
// Thread-safe.
class RateLimitedLog {
 public:
  explicit RateLimitedLog(absl::Duration interval = absl::Seconds(60)) : interval_(interval) {}

  template <typename... Args>
  void Log(LogLevel level, const absl::FormatSpec<Args...>& format, const Args&... args) {
    if (!LogEnabled(level)) return;
    uint64_t suppressed = 0;
    if (!Allow(&suppressed)) return;
    std::string line = absl::StrFormat(format, args...);
    if (suppressed > 0) absl::StrAppend(&line, " (", suppressed, " similar suppressed)");
    LogLine(level, line);
  }

 private:
  bool Allow(uint64_t* suppressed);

  absl::Duration interval_;
  std::atomic<int64_t> next_ns_{0};
  std::atomic<uint64_t> suppressed_{0};
};

}  // namespace parascope
