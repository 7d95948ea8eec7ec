#include <chrono>
#include <cstdio>
#include "agent/unwind/cfi.h"
using namespace parascope::unwind;
int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto t = BuildTableFromFile(argv[i]);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!t.ok()) { printf("%s: %s\n", argv[i], t.status().ToString().c_str()); continue; }
    auto& s = t->stats;
    printf("%s: %.1f ms rows=%zu bytes=%zu fdes=%lu dbg=%lu skipped=%lu raw=%lu ucfa=%lu ufp=%lu ura=%lu sig=%lu\n", argv[i], ms, t->rows.size(), t->bytes(), s.fdes, s.fdes_debug_frame, s.fdes_skipped, s.rows_raw, s.unsupported_cfa, s.unsupported_fp, s.unsupported_ra, s.signal_rows);
    if (getenv("DUMP")) for (auto& r : t->rows) printf("  %x cfa=%d%+d fp=%d%+d ra=%d%+d fl=%x\n", r.pc, r.cfa_rule, r.cfa_offset, r.fp_rule, r.fp_offset, r.ra_rule, r.ra_offset, r.flags);
  }
}
