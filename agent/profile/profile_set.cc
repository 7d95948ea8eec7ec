#include "agent/profile/profile_set.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "bpf/abi.h"

namespace parascope {

const char* ProfileTypeName(ProfileType t) {
  switch (t) {
    case ProfileType::kCpu:
      return "process_cpu";
    case ProfileType::kOffCpu:
      return "off_cpu";
    case ProfileType::kWall:
      return "wall";
    case ProfileType::kLatency:
      return "latency";
  }
  return "?";
}

absl::StatusOr<ProfileTypes> ParseProfileTypes(absl::string_view list) {
  ProfileTypes out;
  out.enabled.fill(false);
  bool any = false;
  for (absl::string_view item : absl::StrSplit(list, ',', absl::SkipWhitespace())) {
    item = absl::StripAsciiWhitespace(item);
    if (item == "cpu" || item == "process_cpu") {
      out.enabled[0] = true;
    } else if (item == "off_cpu") {
      out.enabled[1] = true;
    } else if (item == "wall") {
      out.enabled[2] = true;
    } else if (item == "latency") {
      out.enabled[3] = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown profile type '", item, "' (expected cpu, off_cpu, wall, latency)"));
    }
    any = true;
  }
  if (!any) return absl::InvalidArgumentError("no profile type given");
  return out;
}

std::string ParallelismBucket(uint32_t k) {
  if (k <= 8) return absl::StrCat(k < 1 ? 1 : k);
  if (k <= 16) return "9-16";
  if (k <= 32) return "17-32";
  if (k <= 64) return "33-64";
  return "65+";
}

ProfileSet::ProfileSet(ProfileOptions options, StackSymbolizer* symbolizer,
                       proc::ProcessTable* processes)
    : options_(std::move(options)), symbolizer_(symbolizer), processes_(processes) {}

ProfileSet::PerProcess& ProfileSet::ForOwner(const proc::ProcessKey& record_process,
                                             const ProfileOwner* owner, uint32_t tid,
                                             const std::string& comm) {
  OwnerKey key;
  key.process = owner != nullptr ? owner->process : record_process;
  if (owner != nullptr) {
    key.kind = owner->group.kind;
    key.id = owner->group.id;
  }
  auto [it, inserted] = per_process_.try_emplace(key);
  if (inserted) {
    if (owner != nullptr) it->second.group = owner->group;
    if (key.kind == ProfileGroup::Kind::kCgroup) {
      it->second.name = owner->group.cgroup_path;  // a cgroup is named by its path
    } else if (key.kind == ProfileGroup::Kind::kOverflow) {
      // Many processes: each sample names its own (label `process`).
    } else if (auto info = processes_->Get(key.process); info.ok()) {
      it->second.name = (*info)->comm;
    } else if (tid == key.process.tgid && key.process == record_process) {
      it->second.name = comm;  // exited: the main thread's comm is the best we have
    }
  }
  return it->second;
}

ProfileSet::PerProcess::Member& ProfileSet::MemberOf(PerProcess& pp,
                                                     const proc::ProcessKey& process, uint32_t tid,
                                                     const std::string& comm) {
  auto [it, inserted] = pp.members.try_emplace(process);
  if (inserted) {
    it->second.slot = static_cast<uint32_t>(pp.members.size());
    auto info = processes_->Get(process);
    if (info.ok()) {
      it->second.name = (*info)->comm;
    } else if (pp.group.kind != ProfileGroup::Kind::kOverflow || tid == process.tgid) {
      // Exited: a thread's comm is the best we have (for the overflow group, as for a process's
      // own profiles, only the main thread's: ProcessProfile::process_name, which the merge
      // of those labels samples with).
      it->second.name = comm;
    }
  }
  return it->second;
}

std::vector<LabelSpec> ProfileSet::SampleLabels(PerProcess& pp, const proc::ProcessKey& process,
                                                const std::string& thread_name, uint32_t tid,
                                                uint32_t* memo_salt, PerProcess::Member** member) {
  std::vector<LabelSpec> labels;
  *memo_salt = 0;
  *member = nullptr;
  if (pp.group.is_group()) {
    PerProcess::Member& m = MemberOf(pp, process, tid, thread_name);
    *memo_salt = m.slot;
    *member = &m;
    labels.push_back(LabelSpec::Str("process", m.name));
    if (options_.thread_labels || pp.group.kind == ProfileGroup::Kind::kOverflow) {
      labels.push_back(LabelSpec::Num("pid", process.tgid));
    }
  }
  std::vector<LabelSpec> thread = ThreadLabels(thread_name, tid);
  labels.insert(labels.end(), thread.begin(), thread.end());
  return labels;
}

PprofBuilder* ProfileSet::Builder(PerProcess& pp, ProfileType t) {
  if (!options_.types.has(t)) return nullptr;
  auto& b = pp.builders[static_cast<int>(t)];
  if (b == nullptr) {
    if (arena_ == nullptr) arena_ = NewProfileArena();
    const int64_t p = options_.period_ns;
    switch (t) {
      case ProfileType::kCpu:
        b = std::make_unique<PprofBuilder>(
            std::vector<ValueTypeSpec>{{"samples", "count"}, {"cpu", "nanoseconds"}},
            ValueTypeSpec{"cpu", "nanoseconds"}, p, arena_);
        break;
      case ProfileType::kOffCpu:
        b = std::make_unique<PprofBuilder>(std::vector<ValueTypeSpec>{{"off_cpu", "nanoseconds"}},
                                           ValueTypeSpec{}, 0, arena_);
        break;
      case ProfileType::kWall:
        b = std::make_unique<PprofBuilder>(std::vector<ValueTypeSpec>{{"wall", "nanoseconds"}},
                                           ValueTypeSpec{"wall", "nanoseconds"}, p, arena_);
        break;
      case ProfileType::kLatency:
        b = std::make_unique<PprofBuilder>(std::vector<ValueTypeSpec>{{"latency", "nanoseconds"}},
                                           ValueTypeSpec{"cpu", "nanoseconds"}, p, arena_);
        break;
    }
  }
  return b.get();
}

namespace {
// A user stack the walker cut at PS_MAX_STACK_DEPTH with frames left, or a kernel-only stack
// that filled bpf_get_stack()'s buffer.
bool Truncated(const StackPair& s) {
  if (s.user_stack_err != 0) return false;
  if (!s.user_ips.empty()) return s.user_unwind == PS_UNWIND_TRUNCATED;
  return s.kernel_ips.size() >= PS_MAX_STACK_DEPTH;
}

// The synthetic root of a user stack the walker stopped early (bpf/abi.h PS_UNWIND_*), or
// nullptr for a complete or truncated one.
const char* IncompleteFrame(const StackPair& s) {
  if (s.user_stack_err != 0 || s.user_ips.empty()) return nullptr;
  switch (s.user_unwind) {
    case PS_UNWIND_NO_TABLE_YET:
      return "[incomplete: unwind table not loaded yet]";
    case PS_UNWIND_NO_TABLE_PC:
      return "[incomplete: no unwind info]";
    case PS_UNWIND_READ_FAULT:
      return "[incomplete: stack unreadable]";
    case PS_UNWIND_BAD_FRAME:
      return "[incomplete: bad frame]";
    default:
      return nullptr;
  }
}
}  // namespace

void ProfileSet::CountStackQuality(const StackPair& s, uint64_t weight) {
  if (s.kernel_stack_err != 0 && s.kernel_stack_err != PS_ERR_NOT_CAPTURED) {
    stats_.kernel_stack_lost += weight;
  }
  if (s.user_stack_err != 0 && s.user_stack_err != PS_ERR_ASLEEP_AT_ATTACH &&
      s.user_stack_err != PS_ERR_NOT_CAPTURED) {
    stats_.user_stack_lost += weight;
  }
  if (Truncated(s)) stats_.truncated += weight;
  if (IncompleteFrame(s) != nullptr) stats_.user_stack_incomplete += weight;
}

uint64_t ProfileSet::LocationOf(PprofBuilder& b, const symbolize::Frame& f,
                                absl::flat_hash_map<std::string, uint64_t>* starts) {
  uint64_t mapping_id = 0;
  uint64_t address = f.address;
  if (f.mapping != nullptr) {
    const symbolize::FrameMapping& m = *f.mapping;
    uint64_t start = m.start;
    if (starts != nullptr) {
      // One file mapping of many images: the first image's start, and this address moved by
      // as much, so address - start + file_offset (what pprof symbolizes by) is unchanged.
      auto [it, inserted] =
          starts->try_emplace(absl::StrCat(m.filename, "\x1f", m.build_id, "\x1f", m.file_offset,
                                           "\x1f", m.limit - m.start, "\x1f", m.has_functions),
                              m.start);
      start = it->second;
      address = address - m.start + start;
    }
    mapping_id = b.AddMapping({start, start + (m.limit - m.start), m.file_offset, m.filename,
                               m.build_id, m.has_functions});
  }
  lines_scratch_.clear();
  if (f.lines != nullptr) {
    for (const symbolize::FrameLine& l : *f.lines) {
      lines_scratch_.push_back({b.AddFunction({l.name, l.system_name, l.file}), l.line});
    }
  }
  return b.AddLocationLines(mapping_id, address, lines_scratch_);
}

void ProfileSet::AppendFrames(PprofBuilder& b, const proc::ProcessKey& process,
                              absl::Span<const uint64_t> ips, bool kernel, uint32_t memo_salt,
                              absl::flat_hash_map<std::string, uint64_t>* starts,
                              std::vector<uint64_t>* out) {
  for (size_t i = 0; i < ips.size(); ++i) {
    const bool leaf = i == 0;
    // Leaf frames are symbolized at ip, callers at ip - 1: one address, two possible lines. A
    // user address means something else in each process of a group (the kernel's do not).
    const uint32_t kind = (kernel ? 2 : 0) + (leaf ? 0 : 1) + (kernel ? 0 : memo_salt << 2);
    // A builder holds one process's profile: an address it has seen needs no new lookup.
    uint64_t loc = b.RememberedLocation(ips[i], kind);
    if (loc == 0) {
      if (kernel) {
        loc = LocationOf(b, symbolizer_->KernelFrame(ips[i], leaf), nullptr);
      } else {
        auto key = std::make_tuple(process, ips[i], leaf);
        auto it = frame_memo_.find(key);
        if (it == frame_memo_.end()) {
          if (frame_memo_.size() >= kMaxFrameMemo) frame_memo_.clear();
          it = frame_memo_.emplace(key, symbolizer_->UserFrame(process, ips[i], leaf)).first;
        }
        loc = LocationOf(b, it->second, starts);
      }
      b.RememberLocation(ips[i], kind, loc);
    }
    out->push_back(loc);
  }
}

void ProfileSet::Locations(PprofBuilder& b, const proc::ProcessKey& process, const StackPair& s,
                           uint32_t memo_salt, absl::flat_hash_map<std::string, uint64_t>* starts,
                           std::vector<uint64_t>* out) {
  out->clear();
  AppendFrames(b, process, s.kernel_ips, /*kernel=*/true, 0, nullptr, out);
  if (s.kernel_stack_err == PS_ERR_NOT_CAPTURED) {
    out->push_back(b.AddSyntheticLocation("[kernel stack not captured]"));
  } else if (s.kernel_stack_err != 0) {
    out->push_back(b.AddSyntheticLocation("[unknown kernel]"));
  }
  AppendFrames(b, process, s.user_ips, /*kernel=*/false, memo_salt, starts, out);
  if (s.user_stack_err == PS_ERR_ASLEEP_AT_ATTACH) {
    out->push_back(b.AddSyntheticLocation("[unknown: asleep since before attach]"));
  } else if (s.user_stack_err == PS_ERR_NOT_CAPTURED) {
    out->push_back(b.AddSyntheticLocation("[user stack not captured]"));
  } else if (s.user_stack_err != 0) {
    out->push_back(b.AddSyntheticLocation("[unknown]"));
  } else if (Truncated(s)) {
    out->push_back(b.AddSyntheticLocation("[truncated]"));
  } else if (const char* why = IncompleteFrame(s)) {
    out->push_back(b.AddSyntheticLocation(why));
  }
  if (out->empty()) out->push_back(b.AddSyntheticLocation("[unknown]"));
}

std::vector<LabelSpec> ProfileSet::ThreadLabels(const std::string& thread_name,
                                                uint32_t tid) const {
  if (!options_.thread_labels) return {};
  return {LabelSpec::Str("thread_name", thread_name), LabelSpec::Num("tid", tid)};
}

void ProfileSet::ForkWall(PerProcess& pp) {
  auto& wall = pp.builders[static_cast<int>(ProfileType::kWall)];
  const auto& off = pp.builders[static_cast<int>(ProfileType::kOffCpu)];
  if (wall != nullptr || off == nullptr || !options_.types.has(ProfileType::kWall)) return;
  wall = std::make_unique<PprofBuilder>(off->ForkAs({{"wall", "nanoseconds"}},
                                                    {"wall", "nanoseconds"}, options_.period_ns));
}

void ProfileSet::AddOnCpu(const OnCpuRecord& r, const ProfileOwner* owner) {
  PerProcess& pp = ForOwner(r.process, owner, r.tid, r.thread_name);
  ForkWall(pp);
  pp.has_samples = true;
  const int64_t cpu_ns = options_.period_is_ns ? static_cast<int64_t>(r.period_sum)
                                               : static_cast<int64_t>(r.count) * options_.period_ns;
  pp.sampled_ns += cpu_ns;
  stats_.samples += r.count;
  stats_.sampled_cpu_ns += cpu_ns;
  if (r.parallelism_unknown) {
    pp.parallelism_unknown += r.count;
    stats_.samples_parallelism_unknown += r.count;
  }
  CountStackQuality(r.stacks, r.count);
  uint32_t salt = 0;
  PerProcess::Member* member = nullptr;
  std::vector<LabelSpec> thread = SampleLabels(pp, r.process, r.thread_name, r.tid, &salt, &member);
  auto* starts = pp.group.kind == ProfileGroup::Kind::kOverflow ? &pp.mapping_starts : nullptr;
  for (ProfileType t : {ProfileType::kCpu, ProfileType::kWall, ProfileType::kLatency}) {
    PprofBuilder* b = Builder(pp, t);
    if (b == nullptr) continue;
    if (member != nullptr) member->types |= 1u << static_cast<int>(t);
    Locations(*b, r.process, r.stacks, salt, starts, &scratch_);
    std::vector<LabelSpec> labels;
    if (t == ProfileType::kCpu) {
      int64_t values[2] = {static_cast<int64_t>(r.count), cpu_ns};
      b->AddSample(scratch_, values, thread);
    } else if (t == ProfileType::kWall) {
      labels.push_back(LabelSpec::Str("state", "running"));
      labels.insert(labels.end(), thread.begin(), thread.end());
      int64_t values[1] = {cpu_ns};
      b->AddSample(scratch_, values, labels);
    } else {
      labels.push_back(LabelSpec::Str("parallelism", ParallelismBucket(r.parallelism)));
      labels.insert(labels.end(), thread.begin(), thread.end());
      int64_t values[1] = {cpu_ns / static_cast<int64_t>(std::max<uint32_t>(r.parallelism, 1))};
      b->AddSample(scratch_, values, labels);
    }
  }
}

void ProfileSet::AddOffCpu(const OffCpuRecord& record, const ProfileOwner* owner) {
  if (record.ns == 0) return;
  // Switch-out stacks are captured inside the sched_switch program: drop its own frames.
  OffCpuRecord trimmed;
  const OffCpuRecord* rp = &record;
  if (size_t skip = symbolizer_->TracingPrefixLength(record.stacks.kernel_ips); skip > 0) {
    trimmed = record;
    trimmed.stacks.kernel_ips.erase(trimmed.stacks.kernel_ips.begin(),
                                    trimmed.stacks.kernel_ips.begin() + skip);
    rp = &trimmed;
  }
  const OffCpuRecord& r = *rp;
  PerProcess& pp = ForOwner(r.process, owner, r.tid, r.thread_name);
  stats_.offcpu_ns += r.ns;
  std::vector<LabelSpec> labels = {LabelSpec::Str("state", ThreadStateName(r.state))};
  uint32_t salt = 0;
  PerProcess::Member* member = nullptr;
  std::vector<LabelSpec> thread = SampleLabels(pp, r.process, r.thread_name, r.tid, &salt, &member);
  labels.insert(labels.end(), thread.begin(), thread.end());
  int64_t values[1] = {static_cast<int64_t>(r.ns)};
  CountStackQuality(r.stacks, r.count);
  auto* starts = pp.group.kind == ProfileGroup::Kind::kOverflow ? &pp.mapping_starts : nullptr;
  for (ProfileType t : {ProfileType::kOffCpu, ProfileType::kWall}) {
    if (member != nullptr && options_.types.has(t)) member->types |= 1u << static_cast<int>(t);
    // While the process has an off_cpu profile and no wall one yet, the wall profile is made
    // later as a copy of the off_cpu one (ForkWall): its off-CPU samples are the same.
    if (t == ProfileType::kWall && pp.builders[static_cast<int>(ProfileType::kWall)] == nullptr &&
        pp.builders[static_cast<int>(ProfileType::kOffCpu)] != nullptr) {
      continue;
    }
    PprofBuilder* b = Builder(pp, t);
    if (b == nullptr) continue;
    Locations(*b, r.process, r.stacks, salt, starts, &scratch_);
    b->AddSample(scratch_, values, labels);
  }
}

void ProfileSet::AddRuntime(const RuntimeRecord& r, const ProfileOwner* owner) {
  OwnerKey key;
  key.process = owner != nullptr ? owner->process : r.process;
  if (owner != nullptr) {
    key.kind = owner->group.kind;
    key.id = owner->group.id;
  }
  auto it = per_process_.find(key);
  stats_.exact_cpu_ns += r.ns;
  if (it == per_process_.end()) {
    // A process that ran but was not sampled this window: still worth its exact time, but only
    // in the metric; no profile is made for it.
    return;
  }
  it->second.exact_ns += r.ns;
}

size_t ProfileSet::approx_bytes() const {
  size_t bytes = 0;
  for (const auto& [key, pp] : per_process_) {
    for (const auto& b : pp.builders) {
      if (b != nullptr) bytes = std::max(bytes, b->approx_bytes());
    }
  }
  return bytes;
}

void ProfileSet::ForgetFrames() { frame_memo_.clear(); }

std::vector<ProcessProfile> ProfileSet::Finish(int64_t t0_unix_ns, int64_t duration_ns) {
  std::vector<ProcessProfile> out;
  for (auto& [key, pp] : per_process_) {
    ForkWall(pp);
    std::array<size_t, kNumProfileTypes> processes{};  // a group's members in each type
    for (const auto& [process, m] : pp.members) {
      for (int i = 0; i < kNumProfileTypes; ++i) processes[i] += (m.types >> i) & 1;
    }
    for (int i = 0; i < kNumProfileTypes; ++i) {
      auto& b = pp.builders[i];
      if (b == nullptr) continue;
      auto type = static_cast<ProfileType>(i);
      if (!options_.description.empty()) b->AddComment(options_.description);
      if ((type == ProfileType::kOffCpu || type == ProfileType::kWall) &&
          !options_.offcpu_description.empty()) {
        b->AddComment(options_.offcpu_description);
      }
      // Per-process figures: a group of unrelated images (kOverflow) has none, as a merge of
      // their profiles keeps none (ProfileMerger keeps the comments all of them had).
      const bool overflow = pp.group.kind == ProfileGroup::Kind::kOverflow;
      if (type == ProfileType::kCpu && pp.exact_ns > 0 && !overflow) {
        b->AddComment(absl::StrFormat(
            "on-CPU time: sampled %d ns, exact from sched_switch %d ns (ratio %.3f)",
            pp.sampled_ns, pp.exact_ns, static_cast<double>(pp.sampled_ns) / pp.exact_ns));
      }
      if (type == ProfileType::kLatency && pp.parallelism_unknown > 0 && !overflow) {
        b->AddComment(absl::StrFormat(
            "%d samples were taken before every CPU's task was known (agent attached mid-run): "
            "their parallelism may be undercounted",
            pp.parallelism_unknown));
      }
      if (pp.group.kind == ProfileGroup::Kind::kCgroup) {
        b->AddComment(absl::StrCat("parascope: parallelism counted over cgroup ",
                                   pp.group.cgroup_path.empty() ? absl::StrCat("id ", pp.group.id)
                                                                : pp.group.cgroup_path,
                                   " (--latency-group=cgroup)"));
      } else if (pp.group.kind == ProfileGroup::Kind::kOverflow) {
        b->AddComment(absl::StrCat("parascope: the profiles of ", processes[i],
                                   " process images merged; each sample's labels pid and "
                                   "process name its process"));
      } else if (pp.group.kind == ProfileGroup::Kind::kTree) {
        const std::string& over = pp.group.latency_group.empty() ? std::string("tree")
                                                                 : pp.group.latency_group;
        b->AddComment(absl::StrCat(
            "parascope: the processes of the tree of pid ", pp.group.id,
            over == "tree" ? ", parallelism counted over the tree"
                           : absl::StrCat(", parallelism counted per ", over),
            " (--latency-group=", over, ")"));
      }
      out.push_back(ProcessProfile{key.process, pp.name, ProfileTypeName(type),
                                   std::move(*b).Build(t0_unix_ns, duration_ns), pp.group,
                                   processes[i]});
    }
  }
  per_process_.clear();
  frame_memo_.clear();
  arena_ = nullptr;  // freed with the last of `out`
  return out;
}

}  // namespace parascope
