#include "agent/collect/records.h"

namespace parascope {

const char* ThreadStateName(uint32_t state) {
  switch (static_cast<ThreadState>(state)) {
    case ThreadState::kRunning:
      return "running";
    case ThreadState::kRunnable:
      return "runnable";
    case ThreadState::kSleeping:
      return "sleeping";
    case ThreadState::kUninterruptible:
      return "uninterruptible";
  }
  return "unknown";
}

}  // namespace parascope
