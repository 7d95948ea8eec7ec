// Writes profiles as gzip pprof files: DIR/<pid>/<type>-<t0 unix ms>.pb.gz (SPEC section 5).
#pragma once

#include <string>

#include "absl/container/flat_hash_set.h"

#include "agent/export/exporter.h"

namespace parascope {

// Each file is written to a temporary name and renamed into place, so readers never see a
// partial profile. Thread-compatible.
class FileExporter : public Exporter {
 public:
  explicit FileExporter(std::string dir) : dir_(std::move(dir)) {}

  // Errors: the errno of mkdir/open/write/rename as a status naming the path.
  absl::Status Export(const ProcessProfile& profile) override;

  // The path a profile is written to.
  std::string PathFor(const ProcessProfile& profile) const;

 private:
  std::string dir_;
  // Directories known to exist (cleared when it grows past 65536 entries).
  absl::flat_hash_set<std::string> made_dirs_;
};

}  // namespace parascope
