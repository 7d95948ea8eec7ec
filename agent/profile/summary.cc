#include "agent/profile/summary.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace parascope {

void RunSummary::Ranking::Add(const perftools::profiles::Profile& prof, int value_index) {
  auto str = [&](int64_t i) -> const std::string& { return prof.string_table(i); };
  absl::flat_hash_map<uint64_t, std::string> loc_name;
  for (const auto& loc : prof.location()) {
    loc_name[loc.id()] = loc.line_size() > 0
                             ? str(prof.function(loc.line(0).function_id() - 1).name())
                             : absl::StrFormat("0x%x", loc.address());
  }
  absl::flat_hash_set<std::string> seen;
  for (const auto& s : prof.sample()) {
    if (s.value_size() <= value_index) continue;
    int64_t v = s.value(value_index);
    total += v;
    if (s.location_id_size() == 0) continue;
    self[loc_name[s.location_id(0)]] += v;
    seen.clear();
    for (uint64_t id : s.location_id()) {
      const std::string& n = loc_name[id];
      if (seen.insert(n).second) inclusive[n] += v;
    }
  }
}

void RunSummary::Add(const ProcessProfile& p) {
  if (p.type != "process_cpu" && p.type != "latency") return;
  // A cgroup's profiles are reported under a member that may change from window to window.
  const proc::ProcessKey key =
      p.group.kind == ProfileGroup::Kind::kCgroup ? proc::ProcessKey{} : p.process;
  Process& proc = processes_[{key, static_cast<int>(p.group.kind), p.group.id}];
  proc.tgid = p.process.tgid;
  proc.group = p.group;
  if (!p.process_name.empty()) proc.name = p.process_name;
  if (p.group.is_group()) {
    const auto& prof = *p.profile;
    const int value = p.type == "process_cpu" ? 1 : 0;
    auto& by_process = p.type == "process_cpu" ? proc.cpu_by_process : proc.latency_by_process;
    for (const auto& s : prof.sample()) {
      for (const auto& l : s.label()) {
        const std::string& key = prof.string_table(l.key());
        if (key == "pid") proc.pids[static_cast<uint64_t>(l.num())] = true;
        if (key == "process" && s.value_size() > value) {
          by_process[prof.string_table(l.str())] += s.value(value);
        }
      }
    }
    proc.processes = proc.pids.size();
  }
  if (p.type == "process_cpu") {
    int64_t before = proc.cpu.total;
    proc.cpu.Add(*p.profile, 1);
    if (p.group.kind != ProfileGroup::Kind::kCgroup) cpu_total_ += proc.cpu.total - before;
    return;
  }
  proc.latency.Add(*p.profile, 0);
  const auto& prof = *p.profile;
  for (const auto& s : prof.sample()) {
    for (const auto& l : s.label()) {
      if (prof.string_table(l.key()) == "parallelism") {
        proc.parallelism[prof.string_table(l.str())] += s.value(0);
      }
    }
  }
}

namespace {

int BucketOrder(const std::string& b) {
  int lo = 0;
  absl::SimpleAtoi(b.substr(0, b.find_first_of("-+")), &lo);
  return lo;
}

}  // namespace

void RunSummary::Print(std::ostream& os, int max_processes, int max_functions) const {
  std::vector<const Process*> procs;
  for (const auto& [k, p] : processes_) procs.push_back(&p);
  std::sort(procs.begin(), procs.end(),
            [](const Process* a, const Process* b) { return a->cpu.total > b->cpu.total; });
  if (procs.empty()) {
    os << "no samples\n";
    return;
  }
  for (int i = 0; i < max_processes && i < static_cast<int>(procs.size()); ++i) {
    const Process& p = *procs[i];
    if (p.group.kind == ProfileGroup::Kind::kCgroup) {
      os << absl::StrFormat("\ncgroup %s (%d processes) %8.3f s CPU",
                            p.group.cgroup_path.empty() ? absl::StrCat("id ", p.group.id)
                                                        : p.group.cgroup_path,
                            p.processes, p.cpu.total / 1e9);
    } else if (p.group.kind == ProfileGroup::Kind::kTree) {
      os << absl::StrFormat("\n%-7d %-16s and descendants (%d processes) %8.3f s CPU", p.tgid,
                            p.name.empty() ? "?" : p.name, p.processes, p.cpu.total / 1e9);
    } else {
      os << absl::StrFormat("\n%-7d %-16s %8.3f s CPU (%.1f%% of all samples)", p.tgid,
                            p.name.empty() ? "?" : p.name, p.cpu.total / 1e9,
                            cpu_total_ ? 100.0 * p.cpu.total / cpu_total_ : 0.0);
    }
    bool has_latency = p.latency.total > 0;
    if (has_latency) {
      os << absl::StrFormat(", %.3f s busy wall time, mean parallelism %.2f",
                            p.latency.total / 1e9,
                            static_cast<double>(p.cpu.total) / p.latency.total);
    }
    os << "\n";
    // One row per function, CPU and latency side by side, ranked by the larger inclusive share;
    // frames on (nearly) every stack, such as main, say nothing and are left out.
    struct Row {
      std::string name;
      double cpu_self, cpu_total, lat_self, lat_total;
    };
    auto share = [](const absl::flat_hash_map<std::string, int64_t>& m, const std::string& k,
                    int64_t total) {
      auto it = m.find(k);
      return it == m.end() || total <= 0 ? 0.0 : 100.0 * it->second / total;
    };
    std::vector<Row> rows;
    absl::flat_hash_set<std::string> names;
    for (const auto& [n, v] : p.cpu.inclusive) names.insert(n);
    for (const auto& [n, v] : p.latency.inclusive) names.insert(n);
    for (const std::string& n : names) {
      Row r{n, share(p.cpu.self, n, p.cpu.total), share(p.cpu.inclusive, n, p.cpu.total),
            share(p.latency.self, n, p.latency.total),
            share(p.latency.inclusive, n, p.latency.total)};
      bool everywhere = r.cpu_total >= 99.5 && (!has_latency || r.lat_total >= 99.5);
      bool leaf = r.cpu_self > 0 || r.lat_self > 0;
      if (!everywhere || leaf) rows.push_back(r);
    }
    std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) {
      double ka = std::max(a.cpu_total, a.lat_total), kb = std::max(b.cpu_total, b.lat_total);
      return ka != kb ? ka > kb : a.name < b.name;
    });
    if (static_cast<int>(rows.size()) > max_functions) rows.resize(max_functions);
    os << (has_latency ? "      cpu self%  total%   latency self%  total%   function\n"
                       : "      cpu self%  total%   function\n");
    for (const Row& r : rows) {
      std::string name = r.name.size() > 70 ? r.name.substr(0, 69) + "~" : r.name;
      if (has_latency) {
        os << absl::StrFormat("        %6.1f%% %6.1f%%         %6.1f%% %6.1f%%   %s\n",
                              r.cpu_self, r.cpu_total, r.lat_self, r.lat_total, name);
      } else {
        os << absl::StrFormat("        %6.1f%% %6.1f%%   %s\n", r.cpu_self, r.cpu_total, name);
      }
    }
    if (has_latency && !p.parallelism.empty()) {
      std::vector<std::pair<std::string, int64_t>> buckets(p.parallelism.begin(),
                                                           p.parallelism.end());
      std::sort(buckets.begin(), buckets.end(), [](const auto& a, const auto& b) {
        return BucketOrder(a.first) < BucketOrder(b.first);
      });
      os << "    parallelism (share of busy wall time):";
      for (const auto& [bucket, ns] : buckets) {
        os << absl::StrFormat("  %s: %.1f%%", bucket, 100.0 * ns / p.latency.total);
      }
      os << "\n";
    }
    if (p.group.is_group() && !p.cpu_by_process.empty()) {
      // Which of the group's programs the CPU and the waiting went to, the larger share first.
      std::vector<std::pair<std::string, double>> names;
      auto share_of = [](const std::map<std::string, int64_t>& m, const std::string& k,
                         int64_t total) {
        auto it = m.find(k);
        return it == m.end() || total <= 0 ? 0.0 : 100.0 * it->second / total;
      };
      for (const auto& [name, ns] : p.cpu_by_process) {
        names.push_back({name, std::max(share_of(p.cpu_by_process, name, p.cpu.total),
                                        share_of(p.latency_by_process, name, p.latency.total))});
      }
      std::sort(names.begin(), names.end(), [](const auto& a, const auto& b) {
        return a.second != b.second ? a.second > b.second : a.first < b.first;
      });
      os << (has_latency ? "    by process (cpu% / latency%):" : "    by process (cpu%):");
      for (size_t j = 0; j < names.size() && j < 6; ++j) {
        const std::string& n = names[j].first;
        if (has_latency) {
          os << absl::StrFormat("  %s %.1f/%.1f", n, share_of(p.cpu_by_process, n, p.cpu.total),
                                share_of(p.latency_by_process, n, p.latency.total));
        } else {
          os << absl::StrFormat("  %s %.1f", n, share_of(p.cpu_by_process, n, p.cpu.total));
        }
      }
      os << "\n";
    }
  }
}

}  // namespace parascope
