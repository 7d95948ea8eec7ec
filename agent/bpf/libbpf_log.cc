#include "agent/bpf/libbpf_log.h"

#include <bpf/libbpf.h>

#include <cstdarg>
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "agent/util/log.h"

namespace parascope {
namespace {

int Print(enum libbpf_print_level level, const char* format, va_list args) {
  LogLevel ours = level == LIBBPF_WARN ? LogLevel::kWarning : LogLevel::kDebug;
  if (!LogEnabled(ours)) return 0;
  // A verifier log comes as one message of up to megabytes; its end says what failed, so a
  // long message keeps its last 8 KiB.
  va_list copy;
  va_copy(copy, args);
  int n = vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  if (n < 0) return n;
  std::string buf(static_cast<size_t>(n) + 1, '\0');
  vsnprintf(buf.data(), buf.size(), format, args);
  buf.resize(static_cast<size_t>(n));
  constexpr size_t kKeep = 8192;
  if (buf.size() > kKeep) buf = absl::StrCat("[...] ", buf.substr(buf.size() - kKeep));
  LogLine(ours, absl::StrCat("libbpf: ", absl::StripTrailingAsciiWhitespace(buf)));
  return n;
}

}  // namespace

void InstallLibbpfLogger() { libbpf_set_print(Print); }

}  // namespace parascope
