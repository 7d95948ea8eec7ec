// Assembles one window's per-process profiles (SPEC section 2) from drained records:
// `process_cpu`, `off_cpu`, `wall` and `latency`.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "agent/collect/records.h"
#include "agent/profile/pprof_builder.h"
#include "agent/symbolize/stack_symbolizer.h"
#include "proto/profile.pb.h"

namespace parascope {

// The profile types of SPEC section 2, in a fixed order.
enum class ProfileType { kCpu = 0, kOffCpu = 1, kWall = 2, kLatency = 3 };
inline constexpr int kNumProfileTypes = 4;
// SPEC `__name__`: "process_cpu", "off_cpu", "wall", "latency".
const char* ProfileTypeName(ProfileType t);

// Which types to build. Parsed from --profiles ("cpu,off_cpu,wall,latency").
struct ProfileTypes {
  std::array<bool, kNumProfileTypes> enabled{true, true, true, true};
  bool has(ProfileType t) const { return enabled[static_cast<int>(t)]; }
  // Needs sched_switch tracing (parallelism and/or off-CPU intervals).
  bool needs_sched() const { return has(ProfileType::kOffCpu) || has(ProfileType::kWall) ||
                                    has(ProfileType::kLatency); }
  bool needs_offcpu() const { return has(ProfileType::kOffCpu) || has(ProfileType::kWall); }
};
// Accepts names "cpu" (or "process_cpu"), "off_cpu", "wall", "latency", comma-separated.
// InvalidArgument naming the bad item; an empty list is an error.
absl::StatusOr<ProfileTypes> ParseProfileTypes(absl::string_view list);

// "1".."8", "9-16", "17-32", "33-64", "65+" (SPEC section 2, label `parallelism`).
std::string ParallelismBucket(uint32_t k);

// A parallelism group whose profiles hold the samples of several processes (SPEC section 2,
// --latency-group=cgroup|tree). Each sample of a group's profile carries the label `process` (the
// comm of its process) and, with thread labels, `pid` (numeric), so the processes can still be
// told apart.
//
// kOverflow: the process images a file exporter merges into DIR/overflow/ (export/
// file_exporter.h, "Process churn"), built into one profile per type instead of one per image
// and merged after. Its samples always carry `pid` (thread labels or not), as ProfileMerger's
// do, and a Mapping of a file that several images map at different addresses (a PIE program,
// a library under ASLR) is one Mapping, at the first image's address, as ProfileMerger makes it.
struct ProfileGroup {
  enum class Kind : uint8_t { kNone = 0, kCgroup = 1, kTree = 2, kOverflow = 3 };
  Kind kind = Kind::kNone;
  uint64_t id = 0;          // kCgroup: the cgroup v2 id (its directory's inode); kTree: root tgid
  std::string cgroup_path;  // kCgroup: its path below the cgroup2 mount, "" if unknown
  // What parallelism was counted over (--latency-group): "tree", "cgroup" or "process" (a
  // command mode tree whose latency is counted per process); named in the profiles' comment.
  std::string latency_group;

  bool is_group() const { return kind != Kind::kNone; }
};

// Where a record's samples go: the profiles of `process` (group kind kNone, the default), or a
// group's profiles, reported under `process`: the tree's root, or a member of the cgroup (whose
// series labels the group's pushed profiles take).
struct ProfileOwner {
  proc::ProcessKey process;
  ProfileGroup group;
};

// A finished profile of one process (or group, `group`) for one window.
struct ProcessProfile {
  proc::ProcessKey process;
  std::string process_name;  // comm of the process, "" if it could not be read
  std::string type;          // SPEC `__name__`, e.g. "process_cpu"
  // Not null (until moved from). From ProfileSet::Finish it lives on the arena of that Finish
  // (NewProfileArena), which this pointer keeps alive: the arena is freed with the last of its
  // profiles. A copy of a ProcessProfile shares the Profile.
  std::shared_ptr<perftools::profiles::Profile> profile =
      std::make_shared<perftools::profiles::Profile>();
  ProfileGroup group;        // kind kNone: the profile of `process` alone
  // A group's process images with samples in this profile (0 for a process's own profile).
  size_t group_processes = 0;
};

struct ProfileOptions {
  // P of SPEC section 2: round(1e9 / frequency) ns.
  int64_t period_ns = 0;
  // True when the perf event counts time in ns (cpu-clock): then a sample's cpu value is its
  // actual period (ps_oncpu_value.period_sum); otherwise (cycles) count * period_ns.
  bool period_is_ns = true;
  // Added to each profile as a comment, e.g. "parascope: event=cpu-clock frequency=499Hz".
  std::string description;
  // Add `thread_name` (string) and `tid` (numeric) sample labels (local files; SPEC section 3).
  bool thread_labels = true;
  // Added to off_cpu and wall profiles as a comment when off-CPU stacks are sampled.
  std::string offcpu_description;
  ProfileTypes types;
};

// Counters (monotonic), exported as metrics.
struct ProfileStats {
  uint64_t samples = 0;               // on-CPU samples placed in profiles
  uint64_t samples_parallelism_unknown = 0;
  uint64_t offcpu_ns = 0;             // off-CPU ns placed in profiles
  uint64_t user_stack_lost = 0;       // samples/intervals whose user stack was lost ([unknown])
  uint64_t kernel_stack_lost = 0;
  uint64_t truncated = 0;             // stacks that hit PS_MAX_STACK_DEPTH ([truncated])
  uint64_t user_stack_incomplete = 0; // user stacks the walker stopped early ([incomplete: ...])
  uint64_t sampled_cpu_ns = 0;        // sum of cpu values in process_cpu
  uint64_t exact_cpu_ns = 0;          // sum of on-CPU ns from sched_switch accounting

  // The counters of two sets that built disjoint records (a window's processes and its
  // overflow group).
  ProfileStats& operator+=(const ProfileStats& o) {
    samples += o.samples;
    samples_parallelism_unknown += o.samples_parallelism_unknown;
    offcpu_ns += o.offcpu_ns;
    user_stack_lost += o.user_stack_lost;
    kernel_stack_lost += o.kernel_stack_lost;
    truncated += o.truncated;
    user_stack_incomplete += o.user_stack_incomplete;
    sampled_cpu_ns += o.sampled_cpu_ns;
    exact_cpu_ns += o.exact_cpu_ns;
    return *this;
  }
};

// Collects records of one window into PprofBuilders per process and type. Not thread-safe.
class ProfileSet {
 public:
  ProfileSet(ProfileOptions options, StackSymbolizer* symbolizer, proc::ProcessTable* processes);

  // cpu (1 sample, P ns), wall (P ns, state=running), latency (P/k ns, parallelism=k). `owner`:
  // where the samples go (null: the record's process).
  void AddOnCpu(const OnCpuRecord& record, const ProfileOwner* owner = nullptr);
  // off_cpu and wall: ns with state.
  void AddOffCpu(const OffCpuRecord& record, const ProfileOwner* owner = nullptr);
  // Exact on-CPU time of a process, shown in its process_cpu comment against the sampled total.
  void AddRuntime(const RuntimeRecord& record, const ProfileOwner* owner = nullptr);
  // Builds every process's profiles for the window [t0_unix_ns, t0_unix_ns + duration_ns) and
  // resets the set for the next window.
  std::vector<ProcessProfile> Finish(int64_t t0_unix_ns, int64_t duration_ns);

  const ProfileStats& stats() const { return stats_; }
  // Estimated heap bytes of the largest profile being built (PprofBuilder::approx_bytes): what a
  // caller that builds many processes into one group bounds its memory by (about this much per
  // profile type), finishing early.
  size_t approx_bytes() const;
  // Drops the memo of symbolized user frames (keyed by process; Finish drops it too): for a
  // caller that adds many processes to one group, after each, since a process's frames are
  // not looked up again and the memo holds the symbolizer's mapping and line data alive.
  void ForgetFrames();

 private:
  struct PerProcess {
    std::array<std::unique_ptr<PprofBuilder>, kNumProfileTypes> builders;
    std::string name;
    uint64_t exact_ns = 0;
    uint64_t sampled_ns = 0;
    uint64_t parallelism_unknown = 0;
    bool has_samples = false;
    ProfileGroup group;
    // A group's member processes: their comm (label `process`) and a slot that keeps their
    // user addresses apart in the builders' frame memo (two programs, one address).
    struct Member {
      uint32_t slot = 0;
      std::string name;
      uint8_t types = 0;  // bit t: has samples in the profile of ProfileType t
    };
    absl::flat_hash_map<proc::ProcessKey, Member> members;
    // kOverflow: the first image's start address of each file mapping (filename, build id,
    // file offset and size encoded), where the others' addresses are moved.
    absl::flat_hash_map<std::string, uint64_t> mapping_starts;
  };
  struct OwnerKey {
    proc::ProcessKey process;
    ProfileGroup::Kind kind = ProfileGroup::Kind::kNone;
    uint64_t id = 0;
    friend bool operator==(const OwnerKey&, const OwnerKey&) = default;
    template <typename H>
    friend H AbslHashValue(H h, const OwnerKey& k) {
      return H::combine(std::move(h), k.process, static_cast<uint8_t>(k.kind), k.id);
    }
  };
  // The owner's entry (the record's process when owner is null).
  PerProcess& ForOwner(const proc::ProcessKey& record_process, const ProfileOwner* owner,
                       uint32_t tid, const std::string& comm);
  // The member entry of `process` in group entry `pp`.
  PerProcess::Member& MemberOf(PerProcess& pp, const proc::ProcessKey& process, uint32_t tid,
                               const std::string& comm);
  // Thread labels, preceded for a group by `process` (and `pid`). `member`: the process's member
  // entry in a group (valid until the next insertion), else null.
  std::vector<LabelSpec> SampleLabels(PerProcess& pp, const proc::ProcessKey& process,
                                      const std::string& thread_name, uint32_t tid,
                                      uint32_t* memo_salt, PerProcess::Member** member);
  PprofBuilder* Builder(PerProcess& pp, ProfileType t);
  // Makes pp's wall builder a copy of its off_cpu builder if it has the latter and not the former.
  void ForkWall(PerProcess& pp);
  // Location ids of a stack in `b`, with synthetic frames for lost/truncated stacks.
  // `memo_salt` tells the processes of a group apart in the frame memo (0 for a process).
  // `starts`: a kOverflow group's PerProcess::mapping_starts, else null.
  void Locations(PprofBuilder& b, const proc::ProcessKey& process, const StackPair& stacks,
                 uint32_t memo_salt, absl::flat_hash_map<std::string, uint64_t>* starts,
                 std::vector<uint64_t>* out);
  // Appends the Location ids of `ips` (leaf first; kernel or user addresses of `process`).
  void AppendFrames(PprofBuilder& b, const proc::ProcessKey& process,
                    absl::Span<const uint64_t> ips, bool kernel, uint32_t memo_salt,
                    absl::flat_hash_map<std::string, uint64_t>* starts, std::vector<uint64_t>* out);
  // The Location (with its Mapping and Functions) of a symbolized frame in `b`; with `starts`,
  // its Mapping and address moved to the first image's start of the same file mapping.
  uint64_t LocationOf(PprofBuilder& b, const symbolize::Frame& frame,
                      absl::flat_hash_map<std::string, uint64_t>* starts);
  // Stack-quality counters, once per record (not once per profile type).
  void CountStackQuality(const StackPair& stacks, uint64_t weight);
  std::vector<LabelSpec> ThreadLabels(const std::string& thread_name, uint32_t tid) const;

  ProfileOptions options_;
  StackSymbolizer* symbolizer_;
  proc::ProcessTable* processes_;
  ProfileStats stats_;
  absl::flat_hash_map<OwnerKey, PerProcess> per_process_;
  // The profiles being built and their builders' keys (NewProfileArena): made by the first
  // builder after a Finish, handed to the profiles by the next Finish.
  std::shared_ptr<google::protobuf::Arena> arena_;
  // Symbolized user frames of the processes being built, by (process, address, leaf): an
  // address symbolized for one profile type is not symbolized again for the others (an on-CPU
  // stack goes to up to three). Cleared by Finish; at most kMaxFrameMemo entries. (Kernel frames
  // have the symbolizer's own memo.)
  static constexpr size_t kMaxFrameMemo = 1 << 16;
  absl::flat_hash_map<std::tuple<proc::ProcessKey, uint64_t, bool>, symbolize::Frame>
      frame_memo_;
  std::vector<uint64_t> scratch_;
  std::vector<LineRef> lines_scratch_;
};

}  // namespace parascope
