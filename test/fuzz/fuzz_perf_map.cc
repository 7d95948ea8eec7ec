// libFuzzer target: perf map parsing (/tmp/perf-<pid>.map, written by the profiled process, so
// untrusted). ParsePerfMapLines must consume exactly the complete lines, parse the same symbols
// when the text arrives in two pieces (the file is read while the JIT appends to it), and the
// PerfMap reader (incremental pread + lookup) must agree with the symbols' ranges.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/strings/string_view.h"
#include "agent/symbolize/perf_map.h"
#include "fuzz_util.h"

using parascope::symbolize::ParsePerfMapLines;
using parascope::symbolize::PerfMap;
using parascope::symbolize::PerfMapParseStats;
using parascope::symbolize::PerfMapSymbol;

namespace {

bool Same(const std::vector<PerfMapSymbol>& a, const std::vector<PerfMapSymbol>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].start != b[i].start || a[i].size != b[i].size || a[i].name != b[i].name) return false;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static parascope::fuzz::MemFile file("fuzz_perf_map");
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  std::vector<PerfMapSymbol> all;
  PerfMapParseStats stats;
  const size_t used = ParsePerfMapLines(text, &all, &stats);
  // Everything up to and including the last '\n', nothing of a half-written last line.
  PS_FUZZ_CHECK(used <= size);
  PS_FUZZ_CHECK(used == 0 || data[used - 1] == '\n');
  const size_t last_nl = text.rfind('\n');
  PS_FUZZ_CHECK(used == (last_nl == absl::string_view::npos ? 0 : last_nl + 1));
  PS_FUZZ_CHECK(stats.symbols == all.size());
  for (const PerfMapSymbol& s : all) {
    PS_FUZZ_CHECK(s.size != 0);
    PS_FUZZ_CHECK(s.start + s.size > s.start);  // no wrap-around
    PS_FUZZ_CHECK(!s.name.empty());
    PS_FUZZ_CHECK(s.name.find('\n') == std::string::npos);
  }

  // The same text in two pieces: the second call starts where the first stopped.
  const size_t split = size == 0 ? 0 : data[0] % (size + 1);
  std::vector<PerfMapSymbol> pieces;
  PerfMapParseStats pstats;
  const size_t used1 = ParsePerfMapLines(text.substr(0, split), &pieces, &pstats);
  PS_FUZZ_CHECK(used1 <= split);
  const size_t used2 = ParsePerfMapLines(text.substr(used1), &pieces, &pstats);
  PS_FUZZ_CHECK(used1 + used2 == used);
  PS_FUZZ_CHECK(Same(all, pieces));
  PS_FUZZ_CHECK(pstats.symbols == stats.symbols && pstats.invalid == stats.invalid);

  // The reader: the first piece written, read, the rest appended, read again, then lookups.
  file.Set(data, split);
  int fd = dup(file.fd());
  PS_FUZZ_CHECK(fd >= 0);
  PerfMap map(fd, "/tmp/perf-1.map");
  PS_FUZZ_CHECK(map.Refresh(size + 1).ok());
  file.Append(data + split, size - split, split);
  PS_FUZZ_CHECK(map.Refresh(size + 1).ok());
  PS_FUZZ_CHECK(map.stats().symbols == stats.symbols);
  for (size_t i = 0; i < all.size() && i < 16; ++i) {
    const uint64_t probes[] = {all[i].start, all[i].start + all[i].size - 1,
                               all[i].start + all[i].size, all[i].start - 1};
    for (uint64_t addr : probes) {
      if (const PerfMapSymbol* s = map.Lookup(addr)) PS_FUZZ_CHECK(addr - s->start < s->size);
    }
  }
  // The symbol covering a symbol's first byte is that symbol or a later line covering it.
  if (!all.empty()) PS_FUZZ_CHECK(map.Lookup(all.back().start) != nullptr);
  return 0;
}
