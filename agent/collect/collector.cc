#include "agent/collect/collector.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "agent/util/hash_map.h"

namespace parascope::collect {

Collector::Collector(MapReader* maps, const Options& options) : maps_(maps), options_(options) {}

WindowData Collector::Collect(int64_t prev_ws_ns, int64_t ws_ns, uint32_t closed, bool final) {
  WindowData out;
  out.start_mono_ns = prev_ws_ns;
  out.end_mono_ns = ws_ns;
  ++window_index_;
  uncaptured_.clear();
  DrainBuffer(closed, &out);
  if (final) DrainBuffer(closed ^ 1, &out);
  if (options_.sched) {
    absl::flat_hash_map<uint32_t, uint64_t> on_cpu;
    ScanCpus(prev_ws_ns, ws_ns, closed, &on_cpu, &out);
    ScanThreads(prev_ws_ns, ws_ns, closed, on_cpu, final, &out);
    ExactOffCpuTotals(&out);
  }

  // Keep stacks used in this or the previous window; bound the cache.
  for (auto it = stack_cache_.begin(); it != stack_cache_.end();) {
    if (it->second.last_used_window + 2 <= window_index_) {
      stack_cache_.erase(it++);
    } else {
      ++it;
    }
  }
  if (stack_cache_.size() > options_.max_cached_stacks) {
    std::vector<std::pair<uint64_t, uint64_t>> by_age;
    for (const auto& [h, c] : stack_cache_) by_age.emplace_back(c.last_used_window, h);
    std::sort(by_age.begin(), by_age.end());
    for (size_t i = 0; i < by_age.size() - options_.max_cached_stacks; ++i) {
      stack_cache_.erase(by_age[i].second);
      ++map_stats_.stack_cache_evicted;
    }
  }
  ShrinkIfSparse(stack_cache_);  // after a burst of short-lived processes' stacks
  CompactIpPool();
  map_stats_.stack_cache = stack_cache_.size();
  map_stats_.stack_cache_ips = ip_pool_.size();
  return out;
}

void Collector::CompactIpPool() {
  size_t live = 0;
  for (const auto& [h, c] : stack_cache_) live += c.length;
  if (ip_pool_.size() - live <= live) return;  // at most half dropped copies: keep appending
  // In place, in offset order: each live stack moves down (or stays), so no second buffer.
  std::vector<CachedStack*> by_offset;
  by_offset.reserve(stack_cache_.size());
  for (auto& [h, c] : stack_cache_) by_offset.push_back(&c);
  std::sort(by_offset.begin(), by_offset.end(),
            [](const CachedStack* a, const CachedStack* b) { return a->offset < b->offset; });
  size_t end = 0;
  for (CachedStack* c : by_offset) {
    std::memmove(ip_pool_.data() + end, ip_pool_.data() + c->offset, c->length * sizeof(uint64_t));
    c->offset = static_cast<uint32_t>(end);
    end += c->length;
  }
  ip_pool_.resize(end);
  // After a burst (short-lived processes' stacks), the room goes with it.
  if (ip_pool_.capacity() > 4 * std::max<size_t>(end, 8192)) ip_pool_.shrink_to_fit();
}

void Collector::ResolveStacks(uint64_t kernel_stack, int32_t kernel_err, uint64_t user_stack,
                              int32_t user_err, StackPair* pair) {
  auto one = [&](uint64_t hash, int32_t err, std::vector<uint64_t>* ips, int32_t* err_out,
                 uint32_t* flags) {
    *err_out = err;
    if (hash == 0) return;
    auto it = stack_cache_.find(hash);
    if (it == stack_cache_.end()) {
      ++map_stats_.stacks_missing;
      *err_out = -ENOENT;
      return;
    }
    it->second.last_used_window = window_index_;
    const uint64_t* first = ip_pool_.data() + it->second.offset;
    ips->assign(first, first + it->second.length);
    *flags = it->second.flags;
  };
  uint32_t kernel_flags = 0;
  one(kernel_stack, kernel_err, &pair->kernel_ips, &pair->kernel_stack_err, &kernel_flags);
  one(user_stack, user_err, &pair->user_ips, &pair->user_stack_err, &pair->user_unwind);
}

void Collector::DrainBuffer(uint32_t index, WindowData* out) {
  // Stacks first: records of this buffer and intervals ending later refer to them.
  maps_->DrainStacks(index, [&](uint64_t h, const ps_stack& st) {
    CachedStack& c = stack_cache_[h];
    // A stack drained again is appended again; CompactIpPool drops the old copy.
    c.offset = static_cast<uint32_t>(ip_pool_.size());
    c.length = std::min<uint32_t>(st.len, PS_MAX_STACK_DEPTH);
    ip_pool_.insert(ip_pool_.end(), st.ips, st.ips + c.length);
    c.flags = st.flags;
    c.last_used_window = window_index_;
  });

  maps_->DrainOnCpu(index, [&](const ps_oncpu_key& k, const ps_oncpu_value& v) {
    OnCpuRecord r;
    r.process = proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id};
    r.tid = k.tid;
    r.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
    ResolveStacks(k.kernel_stack, k.kernel_stack_err, k.user_stack, k.user_stack_err, &r.stacks);
    r.parallelism = std::max<uint32_t>(k.parallelism, 1);
    r.group = k.group;
    r.parallelism_unknown = (k.flags & PS_SAMPLE_PARALLELISM_UNKNOWN) != 0;
    r.count = v.count;
    r.period_sum = v.period_sum;
    out->oncpu.push_back(std::move(r));
  });
  if (!options_.sched) return;

  maps_->DrainOffCpu(index, [&](const ps_offcpu_key& k, const ps_offcpu_value& v) {
    if (k.user_stack_err == PS_ERR_UNCAPTURED_SUM) {  // an exited thread's sums, by state
      Uncaptured& u = uncaptured_[k.tid];
      u.process = proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id};
      u.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
      const uint64_t by_state[3] = {v.ns, v.sampled_ns, v.sampled_raw_ns};
      for (int i = 0; i < 3; ++i) {
        u.ns[i] += by_state[i];
        u.known[i] = true;
      }
      return;
    }
    OffCpuRecord r;
    r.process = proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id};
    r.tid = k.tid;
    r.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
    ResolveStacks(k.kernel_stack, k.kernel_stack_err, k.user_stack, k.user_stack_err, &r.stacks);
    r.state = k.state;
    r.ns = v.ns;
    r.count = v.count;
    r.sampled_ns = v.sampled_ns;
    r.sampled_raw_ns = v.sampled_raw_ns;
    out->offcpu.push_back(std::move(r));
  });

  maps_->DrainRuntime(index, [&](const ps_runtime_key& k, uint64_t ns) {
    out->runtime.push_back({proc::ProcessKey{k.tgid, k.tgid_start_ns, k.exec_id}, ns});
  });
}

void Collector::ScanThreads(int64_t prev_ws, int64_t ws, uint32_t closed,
                            const absl::flat_hash_map<uint32_t, uint64_t>& on_cpu, bool final,
                            WindowData* out) {
  const uint64_t cur = static_cast<uint64_t>(ws), prev = static_cast<uint64_t>(prev_ws);
  // Intervals this scan leaves whole to BPF (not final at `cur`, bpf/abi.h
  // ps_offcpu_weight_final): tid -> out_ns.
  absl::flat_hash_map<uint32_t, uint64_t> deferred;
  // Where the daemon's part of an interval that began at `out` starts: at `prev`, unless the last
  // scan left it whole to BPF (then from its start: BPF will count only from `cur`).
  auto from_of = [&](uint32_t tid, uint64_t out) {
    auto it = deferred_.find(tid);
    return it != deferred_.end() && it->second == out ? out : std::max(out, prev);
  };
  // `weight`: times the interval counts (bpf/abi.h ps_offcpu_weight).
  // Where the daemon's part ends: at `cur`, or where the thread was seen on a CPU since.
  auto end_of = [&](uint32_t tid, const ps_thread_state& ts) {
    uint64_t to = cur;
    // Marked off-CPU at out_ns but seen running on a CPU since a later time: it came in by an
    // unreported switch (bpf/abi.h), so it was off-CPU only until then. A CPU record older than
    // out_ns is stale (the thread left that CPU unseen) and says nothing.
    if (auto it = on_cpu.find(tid); it != on_cpu.end() && it->second >= ts.out_ns) {
      to = std::min(to, it->second);
    }
    return to;
  };
  auto emit = [&](uint32_t tid, const ps_thread_state& ts, uint64_t from, uint64_t kstack,
                  int32_t kerr, uint64_t ustack, int32_t uerr, uint32_t state, uint64_t weight) {
    const uint64_t to = end_of(tid, ts);
    if (to <= from) return;
    OffCpuRecord r;
    r.process = proc::ProcessKey{ts.tgid, ts.tgid_start_ns, ts.exec_id};
    r.tid = tid;
    r.thread_name.assign(ts.comm, strnlen(ts.comm, sizeof(ts.comm)));
    ResolveStacks(kstack, kerr, ustack, uerr, &r.stacks);
    r.state = state;
    r.ns = (to - from) * weight;
    r.count = weight;
    if (weight > 1) {  // only at the final boundary: a weight final at a boundary is 1 (abi.h)
      r.sampled_ns = r.ns;
      r.sampled_raw_ns = to - from;
    }
    out->offcpu.push_back(std::move(r));
  };
  uint64_t entries = 0;
  maps_->VisitThreads([&](uint32_t tid, const ps_thread_state& ts) {
    ++entries;
    // BPF set the slot's window when it first met a sampled interval of the thread in it.
    if (const ps_uncaptured& u = ts.uncaptured[closed & 1]; u.ws_ns == prev) {
      Uncaptured& mine = uncaptured_[tid];
      mine.process = proc::ProcessKey{ts.tgid, ts.tgid_start_ns, ts.exec_id};
      mine.thread_name.assign(ts.comm, strnlen(ts.comm, sizeof(ts.comm)));
      for (int i = 0; i < 3; ++i) {
        mine.ns[i] += u.ns[i];
        mine.known[i] = true;
      }
    }
    if (ts.carry_ws_ns == cur) {
      // Ended after `cur`, its weight final at `cur` (BPF copies only such intervals).
      if (ts.carry_weight != 0) {
        emit(tid, ts, from_of(tid, ts.carry_out_ns), ts.carry_kernel_stack,
             ts.carry_kernel_stack_err, ts.carry_user_stack, ts.carry_user_stack_err,
             ts.carry_state, ts.carry_weight);
      }
    } else if (ts.out_ns != 0 && ts.out_ns < cur) {
      // Still off-CPU. Split at `cur` only once its weight is final (abi.h): counted by it now,
      // the rest by BPF at switch-in. Else left whole to BPF (or to the next scan), except at
      // the last boundary (no switch-in will be seen): cut there, by its weight so far.
      const uint64_t so_far = cur - ts.out_ns;
      if (final || ps_offcpu_weight_final(ts.stack_weight, ts.budget_weight, so_far,
                                          options_.min_offcpu_ns)) {
        const uint64_t weight = so_far >= options_.min_offcpu_ns
                                    ? ps_offcpu_weight(ts.stack_weight, ts.budget_weight, so_far)
                                    : 0;
        if (weight != 0) {
          emit(tid, ts, from_of(tid, ts.out_ns), ts.kernel_stack, ts.kernel_stack_err,
               ts.user_stack, ts.user_stack_err, ts.state, weight);
        } else if (so_far >= options_.min_offcpu_ns) {
          // The last boundary, stacks not captured: its length so far goes to the exact sum.
          const uint32_t i = ts.state - PS_STATE_RUNNABLE;
          auto it = uncaptured_.find(tid);
          const uint64_t from = from_of(tid, ts.out_ns), to = end_of(tid, ts);
          if (i < 3 && it != uncaptured_.end() && it->second.known[i] && to > from) {
            it->second.ns[i] += to - from;
          }
        }
      } else if (deferred.size() < PS_THREAD_MAP_ENTRIES) {
        deferred.emplace(tid, ts.out_ns);
      }
    }
    // Keep the stacks of threads still off-CPU: their intervals end in a later window.
    if (ts.out_ns != 0) {
      for (uint64_t h : {ts.kernel_stack, ts.user_stack}) {
        auto it = stack_cache_.find(h);
        if (it != stack_cache_.end()) it->second.last_used_window = window_index_;
      }
    }
  });
  deferred_ = std::move(deferred);
  map_stats_.thread_states = entries;
  map_stats_.thread_states_max = std::max(map_stats_.thread_states_max, entries);
}

void Collector::ExactOffCpuTotals(WindowData* out) {
  const absl::flat_hash_map<uint32_t, Uncaptured>& uncaptured = uncaptured_;
  struct Sums {
    uint64_t sampled = 0;  // sum of the weighted intervals' ns * weight
    uint64_t exact = 0;    // their length once each, plus the uncaptured intervals'
    uint64_t scaled = 0;   // of `sampled`, the part already scaled (so rounding sums to exact)
  };
  constexpr uint32_t kStates = 3;
  absl::flat_hash_map<uint64_t, Sums> by_thread_state;  // tid << 2 | (state - RUNNABLE)
  auto index = [](uint32_t tid, uint32_t state) {
    return uint64_t{tid} << 2 | ((state - PS_STATE_RUNNABLE) & 3);
  };
  auto known = [&](uint32_t tid, uint32_t state) {
    auto it = uncaptured.find(tid);
    const uint32_t i = state - PS_STATE_RUNNABLE;
    return it != uncaptured.end() && i < kStates && it->second.known[i];
  };
  for (const OffCpuRecord& r : out->offcpu) {
    if (r.sampled_ns == 0 || !known(r.tid, r.state)) continue;
    Sums& s = by_thread_state[index(r.tid, r.state)];
    s.sampled += r.sampled_ns;
    s.exact += r.sampled_raw_ns;
  }
  for (const auto& [tid, u] : uncaptured) {
    for (uint32_t i = 0; i < kStates; ++i) {
      if (!u.known[i] || u.ns[i] == 0) continue;
      auto it = by_thread_state.find(index(tid, PS_STATE_RUNNABLE + i));
      if (it != by_thread_state.end()) {
        it->second.exact += u.ns[i];
        continue;
      }
      // No interval of this thread and state counted more than once: the time is known, its
      // stacks are not.
      OffCpuRecord r;
      r.process = u.process;
      r.tid = tid;
      r.thread_name = u.thread_name;
      r.stacks.kernel_stack_err = PS_ERR_NOT_CAPTURED;
      r.stacks.user_stack_err = PS_ERR_NOT_CAPTURED;
      r.state = PS_STATE_RUNNABLE + i;
      r.ns = u.ns[i];
      r.count = 1;
      out->offcpu.push_back(std::move(r));
    }
  }
  for (OffCpuRecord& r : out->offcpu) {
    if (r.sampled_ns == 0) continue;
    if (auto it = by_thread_state.find(index(r.tid, r.state)); it != by_thread_state.end()) {
      Sums& s = it->second;
      auto part = [&](uint64_t upto) {
        return static_cast<uint64_t>(static_cast<unsigned __int128>(upto) * s.exact / s.sampled);
      };
      const uint64_t before = part(s.scaled);
      s.scaled += r.sampled_ns;
      r.ns = r.ns - r.sampled_ns + (part(s.scaled) - before);
    }
    r.sampled_ns = 0;
    r.sampled_raw_ns = 0;
  }
}

void Collector::ScanCpus(int64_t prev_ws, int64_t ws, uint32_t closed,
                         absl::flat_hash_map<uint32_t, uint64_t>* on_cpu, WindowData* out) {
  const std::vector<ps_cpu_state> cpus = maps_->ReadCpuStates();
  const uint64_t cur = static_cast<uint64_t>(ws), prev = static_cast<uint64_t>(prev_ws);
  for (const ps_cpu_state& c : cpus) {
    // On-CPU time of the window that sched_switch had not added to ps_runtime<closed> yet.
    if (const ps_runtime_pending& p = c.pending[closed & 1]; p.ws_ns == prev && p.ns != 0) {
      out->runtime.push_back({{p.tgid, p.tgid_start_ns, p.exec_id}, p.ns});
    }
    if (c.known && c.counted && c.tid != 0) {
      // A tid on two CPUs: one record is stale (it left unseen); the later switch-in is current.
      uint64_t& since = (*on_cpu)[c.tid];
      since = std::max<uint64_t>(since, c.in_ns);
    }
    uint64_t from;
    proc::ProcessKey key;
    if (c.carry_ws_ns == cur) {
      from = c.carry_in_ns;
      key = {c.carry_tgid, c.carry_tgid_start_ns, c.carry_exec_id};
    } else if (c.known && c.counted && c.tid != 0 && c.in_ns < cur) {
      from = c.in_ns;
      key = {c.tgid, c.tgid_start_ns, c.exec_id};
    } else {
      continue;
    }
    from = std::max(from, prev);
    if (cur > from) out->runtime.push_back({key, cur - from});
  }
}

}  // namespace parascope::collect
