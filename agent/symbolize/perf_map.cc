#include "agent/symbolize/perf_map.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/proc/read_file.h"
#include "agent/util/hash_map.h"
#include "agent/util/status.h"

namespace parascope::symbolize {
namespace {

bool ParseHex(absl::string_view s, uint64_t* out) {
  if (absl::StartsWith(s, "0x") || absl::StartsWith(s, "0X")) s.remove_prefix(2);
  if (s.empty() || s.size() > 16) return false;
  uint64_t v = 0;
  for (char c : s) {
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else {
      return false;
    }
    v = (v << 4) | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

// Splits off the next token delimited by spaces or tabs.
absl::string_view NextToken(absl::string_view* line) {
  size_t b = 0;
  while (b < line->size() && ((*line)[b] == ' ' || (*line)[b] == '\t')) ++b;
  size_t e = b;
  while (e < line->size() && (*line)[e] != ' ' && (*line)[e] != '\t') ++e;
  absl::string_view tok = line->substr(b, e - b);
  line->remove_prefix(e);
  return tok;
}

}  // namespace

size_t ParsePerfMapLines(absl::string_view text, std::vector<PerfMapSymbol>* out,
                         PerfMapParseStats* stats) {
  size_t consumed = 0;
  while (consumed < text.size()) {
    size_t nl = text.find('\n', consumed);
    if (nl == absl::string_view::npos) break;  // half-written: next time
    absl::string_view line = text.substr(consumed, nl - consumed);
    consumed = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    absl::string_view rest = line;
    uint64_t start = 0, size = 0;
    if (!ParseHex(NextToken(&rest), &start) || !ParseHex(NextToken(&rest), &size) || size == 0 ||
        start + size < start) {
      ++stats->invalid;
      continue;
    }
    // The name is the rest after one separator, spaces inside kept.
    if (!rest.empty() && (rest.front() == ' ' || rest.front() == '\t')) rest.remove_prefix(1);
    PerfMapSymbol sym{start, size, std::string(rest)};
    if (sym.name.empty()) sym.name = absl::StrCat("[jit 0x", absl::Hex(start), "]");
    out->push_back(std::move(sym));
    ++stats->symbols;
  }
  return consumed;
}

PerfMap::PerfMap(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

PerfMap::~PerfMap() {
  if (fd_ >= 0) close(fd_);
}

absl::Status PerfMap::Refresh(size_t max_bytes) {
  if (truncated_) return absl::OkStatus();
  std::string buf;
  char chunk[65536];
  for (;;) {
    if (offset_ + buf.size() >= max_bytes) {
      truncated_ = true;
      break;
    }
    const size_t room = std::min(sizeof(chunk), max_bytes - (offset_ + buf.size()));
    ssize_t n = pread(fd_, chunk, room, static_cast<off_t>(offset_ + buf.size()));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "reading a perf map");
    }
    if (n == 0) break;
    buf.append(chunk, static_cast<size_t>(n));
  }
  if (buf.empty()) return absl::OkStatus();
  const size_t before = symbols_.size();
  offset_ += ParsePerfMapLines(buf, &symbols_, &stats_);
  for (size_t i = before; i < symbols_.size(); ++i) {
    memory_bytes_ += sizeof(PerfMapSymbol) + sizeof(uint32_t) + symbols_[i].name.capacity();
  }
  if (symbols_.size() != before) dirty_ = true;
  return absl::OkStatus();
}

void PerfMap::Index() {
  by_start_.resize(symbols_.size());
  for (uint32_t i = 0; i < by_start_.size(); ++i) by_start_[i] = i;
  std::stable_sort(by_start_.begin(), by_start_.end(), [this](uint32_t a, uint32_t b) {
    return symbols_[a].start < symbols_[b].start;
  });
  dirty_ = false;
}

const PerfMapSymbol* PerfMap::Lookup(uint64_t addr) {
  if (dirty_) Index();
  // The last symbol starting at or before addr; code replaced at the same start is later in the
  // order. Overlapping older symbols that start earlier are checked a few steps back.
  auto it = std::upper_bound(by_start_.begin(), by_start_.end(), addr,
                             [this](uint64_t a, uint32_t i) { return a < symbols_[i].start; });
  const PerfMapSymbol* best = nullptr;
  uint32_t best_index = 0;
  for (int steps = 0; it != by_start_.begin() && steps < 8; ++steps) {
    --it;
    const PerfMapSymbol& s = symbols_[*it];
    if (addr - s.start < s.size && (best == nullptr || *it > best_index)) {
      best = &s;
      best_index = *it;
    }
  }
  return best;
}

PerfMaps::PerfMaps(proc::ProcessTable* processes, size_t max_bytes)
    : processes_(processes), max_bytes_(max_bytes) {}

std::unique_ptr<PerfMap> PerfMaps::Open(const proc::ProcessKey& key) const {
  std::string seen;
  std::shared_ptr<const proc::PinnedFile> f = processes_->PerfMapFile(key, &seen);
  if (f == nullptr) return nullptr;
  int fd = dup(f->fd());  // the PerfMap reads with pread: no shared offset to disturb
  if (fd < 0) return nullptr;
  return std::make_unique<PerfMap>(fd, std::move(seen));
}

const PerfMapSymbol* PerfMaps::Lookup(const proc::ProcessKey& key, uint64_t addr,
                                      std::string* map_path) {
  auto [it, inserted] = maps_.try_emplace(key);
  Entry& e = it->second;
  e.last_used_window = window_;
  e.last_used_seq = ++seq_;
  if (e.window_refreshed != window_) {
    e.window_refreshed = window_;
    if (e.map == nullptr) e.map = Open(key);
    if (e.map != nullptr) {
      (void)e.map->Refresh(max_bytes_);
      invalid_lines_ += e.map->stats().invalid - e.invalid_seen;
      e.invalid_seen = e.map->stats().invalid;
      Evict();
      it = maps_.find(key);
      if (it == maps_.end()) return nullptr;
    }
  }
  PerfMap* map = it->second.map.get();
  if (map == nullptr) return nullptr;
  if (map_path != nullptr) *map_path = map->path();
  return map->Lookup(addr);
}

size_t PerfMaps::memory_bytes() const {
  size_t n = 0;
  for (const auto& [k, e] : maps_) n += e.map == nullptr ? 0 : e.map->memory_bytes();
  return n;
}

void PerfMaps::Evict() {
  size_t total = memory_bytes();
  while (total > max_bytes_ && maps_.size() > 1) {
    auto victim = maps_.end();
    for (auto it = maps_.begin(); it != maps_.end(); ++it) {
      if (it->second.map == nullptr) continue;
      if (victim == maps_.end() || it->second.last_used_seq < victim->second.last_used_seq) {
        victim = it;
      }
    }
    if (victim == maps_.end() || victim->second.last_used_seq == seq_) break;
    total -= victim->second.map->memory_bytes();
    maps_.erase(victim);
  }
}

void PerfMaps::EndWindow() {
  // Entries not used this window go, and so do the negative ones (no perf map): a negative entry
  // is looked up again in its next window anyway (window_refreshed), so keeping it saves
  // nothing. Under process churn they were thousands of processes whose frames had no mapping
  // (exited before their maps were read), and their table, 1 MB, outlived the window.
  absl::erase_if(maps_, [this](const auto& kv) {
    return kv.second.map == nullptr || kv.second.last_used_window != window_;
  });
  ShrinkIfSparse(maps_);
  ++window_;
}

}  // namespace parascope::symbolize
