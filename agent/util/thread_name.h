// Names the calling thread (prctl(2) PR_SET_NAME: at most 15 bytes, longer names are cut), so
// that /proc/<pid>/task/<tid>/comm, top -H, perf and parascope_thread_cpu_seconds_total tell the
// agent's threads apart.
#pragma once

#include <sys/prctl.h>

namespace parascope {

inline void NameThisThread(const char* name) { prctl(PR_SET_NAME, name, 0, 0, 0); }

}  // namespace parascope
