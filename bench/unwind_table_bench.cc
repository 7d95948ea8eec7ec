// Prints the cost of building the unwind table of each ELF file given (agent/unwind/cfi.h): build
// time (median of 5), rows and bytes, and what the builder could not express. A benchmark: it
// asserts nothing. Used by bench/bench.py for libc, libstdc++ and python3.
//
// usage: unwind_table_bench FILE...     (DUMP=1 also prints every row)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "agent/unwind/cfi.h"

using parascope::unwind::BuildTableFromFile;

int main(int argc, char** argv) {
  std::printf("file\tms\trows\tbytes\tfdes\tunsupported_cfa\tunsupported_ra\tsignal_rows\n");
  for (int i = 1; i < argc; ++i) {
    std::vector<double> ms;
    absl::StatusOr<parascope::unwind::UnwindTable> t;
    for (int run = 0; run < 5; ++run) {
      auto t0 = std::chrono::steady_clock::now();
      t = BuildTableFromFile(argv[i]);
      ms.push_back(
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    }
    std::sort(ms.begin(), ms.end());
    if (!t.ok()) {
      std::printf("%s\terror: %s\n", argv[i], t.status().ToString().c_str());
      continue;
    }
    const auto& s = t->stats;
    std::printf("%s\t%.2f\t%zu\t%zu\t%lu\t%lu\t%lu\t%lu\n", argv[i], ms[2], t->rows.size(),
                t->bytes(), static_cast<unsigned long>(s.fdes),
                static_cast<unsigned long>(s.unsupported_cfa),
                static_cast<unsigned long>(s.unsupported_ra),
                static_cast<unsigned long>(s.signal_rows));
    if (std::getenv("DUMP") != nullptr) {
      for (const auto& r : t->rows) {
        std::printf("  %x cfa=%d%+d fp=%d%+d ra=%d%+d flags=%x\n", r.pc, r.cfa_rule, r.cfa_offset,
                    r.fp_rule, r.fp_offset, r.ra_rule, r.ra_offset, r.flags);
      }
    }
  }
  return 0;
}
