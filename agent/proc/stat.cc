#include "agent/proc/stat.h"

#include <charconv>
#include <limits>
#include <system_error>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace parascope::proc {
namespace {

template <typename T>
bool ParseInt(absl::string_view s, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out, 10);
  return ec == std::errc() && ptr == end;
}

absl::Status Malformed(absl::string_view what, absl::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat("/proc stat: ", what, ": \"", text, "\""));
}

}  // namespace

absl::StatusOr<ProcStat> ParseStat(absl::string_view text) {
  text = absl::StripTrailingAsciiWhitespace(text);
  // comm is printed raw between "(" and ")" and may itself contain parentheses and spaces; the
  // fields after it never do, so the comm ends at the last ')'.
  size_t open = text.find('(');
  size_t close = text.rfind(')');
  if (open == absl::string_view::npos || close == absl::string_view::npos || close < open) {
    return Malformed("no (comm)", text);
  }
  ProcStat st;
  if (!ParseInt(absl::StripAsciiWhitespace(text.substr(0, open)), &st.pid)) {
    return Malformed("bad pid", text);
  }
  st.comm = std::string(text.substr(open + 1, close - open - 1));

  // fields[0] is field 3 (state); field N is fields[N - 3].
  std::vector<absl::string_view> fields =
      absl::StrSplit(text.substr(close + 1), ' ', absl::SkipEmpty());
  constexpr size_t kLastUsedField = 22;
  if (fields.size() < kLastUsedField - 2) {
    return Malformed(absl::StrCat("only ", fields.size() + 2, " fields"), text);
  }
  auto field = [&fields](int n) { return fields[n - 3]; };
  if (field(3).size() != 1) return Malformed("bad state", text);
  st.state = field(3)[0];
  if (!ParseInt(field(4), &st.ppid)) return Malformed("bad ppid", text);
  if (!ParseInt(field(14), &st.utime_ticks)) return Malformed("bad utime", text);
  if (!ParseInt(field(15), &st.stime_ticks)) return Malformed("bad stime", text);
  if (!ParseInt(field(20), &st.num_threads)) return Malformed("bad num_threads", text);
  if (!ParseInt(field(22), &st.start_time_ticks)) return Malformed("bad starttime", text);
  return st;
}

uint64_t TicksToNs(uint64_t ticks) {
  if (ticks > std::numeric_limits<uint64_t>::max() / kNsPerTick) {
    return std::numeric_limits<uint64_t>::max();
  }
  return ticks * kNsPerTick;
}

uint64_t BootNsToTicks(uint64_t boot_ns) { return boot_ns / kNsPerTick; }

}  // namespace parascope::proc
