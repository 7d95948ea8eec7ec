#include "agent/bpf/map_reader.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "agent/util/log.h"

namespace parascope {
namespace {

// Keys of a map with no concurrent writer (a closed buffer), via get_next_key.
template <typename K>
std::vector<K> AllKeys(int fd) {
  std::vector<K> keys;
  K key{}, next{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(fd, prev, &next) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }
  return keys;
}

template <typename K>
void DeleteAll(int fd, const std::vector<K>& keys) {
  for (const K& k : keys) bpf_map_delete_elem(fd, &k);
}

// Reads and deletes every entry of a hash map nobody writes any more (the drained buffer), calling
// fn(key, value) for each. Uses BPF_MAP_LOOKUP_AND_DELETE_BATCH (Linux 5.6; bpf(2),
// kernel/bpf/hashtab.c __htab_map_lookup_and_delete_batch): one system call per few hundred
// entries instead of three per entry. Where the kernel lacks it, falls back to get_next_key,
// lookup and delete.
template <typename K, typename V, typename Fn>
void DrainMap(int fd, Fn&& fn) {
  uint32_t batch = 256;
  std::vector<K> keys(batch);
  std::vector<V> values(batch);
  uint32_t in_batch = 0, out_batch = 0;
  bool first = true;
  for (;;) {
    uint32_t count = batch;
    int rc = bpf_map_lookup_and_delete_batch(fd, first ? nullptr : &in_batch, &out_batch,
                                             keys.data(), values.data(), &count, nullptr);
    int err = rc < 0 ? errno : 0;
    if (rc < 0 && err == ENOSPC && count == 0 && batch < (1u << 20)) {
      // One hash bucket holds more entries than the buffers: grow and retry the same bucket.
      batch *= 2;
      keys.resize(batch);
      values.resize(batch);
      continue;
    }
    if (rc < 0 && first && count == 0 &&
        (err == EINVAL || err == EOPNOTSUPP || err == ENOTSUP || err == 524 /* ENOTSUPP */)) {
      std::vector<K> all = AllKeys<K>(fd);
      V v;
      for (const K& k : all) {
        if (bpf_map_lookup_elem(fd, &k, &v) == 0) fn(k, v);
      }
      DeleteAll(fd, all);
      return;
    }
    for (uint32_t i = 0; i < count; ++i) fn(keys[i], values[i]);
    if (rc < 0) {
      if (err != ENOENT) {
        static RateLimitedLog log;
        log.Log(LogLevel::kWarning, "draining a BPF map: %s", std::strerror(err));
      }
      return;
    }
    in_batch = out_batch;
    first = false;
  }
}

}  // namespace

void BpfMapReader::DrainStacks(uint32_t buffer,
                               absl::FunctionRef<void(uint64_t, const ps_stack&)> fn) {
  DrainMap<uint64_t, ps_stack>(fds_.stacks[buffer], fn);
  if (fds_.sched_stacks[buffer] >= 0) DrainMap<uint64_t, ps_stack>(fds_.sched_stacks[buffer], fn);
}

void BpfMapReader::DrainOnCpu(
    uint32_t buffer, absl::FunctionRef<void(const ps_oncpu_key&, const ps_oncpu_value&)> fn) {
  DrainMap<ps_oncpu_key, ps_oncpu_value>(fds_.oncpu[buffer], fn);
}

void BpfMapReader::DrainOffCpu(
    uint32_t buffer, absl::FunctionRef<void(const ps_offcpu_key&, const ps_offcpu_value&)> fn) {
  DrainMap<ps_offcpu_key, ps_offcpu_value>(fds_.offcpu[buffer], fn);
}

void BpfMapReader::DrainRuntime(uint32_t buffer,
                                absl::FunctionRef<void(const ps_runtime_key&, uint64_t)> fn) {
  DrainMap<ps_runtime_key, uint64_t>(fds_.runtime[buffer], fn);
}

void BpfMapReader::VisitThreads(absl::FunctionRef<void(uint32_t, const ps_thread_state&)> fn) {
  if (fds_.thread_dump_link >= 0) {
    VisitThreadRecords(fn);
    return;
  }
  // Batch lookups walk the hash by bucket, so concurrent inserts and deletes (threads starting
  // and exiting) neither restart the walk nor visit an entry twice, unlike get_next_key.
  constexpr uint32_t kBatch = 256;
  std::vector<uint32_t> keys(kBatch);
  std::vector<ps_thread_state> values(kBatch);
  uint32_t in_batch = 0, out_batch = 0;
  bool first = true;
  for (;;) {
    uint32_t count = kBatch;
    int rc = bpf_map_lookup_batch(fds_.threads, first ? nullptr : &in_batch, &out_batch,
                                  keys.data(), values.data(), &count, nullptr);
    int err = rc < 0 ? errno : 0;
    for (uint32_t i = 0; i < count; ++i) fn(keys[i], values[i]);
    if (rc < 0 && err != ENOENT) {
      static RateLimitedLog log;
      log.Log(LogLevel::kWarning, "reading ps_threads: %s", std::strerror(err));
    }
    if (rc < 0) break;
    in_batch = out_batch;
    first = false;
  }
}

void BpfMapReader::VisitThreadRecords(
    absl::FunctionRef<void(uint32_t, const ps_thread_state&)> fn) {
  static RateLimitedLog log;
  const int fd = bpf_iter_create(fds_.thread_dump_link);
  if (fd < 0) {
    log.Log(LogLevel::kWarning, "running the thread state iterator: %s", std::strerror(errno));
    return;
  }
  // A read returns whole records except at the end of the caller's buffer: the rest of a record
  // comes with the next read.
  constexpr size_t kRecord = sizeof(ps_thread_record_head) + sizeof(ps_thread_state);
  std::vector<char> buf(256 * kRecord);
  size_t have = 0;
  for (;;) {
    const ssize_t n = read(fd, buf.data() + have, buf.size() - have);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      log.Log(LogLevel::kWarning, "reading the thread state iterator: %s", std::strerror(errno));
      break;
    }
    if (n == 0) break;
    have += static_cast<size_t>(n);
    size_t at = 0;
    for (; have - at >= kRecord; at += kRecord) {
      ps_thread_record_head head;
      ps_thread_state ts;
      std::memcpy(&head, buf.data() + at, sizeof(head));
      std::memcpy(&ts, buf.data() + at + sizeof(head), sizeof(ts));
      fn(head.tid, ts);
    }
    std::memmove(buf.data(), buf.data() + at, have - at);
    have -= at;
  }
  close(fd);
}

std::vector<ps_cpu_state> BpfMapReader::ReadCpuStates() {
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return {};
  std::vector<ps_cpu_state> cpus(ncpu);
  uint32_t zero = 0;
  if (bpf_map_lookup_elem(fds_.cpu_state, &zero, cpus.data()) != 0) return {};
  return cpus;
}

}  // namespace parascope
