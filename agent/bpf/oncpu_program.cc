#include "agent/bpf/oncpu_program.h"

#include <bpf/bpf.h>
#include <bpf/libbpf.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "agent/util/log.h"
#include "agent/util/status.h"
#include "oncpu.skel.h"

namespace parascope {
namespace {

// libbpf 1.x returns -errno from most calls (and sets errno).
absl::Status LibbpfError(int rc, absl::string_view what) {
  return ErrnoStatus(rc < 0 ? -rc : errno, absl::StrCat("libbpf: ", what));
}

uint32_t NextPow2(uint64_t v) {
  uint32_t p = 1;
  while (p < v && p < (1u << 30)) p <<= 1;
  return p;
}

}  // namespace

absl::StatusOr<std::unique_ptr<OnCpuProgram>> OnCpuProgram::Create(const Options& options) {
  std::unique_ptr<OnCpuProgram> self(new OnCpuProgram());
  PS_ASSIGN_OR_RETURN(self->events_, OpenSamplingEvents(options.frequency_hz));

  self->skel_ = oncpu_bpf::open();
  if (self->skel_ == nullptr) return LibbpfError(-errno, "opening oncpu.bpf.o");
  oncpu_bpf* skel = self->skel_;

  // Map sizes from the samples one window can hold: CPUs * Hz * seconds, twice for separate
  // user and kernel stacks. Distinct stacks are usually far fewer; a full map is counted
  // (PS_CTR_STACK_MAP_FULL / PS_CTR_AGG_MAP_FULL), never silent. 16384 entries cap the
  // preallocated stack memory at 16 MiB per buffer.
  double per_window = static_cast<double>(self->events_.cpus.size()) * options.frequency_hz *
                      absl::ToDoubleSeconds(options.collect_interval);
  self->stack_entries_ =
      std::clamp<uint32_t>(NextPow2(static_cast<uint64_t>(2 * per_window)), 1024, 16384);
  uint32_t agg_entries =
      std::clamp<uint32_t>(NextPow2(static_cast<uint64_t>(per_window)), 1024, 16384);
  for (bpf_map* m : {skel->maps.ps_stacks0, skel->maps.ps_stacks1}) {
    if (int rc = bpf_map__set_max_entries(m, self->stack_entries_); rc) {
      return LibbpfError(rc, "sizing stack maps");
    }
  }
  for (bpf_map* m : {skel->maps.ps_oncpu0, skel->maps.ps_oncpu1}) {
    if (int rc = bpf_map__set_max_entries(m, agg_entries); rc) {
      return LibbpfError(rc, "sizing aggregation maps");
    }
  }
  skel->rodata->ps_cfg_filter_tgid = options.tgids.empty() ? 0 : 1;

  if (int rc = oncpu_bpf::load(skel); rc) return LibbpfError(rc, "loading oncpu.bpf.o");

  uint8_t one = 1;
  for (uint32_t tgid : options.tgids) {
    if (bpf_map__update_elem(skel->maps.ps_pid_filter, &tgid, sizeof(tgid), &one, sizeof(one),
                             BPF_ANY)) {
      return ErrnoStatus(errno, "filling the pid filter map");
    }
  }
  for (size_t i = 0; i < self->events_.fds.size(); ++i) {
    bpf_link* link =
        bpf_program__attach_perf_event(skel->progs.ps_on_cpu_sample, self->events_.fds[i].get());
    if (link == nullptr) {
      return LibbpfError(-errno,
                         absl::StrCat("attaching to ", self->events_.name, " on CPU ",
                                      self->events_.cpus[i]));
    }
    self->links_.push_back(link);
  }
  return self;
}

OnCpuProgram::~OnCpuProgram() {
  for (bpf_link* l : links_) bpf_link__destroy(l);
  if (skel_ != nullptr) oncpu_bpf::destroy(skel_);
}

absl::Status OnCpuProgram::WaitForCpus() {
  cpu_set_t saved;
  if (sched_getaffinity(0, sizeof(saved), &saved) != 0) {
    return ErrnoStatus(errno, "sched_getaffinity");
  }
  for (int cpu : events_.cpus) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    // Returns after the kernel migrated this thread to `cpu` (kernel/sched/core.c
    // __set_cpus_allowed_ptr -> affine_move_task waits for the stopper). EINVAL: CPU went
    // offline, and an offline CPU runs no program.
    if (sched_setaffinity(0, sizeof(one), &one) != 0 && errno != EINVAL) {
      int err = errno;
      sched_setaffinity(0, sizeof(saved), &saved);
      return ErrnoStatus(err, absl::StrCat("sched_setaffinity(cpu ", cpu, ")"));
    }
  }
  sched_setaffinity(0, sizeof(saved), &saved);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<OnCpuRecord>> OnCpuProgram::Drain() {
  uint32_t closed = active_;
  active_ ^= 1;
  // .bss is mmap'ed by libbpf: a plain store flips the program's buffer choice.
  skel_->bss->ps_active_buffer = active_;
  std::atomic_thread_fence(std::memory_order_seq_cst);
  PS_RETURN_IF_ERROR(WaitForCpus());
  std::vector<OnCpuRecord> out;
  DrainBuffer(closed, &out);
  return out;
}

absl::StatusOr<std::vector<OnCpuRecord>> OnCpuProgram::DetachAndDrain() {
  for (bpf_link* l : links_) bpf_link__destroy(l);
  links_.clear();
  // Detaching waits for running programs (perf_event_free_bpf_prog -> synchronize_rcu); wait on
  // the CPUs anyway so the guarantee does not rest on that detail.
  PS_RETURN_IF_ERROR(WaitForCpus());
  std::vector<OnCpuRecord> out;
  DrainBuffer(active_, &out);
  DrainBuffer(active_ ^ 1, &out);
  return out;
}

void OnCpuProgram::DrainBuffer(uint32_t closed, std::vector<OnCpuRecord>* out_records) {
  std::vector<OnCpuRecord>& out = *out_records;
  bpf_map* agg = closed == 0 ? skel_->maps.ps_oncpu0 : skel_->maps.ps_oncpu1;
  bpf_map* stacks = closed == 0 ? skel_->maps.ps_stacks0 : skel_->maps.ps_stacks1;
  int agg_fd = bpf_map__fd(agg);
  int stacks_fd = bpf_map__fd(stacks);

  std::vector<ps_oncpu_key> keys;
  ps_oncpu_key key{}, next{};
  const void* prev = nullptr;
  while (bpf_map_get_next_key(agg_fd, prev, &next) == 0) {
    keys.push_back(next);
    key = next;
    prev = &key;
  }

  absl::flat_hash_map<uint64_t, std::vector<uint64_t>> stack_cache;
  ps_stack st;
  auto stack = [&](uint64_t hash, int32_t* err) -> const std::vector<uint64_t>* {
    if (hash == 0) return nullptr;
    auto [it, inserted] = stack_cache.try_emplace(hash);
    if (inserted) {
      if (bpf_map_lookup_elem(stacks_fd, &hash, &st) == 0) {
        uint32_t n = std::min<uint32_t>(st.len, PS_MAX_STACK_DEPTH);
        it->second.assign(st.ips, st.ips + n);
      } else if (*err == 0) {
        *err = -ENOENT;  // referenced stack missing: should not happen; show it as [unknown]
      }
    }
    return &it->second;
  };

  out.reserve(out.size() + keys.size());
  for (const ps_oncpu_key& k : keys) {
    ps_oncpu_value v;
    if (bpf_map_lookup_elem(agg_fd, &k, &v) != 0) continue;
    OnCpuRecord r;
    r.process = proc::ProcessKey{k.tgid, k.tgid_start_ns};
    r.tid = k.tid;
    r.thread_name.assign(v.comm, strnlen(v.comm, sizeof(v.comm)));
    r.kernel_stack_err = k.kernel_stack_err;
    r.user_stack_err = k.user_stack_err;
    if (auto* s = stack(k.kernel_stack, &r.kernel_stack_err)) r.kernel_ips = *s;
    if (auto* s = stack(k.user_stack, &r.user_stack_err)) r.user_ips = *s;
    r.count = v.count;
    r.period_sum = v.period_sum;
    out.push_back(std::move(r));
  }

  // Empty the closed buffer for its next turn.
  for (const ps_oncpu_key& k : keys) bpf_map_delete_elem(agg_fd, &k);
  std::vector<uint64_t> stack_keys;
  uint64_t skey = 0, snext = 0;
  const void* sprev = nullptr;
  while (bpf_map_get_next_key(stacks_fd, sprev, &snext) == 0) {
    stack_keys.push_back(snext);
    skey = snext;
    sprev = &skey;
  }
  for (uint64_t h : stack_keys) bpf_map_delete_elem(stacks_fd, &h);
}

BpfCounters OnCpuProgram::Counters() const {
  BpfCounters total{};
  int ncpu = libbpf_num_possible_cpus();
  if (ncpu <= 0) return total;
  std::vector<uint64_t> per_cpu(ncpu);
  int fd = bpf_map__fd(skel_->maps.ps_counters);
  for (uint32_t i = 0; i < PS_CTR_NUM; ++i) {
    if (bpf_map_lookup_elem(fd, &i, per_cpu.data()) != 0) continue;
    for (uint64_t c : per_cpu) total[i] += c;
  }
  return total;
}

}  // namespace parascope
