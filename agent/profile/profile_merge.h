// Merges the profiles of several process images (one window, one profile type) into one pprof
// Profile (proto/profile.proto), so that many short-lived processes can share a file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "proto/profile.pb.h"

namespace parascope {

// Deduplicates as pprof's own merge does (github.com/google/pprof, profile/merge.go): strings,
// Functions (same name, system name, file and start line), Mappings and Locations. Two Mappings
// are one when they map the same file (filename and build id) at the same file offset with the
// same size; a Location of a later one has its address moved into the first one's range
// (address - memory_start + first memory_start), so `address - memory_start + file_offset`, the
// file offset pprof symbolizes by, is unchanged. A PIE binary run by many processes at random
// bases then takes one Mapping and one Location per distinct pc, not one per process.
//
// Each sample is copied with its values and labels, preceded by two labels naming its process:
// `pid` (numeric, the tgid) and `process` (its comm), the labels the profiles of a parallelism
// group carry (profile_set.h ProfileGroup), so `pprof -tagfocus=pid=N` gives one process back.
// Samples are not combined: two processes with one stack keep a sample each.
//
// Scalars (time, duration, period, sample types) are the first profile's; comments are those
// every merged profile had (e.g. the event and frequency), then one saying how many process
// images were merged. Not thread-safe.
class ProfileMerger {
 public:
  // Adds one process image's profile. InvalidArgument (nothing added) when its sample types
  // differ from the first profile's.
  absl::Status Add(const perftools::profiles::Profile& profile, uint32_t pid,
                   absl::string_view comm);
  // Samples and profiles merged so far.
  size_t samples() const { return out_.sample_size(); }
  // Estimated heap bytes of the merged profile so far (protobuf objects: samples with their
  // location ids, values and labels; locations with their lines; functions, mappings and
  // strings; plus the dedup tables): what a caller bounds the merge's memory by.
  size_t approx_bytes() const { return approx_bytes_; }
  size_t profiles() const { return profiles_; }
  bool empty() const { return profiles_ == 0; }
  // The merged profile; `note` is added as the last comment (after the count). Resets the merger.
  perftools::profiles::Profile Take(absl::string_view note = "");

 private:
  int64_t Str(absl::string_view s);

  perftools::profiles::Profile out_;
  size_t profiles_ = 0;
  size_t approx_bytes_ = 0;
  std::vector<std::string> common_comments_;
  absl::flat_hash_map<std::string, int64_t> strings_;
  // (name, system_name, filename, start_line) -> Function id.
  absl::flat_hash_map<std::tuple<int64_t, int64_t, int64_t, int64_t>, uint64_t> functions_;
  // (filename, build id, file offset, size, has_* bits) -> index into out_.mapping.
  absl::flat_hash_map<std::tuple<int64_t, int64_t, uint64_t, uint64_t, uint32_t>, int> mappings_;
  // (mapping id, address, is_folded, then function id, line and column of each Line) ->
  // Location id.
  absl::flat_hash_map<std::vector<int64_t>, uint64_t> locations_;
  std::vector<int64_t> key_scratch_;
};

}  // namespace parascope
