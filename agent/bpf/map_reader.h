// collect::MapReader over the BPF maps' file descriptors (libbpf system calls).
#pragma once

#include <array>
#include <cstdint>
#include <vector>

#include "agent/collect/map_reader.h"

namespace parascope {

// Reads the maps of bpf/oncpu.bpf.c and bpf/sched.bpf.c by fd. The fds are borrowed from the
// skeletons, which must outlive the reader. Not thread-safe.
class BpfMapReader : public collect::MapReader {
 public:
  // Map fds; -1 where the map does not exist (the sched.bpf.o maps when it is not loaded: then
  // only the on-CPU methods, DrainStacks and ReadCpuStates may be called).
  struct Fds {
    std::array<int, PS_NUM_BUFFERS> stacks = {-1, -1};   // ps_stacks0, ps_stacks1
    // ps_sched_stacks0/1: sched_switch's own stacks (bpf/common.bpf.h), -1 without sched;
    // DrainStacks drains them with the sampler's (one hash per stack either way).
    std::array<int, PS_NUM_BUFFERS> sched_stacks = {-1, -1};
    std::array<int, PS_NUM_BUFFERS> oncpu = {-1, -1};    // ps_oncpu0, ps_oncpu1
    std::array<int, PS_NUM_BUFFERS> offcpu = {-1, -1};   // ps_offcpu0, ps_offcpu1
    std::array<int, PS_NUM_BUFFERS> runtime = {-1, -1};  // ps_runtime0, ps_runtime1
    int threads = -1;                                    // ps_threads (hash), or -1
    // The link of the iterator ps_dump_threads where thread states are in task storage (then
    // `threads` is -1), else -1.
    int thread_dump_link = -1;
    int cpu_state = -1;                                  // ps_cpu_state (per-CPU array of 1)
  };

  explicit BpfMapReader(const Fds& fds) : fds_(fds) {}

  // Read + delete with BPF_MAP_LOOKUP_AND_DELETE_BATCH, else get_next_key, lookup and delete.
  void DrainStacks(uint32_t buffer, absl::FunctionRef<void(uint64_t, const ps_stack&)> fn) override;
  void DrainOnCpu(uint32_t buffer,
                  absl::FunctionRef<void(const ps_oncpu_key&, const ps_oncpu_value&)> fn) override;
  void DrainOffCpu(
      uint32_t buffer,
      absl::FunctionRef<void(const ps_offcpu_key&, const ps_offcpu_value&)> fn) override;
  void DrainRuntime(uint32_t buffer,
                    absl::FunctionRef<void(const ps_runtime_key&, uint64_t)> fn) override;
  // BPF_MAP_LOOKUP_BATCH over ps_threads, or one run of the iterator ps_dump_threads (bpf/abi.h
  // struct ps_thread_record_head) for task storage; read errors other than the end are logged
  // (rate limited) and end the walk.
  void VisitThreads(absl::FunctionRef<void(uint32_t, const ps_thread_state&)> fn) override;
  // One lookup of key 0 in the per-CPU array: libbpf_num_possible_cpus() entries.
  std::vector<ps_cpu_state> ReadCpuStates() override;

 private:
  void VisitThreadRecords(absl::FunctionRef<void(uint32_t, const ps_thread_state&)> fn);

  Fds fds_;
};

}  // namespace parascope
