#include "agent/profile/summary.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_format.h"

namespace parascope {

void ProfileSummary::Add(const ProcessProfile& p) {
  const auto& prof = p.profile;
  Process& proc = processes_[p.process];
  proc.tgid = p.process.tgid;
  if (!p.process_name.empty()) proc.name = p.process_name;
  auto str = [&](int64_t i) -> const std::string& { return prof.string_table(i); };
  absl::flat_hash_map<uint64_t, std::string> loc_name;
  for (const auto& loc : prof.location()) {
    std::string name;
    if (loc.line_size() > 0) {
      const auto& fn = prof.function(loc.line(0).function_id() - 1);
      name = str(fn.name());
    } else {
      name = absl::StrFormat("0x%x", loc.address());
    }
    loc_name[loc.id()] = std::move(name);
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& s : prof.sample()) {
    if (s.value_size() <= value_index_) continue;
    int64_t v = s.value(value_index_);
    proc.total += v;
    total_ += v;
    if (s.location_id_size() == 0) continue;
    proc.self[loc_name[s.location_id(0)]] += v;
    seen.clear();
    for (uint64_t id : s.location_id()) {
      const std::string& n = loc_name[id];
      if (seen.insert(n).second) proc.inclusive[n] += v;
    }
  }
}

void ProfileSummary::Print(std::ostream& os, int max_processes, int max_functions) const {
  std::vector<const Process*> procs;
  for (const auto& [k, p] : processes_) procs.push_back(&p);
  std::sort(procs.begin(), procs.end(),
            [](const Process* a, const Process* b) { return a->total > b->total; });
  if (procs.empty()) {
    os << "no samples\n";
    return;
  }
  for (int i = 0; i < max_processes && i < static_cast<int>(procs.size()); ++i) {
    const Process& p = *procs[i];
    os << absl::StrFormat("\n%-7d %-16s %8.3f s CPU  (%.1f%% of all samples)\n", p.tgid,
                          p.name.empty() ? "?" : p.name, p.total / 1e9,
                          total_ ? 100.0 * p.total / total_ : 0.0);
    os << absl::StrFormat("    %7s %7s  %s\n", "self%", "total%", "function");
    std::vector<std::pair<std::string, int64_t>> fns(p.self.begin(), p.self.end());
    std::sort(fns.begin(), fns.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second > b.second : a.first < b.first;
    });
    for (int j = 0; j < max_functions && j < static_cast<int>(fns.size()); ++j) {
      auto inc = p.inclusive.find(fns[j].first);
      int64_t inclusive = inc == p.inclusive.end() ? 0 : inc->second;
      os << absl::StrFormat("    %6.1f%% %6.1f%%  %s\n", 100.0 * fns[j].second / p.total,
                            100.0 * inclusive / p.total, fns[j].first);
    }
  }
}

}  // namespace parascope
