#include "agent/collect/window_clock.h"

#include <time.h>

#include <algorithm>

namespace parascope {

WindowSchedule::WindowSchedule(int64_t start_ns, int64_t interval_ns, int64_t duration_ns)
    : start_ns_(start_ns),
      interval_ns_(interval_ns),
      end_ns_(duration_ns > 0 ? start_ns + duration_ns : 0) {}

int64_t WindowSchedule::boundary_ns() const {
  int64_t b = start_ns_ + index_ * interval_ns_;
  return end_ns_ ? std::min(b, end_ns_) : b;
}

bool WindowSchedule::final() const { return end_ns_ && boundary_ns() >= end_ns_; }

void WindowSchedule::Advance(int64_t now_ns) {
  ++index_;
  while (start_ns_ + index_ * interval_ns_ <= now_ns) ++index_;
}

static int64_t Now(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t{ts.tv_sec} * 1000000000 + ts.tv_nsec;
}

int64_t MonotonicNowNs() { return Now(CLOCK_MONOTONIC); }
int64_t RealtimeNowNs() { return Now(CLOCK_REALTIME); }

}  // namespace parascope
