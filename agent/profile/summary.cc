#include "agent/profile/summary.h"

#include <algorithm>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
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
  Process& proc = processes_[p.process];
  proc.tgid = p.process.tgid;
  if (!p.process_name.empty()) proc.name = p.process_name;
  if (p.type == "process_cpu") {
    int64_t before = proc.cpu.total;
    proc.cpu.Add(p.profile, 1);
    cpu_total_ += proc.cpu.total - before;
    return;
  }
  proc.latency.Add(p.profile, 0);
  const auto& prof = p.profile;
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
    os << absl::StrFormat("\n%-7d %-16s %8.3f s CPU (%.1f%% of all samples)", p.tgid,
                          p.name.empty() ? "?" : p.name, p.cpu.total / 1e9,
                          cpu_total_ ? 100.0 * p.cpu.total / cpu_total_ : 0.0);
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
  }
}

}  // namespace parascope
