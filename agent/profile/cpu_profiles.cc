#include "agent/profile/cpu_profiles.h"

#include "absl/strings/str_cat.h"
#include "bpf/abi.h"

namespace parascope {

CpuProfileSet::CpuProfileSet(CpuProfileOptions options, StackSymbolizer* symbolizer,
                             proc::ProcessTable* processes)
    : options_(std::move(options)), symbolizer_(symbolizer), processes_(processes) {}

CpuProfileSet::PerProcess& CpuProfileSet::ForProcess(const OnCpuRecord& record) {
  auto [it, inserted] = per_process_.try_emplace(record.process);
  if (inserted) {
    it->second.builder = std::make_unique<PprofBuilder>(
        std::vector<ValueTypeSpec>{{"samples", "count"}, {"cpu", "nanoseconds"}},
        ValueTypeSpec{"cpu", "nanoseconds"}, options_.period_ns);
    auto info = processes_->Get(record.process);
    if (info.ok()) {
      it->second.name = (*info)->comm;
    } else if (record.tid == record.process.tgid) {
      it->second.name = record.thread_name;  // exited: the main thread's comm is the best we have
    }
  }
  return it->second;
}

void CpuProfileSet::Add(const OnCpuRecord& r) {
  PerProcess& pp = ForProcess(r);
  PprofBuilder& b = *pp.builder;
  scratch_.clear();
  symbolizer_->AddKernelFrames(b, r.kernel_ips, &scratch_);
  if (r.kernel_stack_err != 0) {
    stats_.kernel_stack_lost += r.count;
    scratch_.push_back(b.AddSyntheticLocation("[unknown kernel]"));
  }
  symbolizer_->AddUserFrames(b, r.process, r.user_ips, &scratch_);
  if (r.user_stack_err != 0) {
    stats_.user_stack_lost += r.count;
    scratch_.push_back(b.AddSyntheticLocation("[unknown]"));
  } else if (r.user_ips.size() >= PS_MAX_STACK_DEPTH ||
             (r.user_ips.empty() && r.kernel_ips.size() >= PS_MAX_STACK_DEPTH)) {
    stats_.truncated += r.count;
    scratch_.push_back(b.AddSyntheticLocation("[truncated]"));
  }
  if (scratch_.empty()) scratch_.push_back(b.AddSyntheticLocation("[unknown]"));

  int64_t cpu_ns = options_.period_is_ns ? static_cast<int64_t>(r.period_sum)
                                         : static_cast<int64_t>(r.count) * options_.period_ns;
  int64_t values[2] = {static_cast<int64_t>(r.count), cpu_ns};
  if (options_.thread_labels) {
    LabelSpec labels[2] = {LabelSpec::Str("thread_name", r.thread_name),
                           LabelSpec::Num("tid", r.tid)};
    b.AddSample(scratch_, values, labels);
  } else {
    b.AddSample(scratch_, values, {});
  }
  stats_.samples += r.count;
}

std::vector<ProcessProfile> CpuProfileSet::Finish(int64_t t0_unix_ns, int64_t duration_ns) {
  std::vector<ProcessProfile> out;
  out.reserve(per_process_.size());
  for (auto& [key, pp] : per_process_) {
    if (!options_.description.empty()) pp.builder->AddComment(options_.description);
    out.push_back(ProcessProfile{key, pp.name, kType,
                                 std::move(*pp.builder).Build(t0_unix_ns, duration_ns)});
  }
  per_process_.clear();
  return out;
}

}  // namespace parascope
