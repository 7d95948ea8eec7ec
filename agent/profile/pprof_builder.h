// Builds one pprof Profile (proto/profile.proto, SPEC section 6) with interning and dedup.
#pragma once

#include <google/protobuf/arena.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "proto/profile.pb.h"

namespace parascope {

// pprof sample type: strings for ValueType{type, unit}, e.g. {"cpu", "nanoseconds"}.
struct ValueTypeSpec {
  std::string type;
  std::string unit;
};

// A sample label: string (`str`) or numeric (`num` with optional `num_unit`).
struct LabelSpec {
  std::string key;
  std::string str;
  int64_t num = 0;
  std::string num_unit;
  bool is_num = false;

  static LabelSpec Str(std::string key, std::string value) {
    return LabelSpec{std::move(key), std::move(value), 0, "", false};
  }
  static LabelSpec Num(std::string key, int64_t value, std::string unit = "") {
    return LabelSpec{std::move(key), "", value, std::move(unit), true};
  }
};

// What a Mapping says (addresses are the process's virtual addresses, file_offset in bytes).
struct MappingSpec {
  uint64_t memory_start = 0;
  uint64_t memory_limit = 0;
  uint64_t file_offset = 0;
  std::string filename;
  std::string build_id;  // lowercase hex, "" if unknown
  bool has_functions = false;
};

// One Line of a Location: a function and its names.
struct FunctionSpec {
  std::string name;         // demangled
  std::string system_name;  // as in the symbol table
  std::string filename;     // source file, "" if unknown
};

// One Line of a Location (profile.proto Line): a function id from AddFunction and a source line
// (0 = unknown).
struct LineRef {
  uint64_t function_id = 0;
  int64_t line = 0;
};

// A protobuf arena (google/protobuf/arena.h) for the profiles a ProfileSet builds until its next
// Finish (one process's, or a group's): its blocks are anonymous mmaps of
// kProfileArenaBlockBytes (pages become resident as they are written), so that freeing the
// arena returns those profiles' memory whole. Built in malloc's heap, a window's many small
// objects (Samples, Labels, Locations, the builders' dedup keys) left pages half-used between
// the long-lived allocations made meanwhile (symbol caches, ELF files), which stayed resident
// after the window. (Strings longer than the small-string buffer keep their characters on the
// heap: the arena holds only their std::string.) Throws std::bad_alloc when mmap fails, as
// operator new does. Freed blocks are kept (at most kProfileArenaCachedBlocks) for the next
// arena until ReleaseProfileArenaBlocks. Thread-safe.
inline constexpr size_t kProfileArenaBlockBytes = size_t{1} << 20;
inline constexpr size_t kProfileArenaCachedBlocks = 4;
std::shared_ptr<google::protobuf::Arena> NewProfileArena();
// Unmaps the blocks kept for the next arena: at the end of a window, so that RSS between windows
// holds none of them.
void ReleaseProfileArenaBlocks();
// How many freed blocks are kept for the next arena (<= kProfileArenaCachedBlocks).
size_t CachedProfileArenaBlocks();

// Accumulates samples of one profile. Strings, Mappings, Functions and Locations are interned
// (ids are 1-based and dense, string 0 is ""); samples with identical location lists and labels
// are merged by adding values. The Profile and the dedup tables' keys live on an arena (shared
// with the other builders of a window, or the builder's own). Not thread-safe.
class PprofBuilder {
 public:
  // sample_types in index order; period_type / period as in SPEC section 2 (period_type.type ""
  // = no period type). `arena`: where the Profile and keys live (null: a new one of this
  // builder's, NewProfileArena); the built Profile keeps it alive.
  PprofBuilder(std::vector<ValueTypeSpec> sample_types, ValueTypeSpec period_type, int64_t period,
               std::shared_ptr<google::protobuf::Arena> arena = nullptr);
  PprofBuilder(PprofBuilder&&) = default;
  PprofBuilder& operator=(PprofBuilder&&) = default;

  int64_t InternString(absl::string_view s);
  // Dedups on all fields. Returns the mapping id (>= 1).
  uint64_t AddMapping(const MappingSpec& m);
  uint64_t AddFunction(const FunctionSpec& f);
  // A Location at `address` in `mapping_id` (0 = none) whose lines are `function_ids`, innermost
  // first (empty = unsymbolized). Dedups on (mapping_id, address, function_ids).
  uint64_t AddLocation(uint64_t mapping_id, uint64_t address,
                       absl::Span<const uint64_t> function_ids);
  // The same with line numbers: `lines` innermost first, the last one the function the others
  // were inlined into (profile.proto, Location.line).
  uint64_t AddLocationLines(uint64_t mapping_id, uint64_t address,
                            absl::Span<const LineRef> lines);
  // A synthetic frame such as "[unknown]" or "[truncated]": a Location without mapping whose one
  // Function is `name`.
  uint64_t AddSyntheticLocation(absl::string_view name);
  // Adds `values` (one per sample type) to the sample with these locations (leaf first) and labels.
  void AddSample(absl::Span<const uint64_t> location_ids, absl::Span<const int64_t> values,
                 absl::Span<const LabelSpec> labels);
  void AddComment(absl::string_view comment);

  // A copy of this builder (its Strings, Mappings, Functions, Locations, samples and location
  // memo) that describes a different profile type: same number of sample types, new names, new
  // period. Cheaper than symbolizing the same stacks again (the wall profile starts as a copy of
  // the off_cpu one). The old type names stay in the string table, unreferenced. The copy is on
  // the same arena.
  PprofBuilder ForkAs(const std::vector<ValueTypeSpec>& sample_types,
                      const ValueTypeSpec& period_type, int64_t period) const;

  // A memo for callers that map raw frames to Locations (the symbolizer): `key` identifies a
  // frame (e.g. address and kind), the value is the Location id made for it in this profile.
  // Lets repeated addresses skip symbolization. 0 = not remembered.
  uint64_t RememberedLocation(uint64_t address, uint32_t kind) const {
    auto it = frame_memo_.find({address, kind});
    return it == frame_memo_.end() ? 0 : it->second;
  }
  void RememberLocation(uint64_t address, uint32_t kind, uint64_t location_id) {
    if (frame_memo_.emplace(std::make_pair(address, kind), location_id).second) {
      approx_bytes_ += 40;
    }
  }

  size_t sample_count() const { return profile_->sample_size(); }
  // Estimated bytes of the profile so far (protobuf objects and the dedup tables, counted
  // as ProfileMerger::approx_bytes counts them): what a caller bounds a large profile's memory by.
  size_t approx_bytes() const { return approx_bytes_; }
  // Sum over samples of value[index].
  int64_t ValueSum(size_t index) const;

  // Finishes the profile: time_nanos (unix ns of the window start), duration_nanos (window ns).
  // The Profile lives on the builder's arena, which the returned pointer keeps alive. The
  // builder must not be used afterwards.
  std::shared_ptr<perftools::profiles::Profile> Build(int64_t time_nanos,
                                                      int64_t duration_nanos) &&;

 private:
  // Deep copy on the same arena (ForkAs).
  PprofBuilder(const PprofBuilder& other);

  // Keys are views of arena copies (ArenaCopy); a lookup builds its key in scratch memory.
  struct LocationKey {
    uint64_t mapping_id;
    uint64_t address;
    absl::Span<const uint64_t> function_ids;
    bool operator==(const LocationKey& o) const {
      return mapping_id == o.mapping_id && address == o.address && function_ids == o.function_ids;
    }
    template <typename H>
    friend H AbslHashValue(H h, const LocationKey& k) {
      return H::combine(
          H::combine_contiguous(std::move(h), k.function_ids.data(), k.function_ids.size()),
          k.mapping_id, k.address, k.function_ids.size());
    }
  };
  absl::string_view ArenaCopy(absl::string_view s);
  absl::Span<const uint64_t> ArenaCopy(absl::Span<const uint64_t> ids);
  uint64_t InsertLocation(const LocationKey& key);

  std::shared_ptr<google::protobuf::Arena> arena_;
  perftools::profiles::Profile* profile_;  // on arena_
  size_t num_values_;
  absl::flat_hash_map<absl::string_view, int64_t> strings_;
  absl::flat_hash_map<absl::string_view, uint64_t> mappings_;   // key: encoded MappingSpec
  absl::flat_hash_map<absl::string_view, uint64_t> functions_;  // key: encoded FunctionSpec
  absl::flat_hash_map<LocationKey, uint64_t> locations_;
  absl::flat_hash_map<absl::string_view, int> samples_;  // key: encoded locations + labels
  absl::flat_hash_map<std::pair<uint64_t, uint32_t>, uint64_t> frame_memo_;
  std::vector<uint64_t> key_scratch_;
  std::string sample_key_scratch_;
  size_t approx_bytes_ = 0;
};

// gzip level of profiles that are compressed: libdeflate's 2 (libdeflate.h: 1 fastest .. 12).
constexpr int kGzipLevel = 2;
// Bytes a stored (level 0) gzip adds to its content when that is under 64 KiB: the member
// header (10) and trailer (8), one stored block's header (5) (RFC 1952 section 2.3, RFC 1951
// section 3.2.4).
constexpr size_t kGzipStoredOverhead = 23;

// Serializes and gzips a profile (the pprof on-disk and on-wire form). A profile whose stored
// gzip fits in `store_within` bytes is stored, not compressed: a file exporter passes its
// filesystem's block size, where compressing a file of one block saves no space. 0 compresses
// everything. Errors: those of Gzip, and Internal when protobuf cannot serialize.
absl::StatusOr<std::string> SerializeGzip(const perftools::profiles::Profile& profile,
                                          size_t store_within = 0);
// gzip (RFC 1952, one member) of `raw`, by libdeflate at `level`: 0 (stored) or kGzipLevel.
// Errors: InvalidArgument for another level; ResourceExhausted when the per-thread compressor
// cannot be allocated.
absl::StatusOr<std::string> Gzip(absl::string_view raw, int level = kGzipLevel);
// Gunzips (if gzip magic present) and parses. Errors: InvalidArgument for corrupt input.
absl::StatusOr<perftools::profiles::Profile> ParseMaybeGzip(absl::string_view data);

}  // namespace parascope
