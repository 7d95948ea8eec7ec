#include "agent/proc/maps.h"

#include <charconv>
#include <cstddef>
#include <system_error>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace parascope::proc {
namespace {

constexpr absl::string_view kDeletedSuffix = " (deleted)";

// Parses all of `s` as an unsigned integer in `base`; false on empty input, sign, junk or overflow.
template <typename T>
bool ParseUnsigned(absl::string_view s, int base, T* out) {
  if (s.empty()) return false;
  const char* end = s.data() + s.size();
  auto [ptr, ec] = std::from_chars(s.data(), end, *out, base);
  return ec == std::errc() && ptr == end;
}

// Removes and returns the next space-delimited token of `*rest` (leading spaces skipped).
absl::string_view NextToken(absl::string_view* rest) {
  size_t begin = rest->find_first_not_of(' ');
  if (begin == absl::string_view::npos) {
    *rest = absl::string_view();
    return absl::string_view();
  }
  rest->remove_prefix(begin);
  size_t len = rest->find(' ');
  if (len == absl::string_view::npos) len = rest->size();
  absl::string_view token = rest->substr(0, len);
  rest->remove_prefix(len);
  return token;
}

absl::Status Malformed(size_t line_no, absl::string_view what, absl::string_view line) {
  return absl::InvalidArgumentError(
      absl::StrCat("/proc maps line ", line_no, ": ", what, ": \"", line, "\""));
}

}  // namespace

bool MapEntry::executable() const { return perms.size() > 2 && perms[2] == 'x'; }

bool MapEntry::file_backed() const { return !path.empty() && path[0] == '/'; }

absl::StatusOr<std::vector<MapEntry>> ParseMaps(absl::string_view text) {
  std::vector<MapEntry> entries;
  size_t line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    if (line.empty()) continue;
    absl::string_view rest = line;
    MapEntry e;

    absl::string_view range = NextToken(&rest);
    size_t dash = range.find('-');
    if (dash == absl::string_view::npos || !ParseUnsigned(range.substr(0, dash), 16, &e.start) ||
        !ParseUnsigned(range.substr(dash + 1), 16, &e.end)) {
      return Malformed(line_no, "bad address range", line);
    }
    if (e.start >= e.end) return Malformed(line_no, "start >= end", line);

    absl::string_view perms = NextToken(&rest);
    if (perms.size() != 4) return Malformed(line_no, "bad perms", line);
    e.perms = std::string(perms);

    if (!ParseUnsigned(NextToken(&rest), 16, &e.offset)) {
      return Malformed(line_no, "bad offset", line);
    }

    absl::string_view dev = NextToken(&rest);
    size_t colon = dev.find(':');
    if (colon == absl::string_view::npos ||
        !ParseUnsigned(dev.substr(0, colon), 16, &e.dev_major) ||
        !ParseUnsigned(dev.substr(colon + 1), 16, &e.dev_minor)) {
      return Malformed(line_no, "bad device", line);
    }

    if (!ParseUnsigned(NextToken(&rest), 10, &e.inode)) {
      return Malformed(line_no, "bad inode", line);
    }

    // The rest, after the padding, is the path (possibly with spaces), or nothing for anonymous
    // memory (whose line ends with a single ' ' after the inode).
    size_t path_begin = rest.find_first_not_of(' ');
    if (path_begin != absl::string_view::npos) {
      absl::string_view path = rest.substr(path_begin);
      if (absl::EndsWith(path, kDeletedSuffix)) {
        path.remove_suffix(kDeletedSuffix.size());
        e.deleted = true;
      }
      e.path = std::string(path);
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace parascope::proc
