// The on-CPU sampler: bpf/oncpu.bpf.c loaded and attached to a sampling perf event on every
// online CPU, and the drain of its double-buffered aggregate.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "agent/bpf/perf_event.h"
#include "agent/collect/oncpu_record.h"
#include "bpf/abi.h"

struct oncpu_bpf;
struct bpf_link;

namespace parascope {

// Counters from the ps_counters per-CPU array (abi.h PS_CTR_*), summed over CPUs.
using BpfCounters = std::array<uint64_t, PS_CTR_NUM>;

// The kernel boundary of on-CPU sampling, so collection logic can be tested with a fake.
class OnCpuSource {
 public:
  virtual ~OnCpuSource() = default;
  // Closes the current buffer and returns what it recorded: the BPF program is switched to the
  // other buffer, every CPU is waited on so no sample is still writing the closed one, and the
  // closed buffer is read and emptied. Samples taken during the drain land in the next window.
  virtual absl::StatusOr<std::vector<OnCpuRecord>> Drain() = 0;
  // Stops sampling, then returns everything still recorded in either buffer (the last window).
  virtual absl::StatusOr<std::vector<OnCpuRecord>> DetachAndDrain() = 0;
  virtual BpfCounters Counters() const = 0;
};

class OnCpuProgram : public OnCpuSource {
 public:
  struct Options {
    int frequency_hz = 19;
    std::vector<uint32_t> tgids;  // empty: all processes
    absl::Duration collect_interval = absl::Seconds(15);  // sizes the maps
  };

  // Opens the skeleton, sizes its maps for the expected samples per window, loads it (CO-RE),
  // fills the pid filter and attaches on every online CPU (skeleton lifecycle of
  // ARCHITECTURE.md convention 3). Errors carry libbpf's errno and what failed.
  static absl::StatusOr<std::unique_ptr<OnCpuProgram>> Create(const Options& options);
  ~OnCpuProgram() override;

  absl::StatusOr<std::vector<OnCpuRecord>> Drain() override;
  absl::StatusOr<std::vector<OnCpuRecord>> DetachAndDrain() override;
  BpfCounters Counters() const override;

  const std::string& event_name() const { return events_.name; }
  bool period_is_ns() const { return events_.period_is_ns; }
  size_t num_cpus() const { return events_.cpus.size(); }
  uint32_t stack_map_entries() const { return stack_entries_; }

 private:
  OnCpuProgram() = default;
  // Returns once every CPU in events_.cpus has scheduled the calling thread, i.e. once every BPF
  // program invocation that started before the call has finished (they run with preemption
  // disabled: perf_event programs in IRQ/NMI context).
  absl::Status WaitForCpus();
  // Reads and empties buffer `index` (which no program may be writing), appending to *out.
  void DrainBuffer(uint32_t index, std::vector<OnCpuRecord>* out);

  oncpu_bpf* skel_ = nullptr;
  SamplingEvents events_;
  std::vector<bpf_link*> links_;
  uint32_t active_ = 0;
  uint32_t stack_entries_ = 0;
};

}  // namespace parascope
