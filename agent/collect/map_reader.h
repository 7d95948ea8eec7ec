// The kernel boundary of window collection: what the daemon reads from the BPF maps of
// bpf/oncpu.bpf.c and bpf/sched.bpf.c at each window boundary, as the ABI structs of bpf/abi.h.
// agent/bpf/ implements it over the map fds (libbpf); tests implement it over recorded contents.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/functional/function_ref.h"
#include "bpf/abi.h"

namespace parascope::collect {

// Reads the maps the window drain needs. A buffer is one of the PS_NUM_BUFFERS (0 or 1) copies
// of the double-buffered maps (ps_stacks<N>, ps_oncpu<N>, ps_offcpu<N>, ps_runtime<N>); the
// daemon only drains a buffer that no program writes any more (the closed one, after every CPU
// was waited on). Not thread-safe.
class MapReader {
 public:
  virtual ~MapReader() = default;

  // Reads and deletes every entry of ps_stacks<buffer> (and ps_sched_stacks<buffer>: the sampler
  // and sched_switch store stacks in maps of their own), calling fn(hash, stack) for each: `hash`
  // is the key the records of the same buffer (and ps_threads) refer to, `stack` has `len`
  // frames, leaf first (entries past len are garbage; len may exceed PS_MAX_STACK_DEPTH only if
  // the map is corrupt, callers clamp).
  virtual void DrainStacks(uint32_t buffer,
                           absl::FunctionRef<void(uint64_t hash, const ps_stack& stack)> fn) = 0;
  // Reads and deletes every entry of ps_oncpu<buffer>: on-CPU sample aggregates.
  virtual void DrainOnCpu(
      uint32_t buffer,
      absl::FunctionRef<void(const ps_oncpu_key& key, const ps_oncpu_value& value)> fn) = 0;
  // Reads and deletes every entry of ps_offcpu<buffer>: off-CPU ns that BPF attributed at
  // switch-in, from max(switch-out, window start) (bpf/abi.h ps_thread_state).
  virtual void DrainOffCpu(
      uint32_t buffer,
      absl::FunctionRef<void(const ps_offcpu_key& key, const ps_offcpu_value& value)> fn) = 0;
  // Reads and deletes every entry of ps_runtime<buffer>: exact on-CPU ns per process that BPF
  // attributed at switch-out, from max(switch-in, window start).
  virtual void DrainRuntime(uint32_t buffer,
                            absl::FunctionRef<void(const ps_runtime_key& key, uint64_t ns)> fn) = 0;

  // Calls fn(tid, state) for every thread state (bpf/sched.bpf.c: the thread's task storage, or
  // its ps_threads entry), without deleting any: the states are the programs' own (made at fork,
  // attach or switch-out, gone at exit), and they keep changing while the daemon reads them.
  // Each state present for the whole read is visited once.
  virtual void VisitThreads(
      absl::FunctionRef<void(uint32_t tid, const ps_thread_state& state)> fn) = 0;

  // The per-CPU ps_cpu_state array (one entry per possible CPU, in CPU order), read without
  // deleting; empty when it cannot be read.
  virtual std::vector<ps_cpu_state> ReadCpuStates() = 0;
};

}  // namespace parascope::collect
