// Where finished profiles go. The file exporter writes them locally; the Pyroscope push exporter
// (a later issue) implements the same interface.
#pragma once

#include "absl/status/status.h"
#include "agent/profile/profile_set.h"

namespace parascope {

class Exporter {
 public:
  virtual ~Exporter() = default;
  // Delivers one finished profile (or queues it). Errors are for the caller to count and log;
  // the profile is not retried by the caller.
  virtual absl::Status Export(const ProcessProfile& profile) = 0;
};

}  // namespace parascope
