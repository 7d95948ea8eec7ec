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

std::vector<std::pair<std::string, int64_t>> Top(
    const absl::flat_hash_map<std::string, int64_t>& m, int n) {
  std::vector<std::pair<std::string, int64_t>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) {
    return a.second != b.second ? a.second > b.second : a.first < b.first;
  });
  if (static_cast<int>(v.size()) > n) v.resize(n);
  return v;
}

std::string Cell(const std::vector<std::pair<std::string, int64_t>>& top, size_t i,
                 const absl::flat_hash_map<std::string, int64_t>& inclusive, int64_t total,
                 size_t width) {
  if (i >= top.size() || total <= 0) return std::string(width, ' ');
  auto inc = inclusive.find(top[i].first);
  std::string name = top[i].first;
  size_t name_width = width - 16;
  if (name.size() > name_width) name = name.substr(0, name_width - 1) + "~";
  return absl::StrFormat("%6.1f%% %6.1f%%  %-*s", 100.0 * top[i].second / total,
                         100.0 * (inc == inclusive.end() ? 0 : inc->second) / total,
                         static_cast<int>(name_width), name);
}

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
  constexpr size_t kWidth = 48;
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
    auto cpu_top = Top(p.cpu.self, max_functions);
    auto lat_top = Top(p.latency.self, max_functions);
    os << absl::StrFormat("    %-*s", static_cast<int>(kWidth), "CPU: self% total% function");
    if (has_latency) os << "  | latency: self% total% function";
    os << "\n";
    size_t rows = std::max(cpu_top.size(), has_latency ? lat_top.size() : 0);
    for (size_t r = 0; r < rows; ++r) {
      os << "    " << Cell(cpu_top, r, p.cpu.inclusive, p.cpu.total, kWidth);
      if (has_latency) {
        os << "  | " << Cell(lat_top, r, p.latency.inclusive, p.latency.total, kWidth);
      }
      os << "\n";
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
