// Keeps pushed profiles inside a Pyroscope server's default limits (SPEC section 6): at most
// 16000 samples and an uncompressed profile under 2 MiB (the default ingestion burst). A profile
// over either limit would be rejected whole; folding its smallest samples into one `[other]`
// frame keeps every total and the big stacks instead.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "proto/profile.pb.h"

namespace parascope {

// SPEC section 6: "<= 16000 samples".
inline constexpr size_t kServerMaxSamples = 16000;
// SPEC section 6: "uncompressed profile < 2 MiB"; ~95% of it, so the request around the
// profile and rounding in the server's accounting stay below the burst too.
inline constexpr size_t kServerMaxProfileBytes = 2000000;
// Folded samples keep their sample labels (state, parallelism) in one `[other]` sample per label
// set while there are at most this many distinct sets (and at most half of max_samples); beyond,
// one unlabeled `[other]` sample.
inline constexpr size_t kMaxOtherLabelSets = 64;

// If `profile` has more than `max_samples` samples or serializes to more than `max_bytes`,
// replaces its smallest samples by `[other]` samples (a synthetic Location without mapping whose
// one Function is "[other]") holding their summed values, so every value column's total is
// unchanged, then removes Locations, Functions, Mappings and strings nothing refers to any more
// and adds a comment saying how many samples were folded. Samples are ranked by the value of the
// default sample type (`default_sample_type`, else the last sample type, as pprof does); ties
// keep the earlier sample. Folds as few samples as it can find that satisfy both limits (the
// byte size is re-measured after each attempt). Returns the number of samples folded (0 when the
// profile was already within the limits and is left untouched). `max_samples` below 2 is
// treated as 2 (one kept sample and `[other]`). If even folding every sample cannot meet
// `max_bytes` (a huge string table of comments), the fully folded profile is the result.
size_t TrimForServerLimits(perftools::profiles::Profile* profile, size_t max_samples,
                           size_t max_bytes);

// SPEC section 3: Pyroscope turns every string sample label into a series label, so pushed
// profiles keep only low-cardinality ones. Removes every sample label whose key is not in
// `keep` (e.g. `thread_name`, numeric `tid`), merges samples that become identical (same
// locations and remaining labels; values added, first occurrence's position kept), and drops
// strings nothing refers to any more. Returns the number of labels removed (0: the profile is
// untouched).
size_t KeepSampleLabels(perftools::profiles::Profile* profile,
                        const std::vector<std::string>& keep);

}  // namespace parascope
