#include "agent/symbolize/elf_cache.h"

#include <sys/stat.h>

#include <algorithm>
#include <utility>

namespace parascope::symbolize {
namespace {

// Accounted size of a negative entry: list node, index slot and the error text, roughly.
constexpr size_t kNegativeEntryBaseBytes = 256;

}  // namespace

ElfCache::ElfCache(size_t max_bytes, size_t max_entries)
    : max_bytes_(max_bytes), max_entries_(std::max<size_t>(max_entries, 1)) {}

absl::StatusOr<std::shared_ptr<const ElfFile>> ElfCache::Get(const std::string& host_path) {
  Entry entry;
  struct stat st;
  if (stat(host_path.c_str(), &st) == 0) {
    entry.key.id = FileId{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)};
    entry.size = static_cast<int64_t>(st.st_size);
    entry.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  } else {
    entry.key.path = host_path;
  }

  {
    std::lock_guard<std::mutex> lock(mu_);
    auto found = index_.find(entry.key);
    if (found != index_.end()) {
      List::iterator it = found->second;
      if (it->size == entry.size && it->mtime_ns == entry.mtime_ns) {
        ++hits_;
        lru_.splice(lru_.begin(), lru_, it);
        if (it->file == nullptr) return it->status;
        return it->file;
      }
      EraseLocked(it);  // stale: the file changed under the same identity
    }
    ++misses_;
  }

  absl::StatusOr<std::unique_ptr<ElfFile>> opened = ElfFile::Open(host_path);
  absl::StatusOr<std::shared_ptr<const ElfFile>> result;
  if (opened.ok()) {
    entry.file = std::shared_ptr<const ElfFile>(std::move(opened).value());
    entry.bytes = entry.file->memory_bytes() + sizeof(Entry) + entry.key.path.capacity();
    result = entry.file;
  } else {
    entry.status = opened.status();
    entry.bytes =
        kNegativeEntryBaseBytes + entry.key.path.capacity() + entry.status.message().size();
    result = entry.status;
  }

  std::lock_guard<std::mutex> lock(mu_);
  if (!opened.ok()) ++errors_;
  InsertLocked(std::move(entry));
  return result;
}

void ElfCache::InsertLocked(Entry entry) {
  auto found = index_.find(entry.key);
  if (found != index_.end()) EraseLocked(found->second);
  bytes_ += entry.bytes;
  lru_.push_front(std::move(entry));
  index_[lru_.front().key] = lru_.begin();
  while (lru_.size() > 1 && (bytes_ > max_bytes_ || lru_.size() > max_entries_)) {
    EraseLocked(std::prev(lru_.end()));
    ++evictions_;
  }
}

void ElfCache::EraseLocked(List::iterator it) {
  bytes_ -= it->bytes;
  index_.erase(it->key);
  lru_.erase(it);
}

uint64_t ElfCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

uint64_t ElfCache::misses() const {
  std::lock_guard<std::mutex> lock(mu_);
  return misses_;
}

uint64_t ElfCache::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

uint64_t ElfCache::evictions() const {
  std::lock_guard<std::mutex> lock(mu_);
  return evictions_;
}

size_t ElfCache::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lru_.size();
}

size_t ElfCache::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace parascope::symbolize
