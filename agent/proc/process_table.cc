#include "agent/proc/process_table.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/util/status.h"

namespace parascope::proc {

const MapEntry* ProcessInfo::FindMapping(uint64_t addr) const {
  // First mapping starting after addr; the candidate is the one before it.
  auto it = std::upper_bound(maps.begin(), maps.end(), addr,
                             [](uint64_t a, const MapEntry& m) { return a < m.start; });
  if (it == maps.begin()) return nullptr;
  --it;
  return addr < it->end ? &*it : nullptr;
}

ProcessTable::ProcessTable(std::string proc_root, size_t max_processes)
    : proc_root_(std::move(proc_root)), max_processes_(std::max<size_t>(max_processes, 1)) {}

std::string ProcessTable::ProcDir(uint32_t tgid) const {
  return absl::StrCat(proc_root_, "/", tgid);
}

absl::StatusOr<ProcStat> ProcessTable::ReadStat(const ProcessKey& key) const {
  std::string path = ProcDir(key.tgid) + "/stat";
  PS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  PS_ASSIGN_OR_RETURN(ProcStat stat, ParseStat(text));
  uint64_t want = BootNsToTicks(key.start_boot_ns);
  uint64_t have = stat.start_time_ticks;
  uint64_t diff = want > have ? want - have : have - want;
  if (diff > 1) {
    return absl::NotFoundError(
        absl::StrCat(path, ": start time ", have, " ticks, expected ", want, " (pid reused)"));
  }
  return stat;
}

absl::StatusOr<std::vector<MapEntry>> ProcessTable::ReadMaps(const ProcessKey& key) const {
  PS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(ProcDir(key.tgid) + "/maps"));
  PS_ASSIGN_OR_RETURN(std::vector<MapEntry> maps, ParseMaps(text));
  std::sort(maps.begin(), maps.end(),
            [](const MapEntry& a, const MapEntry& b) { return a.start < b.start; });
  PS_RETURN_IF_ERROR(ReadStat(key).status());
  return maps;
}

absl::StatusOr<std::unique_ptr<ProcessTable::Entry>> ProcessTable::Load(
    const ProcessKey& key) const {
  std::string dir = ProcDir(key.tgid);
  PS_ASSIGN_OR_RETURN(ProcStat stat, ReadStat(key));

  auto entry = std::make_unique<Entry>();
  ProcessInfo& info = entry->info;
  info.key = key;
  absl::StatusOr<std::string> comm = ReadFileToString(dir + "/comm");
  if (comm.ok()) {
    info.comm = *std::move(comm);
    if (!info.comm.empty() && info.comm.back() == '\n') info.comm.pop_back();
  } else {
    info.comm = stat.comm;
  }
  absl::StatusOr<std::string> exe = ReadLink(dir + "/exe");
  if (exe.ok()) info.exe_path = *std::move(exe);
  PS_ASSIGN_OR_RETURN(info.maps, ReadMaps(key));
  entry->maps_read_window = window_;
  return entry;
}

void ProcessTable::CountError(const absl::Status& status) {
  if (absl::IsNotFound(status)) {
    ++vanished_;
  } else {
    ++read_errors_;
  }
}

absl::StatusOr<ProcessTable::Entry*> ProcessTable::GetEntry(const ProcessKey& key) {
  Entry* entry = nullptr;
  if (auto it = entries_.find(key); it != entries_.end()) {
    entry = it->second.get();
  } else {
    if (auto f = failed_.find(key); f != failed_.end()) return f->second;
    absl::StatusOr<std::unique_ptr<Entry>> loaded = Load(key);
    if (!loaded.ok()) {
      CountError(loaded.status());
      if (failed_.size() >= max_processes_) failed_.clear();
      failed_.emplace(key, loaded.status());
      return loaded.status();
    }
    MakeRoom();
    entry = loaded->get();
    entries_.emplace(key, *std::move(loaded));
  }
  entry->last_used_window = window_;
  entry->last_used_seq = ++use_seq_;
  return entry;
}

absl::StatusOr<const ProcessInfo*> ProcessTable::Get(const ProcessKey& key) {
  PS_ASSIGN_OR_RETURN(Entry * entry, GetEntry(key));
  return &entry->info;
}

const MapEntry* ProcessTable::FindMapping(const ProcessKey& key, uint64_t addr) {
  absl::StatusOr<Entry*> entry = GetEntry(key);
  if (!entry.ok()) return nullptr;
  ProcessInfo& info = (*entry)->info;
  if (const MapEntry* m = info.FindMapping(addr)) return m;
  if ((*entry)->maps_read_window == window_) return nullptr;
  (*entry)->maps_read_window = window_;
  absl::StatusOr<std::vector<MapEntry>> maps = ReadMaps(key);
  if (!maps.ok()) {
    CountError(maps.status());  // keep the old maps: earlier samples may still need them
    return nullptr;
  }
  info.maps = *std::move(maps);
  return info.FindMapping(addr);
}

void ProcessTable::EndWindow() {
  absl::erase_if(entries_,
                 [this](const auto& kv) { return kv.second->last_used_window != window_; });
  failed_.clear();
  ++window_;
}

void ProcessTable::MakeRoom() {
  if (entries_.size() < max_processes_) return;
  // Entries idle this window would be forgotten at EndWindow anyway.
  absl::erase_if(entries_,
                 [this](const auto& kv) { return kv.second->last_used_window != window_; });
  if (entries_.size() < max_processes_) return;
  // All were used this window: evict the least recently used 1/16 (at least one), so that the
  // O(n) selection runs once per many insertions.
  std::vector<std::pair<uint64_t, ProcessKey>> by_use;
  by_use.reserve(entries_.size());
  for (const auto& [key, entry] : entries_) by_use.emplace_back(entry->last_used_seq, key);
  size_t n = std::max<size_t>(1, entries_.size() - max_processes_ + 1 + max_processes_ / 16);
  n = std::min(n, by_use.size());
  std::nth_element(by_use.begin(), by_use.begin() + (n - 1), by_use.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (size_t i = 0; i < n; ++i) entries_.erase(by_use[i].second);
}

std::string ProcessTable::HostPath(const ProcessKey& key, const MapEntry& m) const {
  if (!m.file_backed()) return "";
  if (m.deleted) {
    return absl::StrFormat("%s/map_files/%x-%x", ProcDir(key.tgid), m.start, m.end);
  }
  return absl::StrCat(ProcDir(key.tgid), "/root", m.path);
}

}  // namespace parascope::proc
