// Window schedule on the monotonic clock: boundaries at start + k * interval (no drift from the
// time a drain takes), the last window cut short at start + duration.
#pragma once

#include <cstdint>

namespace parascope {

// Pure arithmetic over CLOCK_MONOTONIC nanoseconds; the agent supplies the clock. Not
// thread-safe.
class WindowSchedule {
 public:
  // duration_ns = 0: no end.
  WindowSchedule(int64_t start_ns, int64_t interval_ns, int64_t duration_ns);

  // Monotonic ns at which the current window ends.
  int64_t boundary_ns() const;
  // True when the current window is the last one (its boundary is the end of the run).
  bool final() const;
  // Moves to the next window. `now_ns` is when the previous window was actually closed; if the
  // agent fell behind by more than a whole interval, boundaries that already passed are skipped.
  void Advance(int64_t now_ns);

 private:
  int64_t start_ns_;
  int64_t interval_ns_;
  int64_t end_ns_;  // 0 = none
  int64_t index_ = 1;  // boundary = start + index * interval
};

// CLOCK_MONOTONIC and CLOCK_REALTIME now, in ns.
int64_t MonotonicNowNs();
int64_t RealtimeNowNs();

}  // namespace parascope
