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
  char buf[1024];
  int n = vsnprintf(buf, sizeof(buf), format, args);
  LogLine(ours, absl::StrCat("libbpf: ", absl::StripTrailingAsciiWhitespace(buf)));
  return n;
}

}  // namespace

void InstallLibbpfLogger() { libbpf_set_print(Print); }

}  // namespace parascope
