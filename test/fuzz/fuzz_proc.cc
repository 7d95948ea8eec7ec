// libFuzzer target: the /proc text parsers on arbitrary text. ParseMaps (/proc/<pid>/maps),
// ParseStat (/proc/<pid>/stat) and Kallsyms::Parse (/proc/kallsyms) each see every input; on
// success their documented postconditions are checked.
#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"
#include "agent/proc/maps.h"
#include "agent/proc/stat.h"
#include "agent/symbolize/kallsyms.h"
#include "fuzz_util.h"

using parascope::fuzz::Le64;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const absl::string_view text(reinterpret_cast<const char*>(data), size);

  if (auto maps = parascope::proc::ParseMaps(text); maps.ok()) {
    for (const parascope::proc::MapEntry& e : *maps) {
      PS_FUZZ_CHECK(e.start < e.end);
      PS_FUZZ_CHECK(e.perms.size() == 4);
      PS_FUZZ_CHECK(e.path.find('\n') == std::string::npos);
      (void)e.executable();
      (void)e.file_backed();
    }
  }

  if (auto st = parascope::proc::ParseStat(text); st.ok()) {
    PS_FUZZ_CHECK(st->comm.size() < size);
    (void)parascope::proc::TicksToNs(st->utime_ticks + st->stime_ticks);
    (void)parascope::proc::BootNsToTicks(parascope::proc::TicksToNs(st->start_time_ticks));
  }

  if (auto ks = parascope::symbolize::Kallsyms::Parse(text); ks.ok()) {
    PS_FUZZ_CHECK(ks->size() > 0);
    PS_FUZZ_CHECK(ks->min_address() <= ks->max_address());
    const uint64_t probes[] = {ks->min_address(), ks->max_address(), ks->min_address() - 1,
                               ks->max_address() + 1, Le64(data, size, 0),
                               Le64(data, size, size / 2)};
    for (uint64_t addr : probes) {
      if (auto sym = ks->Lookup(addr)) {
        PS_FUZZ_CHECK(sym->address <= addr);
        PS_FUZZ_CHECK(addr - sym->address < parascope::symbolize::Kallsyms::kMaxSymbolSpan);
      }
    }
    (void)ks->memory_bytes();
  }
  return 0;
}
