// The per-window drain and window-boundary attribution: turns what one window left in the BPF
// maps (read through a MapReader) into WindowData records, and attributes the parts of off-CPU
// intervals and on-CPU runs crossing the window start that BPF leaves to the daemon (bpf/abi.h
// ps_thread_state and ps_cpu_state: carry_* fields, pending intervals).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "agent/collect/map_reader.h"
#include "agent/collect/records.h"

namespace parascope::collect {

// Gauges of the BPF maps (entries), read at each drain.
struct MapStats {
  uint64_t thread_states = 0;      // thread states (bpf/sched.bpf.c) after the last drain
  uint64_t thread_states_max = 0;  // maximum over drains
  uint64_t stack_cache = 0;        // stacks kept by the daemon across windows
  uint64_t stack_cache_ips = 0;    // ips their pool holds, dropped copies included
  uint64_t stack_cache_evicted = 0;
  uint64_t stacks_missing = 0;  // referenced stacks found nowhere ([unknown] frames)
};

// Collects one window after another from a MapReader (borrowed; must outlive the Collector) and
// owns the stack cache that outlives single windows. Windows must be collected in order, each
// starting where the previous one ended. Not thread-safe.
class Collector {
 public:
  // Stacks kept across windows at most (CachedStack below).
  static constexpr size_t kMaxCachedStacks = 65536;

  struct Options {
    // sched.bpf.o is loaded: ps_offcpu<N>, ps_runtime<N>, ps_threads and the scheduler's view in
    // ps_cpu_state are read. Without it only on-CPU samples are drained.
    bool sched = true;
    // --off-cpu-min-duration: off-CPU intervals shorter than this (ns) are not counted (BPF
    // applies the same minimum to the intervals it attributes: ps_cfg_min_offcpu_ns).
    uint64_t min_offcpu_ns = 0;
    size_t max_cached_stacks = kMaxCachedStacks;
  };

  Collector(MapReader* maps, const Options& options);

  // Produces the window [prev_ws_ns, ws_ns) (ktime = CLOCK_MONOTONIC ns, the window starts the
  // daemon wrote to ps_control.window_start_ns): drains buffer `closed`, and with `final` the
  // other buffer too (the programs are detached, so nothing writes either); then, with sched,
  // adds the on-CPU time of the tasks on a CPU at the boundary (ps_cpu_state) and the off-CPU
  // time of the threads off-CPU at it, or whose interval crossed it and ended before this call
  // (ps_threads), from max(start, prev_ws_ns) to ws_ns. The caller guarantees that no program
  // still writes buffer `closed` and that the programs see ws_ns as the window start.
  WindowData Collect(int64_t prev_ws_ns, int64_t ws_ns, uint32_t closed, bool final);

  const MapStats& map_stats() const { return map_stats_; }

 private:
  // Reads and empties buffer `index` (no program may be writing it) into *out, and the sums of
  // uncaptured intervals of the threads that exited (bpf/abi.h PS_ERR_UNCAPTURED_SUM) into
  // uncaptured_.
  void DrainBuffer(uint32_t index, WindowData* out);
  // Attributes the parts of intervals crossing [prev_ws, ws) that BPF left to the daemon.
  // `on_cpu`: tid -> since when ScanCpus saw it on a CPU (ktime ns), for threads whose switch-in
  // the tracepoint did not report (their state still says off-CPU; bpf/abi.h).
  // `final`: the last window (programs detached): intervals still running are cut at ws.
  // Also collects, into uncaptured_, each thread's exact length of its intervals of weight 0 in
  // the window, from its slot for buffer `closed` (bpf/abi.h ps_uncaptured).
  struct Uncaptured {
    proc::ProcessKey process;
    std::string thread_name;
    uint64_t ns[3] = {0, 0, 0};  // by state - PS_STATE_RUNNABLE
    // The sum of that state is known: the thread's slot was of this window, or its exit handed
    // the sums over (bpf/abi.h PS_ERR_UNCAPTURED_SUM).
    bool known[3] = {false, false, false};
  };
  void ScanThreads(int64_t prev_ws, int64_t ws, uint32_t closed,
                   const absl::flat_hash_map<uint32_t, uint64_t>& on_cpu, bool final,
                   WindowData* out);
  // Makes each off-CPU total exact per thread and state where the thread's sums of intervals of
  // weight 0 are known (uncaptured_): the intervals that counted more than once
  // (OffCpuRecord::sampled_ns) are scaled so that they sum to their own length plus those, a
  // ratio estimate. The total is then measured; only its split across stacks is sampled. Where
  // no interval counted more than once, the sum is added under uncaptured stacks. A thread
  // without known sums (one that exited with under PS_EXACT_OFFCPU_NS of them, or between a flip
  // and the scan, or whose record was lost) keeps its weighted, unbiased figures. Sums are by tid:
  // a tid reused within a window, or a non-leader thread's exec (it takes the leader's tid,
  // kernel/exec.c de_thread), can mix two threads' figures there.
  void ExactOffCpuTotals(WindowData* out);
  // Adds the on-CPU time of the tasks running at the boundary; fills *on_cpu.
  // Also adds each CPU's on-CPU time still pending in buffer `closed` for the window
  // [prev_ws, ws) (bpf/abi.h ps_runtime_pending). The other buffer's pending time is of an older
  // window, read then; the final read does not flip, so the window it reads is in `closed` too.
  void ScanCpus(int64_t prev_ws, int64_t ws, uint32_t closed,
                absl::flat_hash_map<uint32_t, uint64_t>* on_cpu, WindowData* out);
  // Moves the ips of the stacks in stack_cache_ to the front of ip_pool_ and drops the rest, once
  // the dropped copies (evicted or drained again) outweigh the live ips.
  void CompactIpPool();
  // Fills *pair from the stack cache; marks the stacks used in this window.
  void ResolveStacks(uint64_t kernel_stack, int32_t kernel_err, uint64_t user_stack,
                     int32_t user_err, StackPair* pair);

  MapReader* maps_;
  Options options_;
  uint64_t window_index_ = 0;
  // Stacks by hash, kept across windows: an off-CPU interval can end windows after the stack
  // captured at its start was drained. Entries unused for two windows are dropped; at most
  // options_.max_cached_stacks (kMaxCachedStacks).
  struct CachedStack {
    uint32_t offset = 0;  // of the first ip in ip_pool_
    uint32_t length = 0;  // ips, at most PS_MAX_STACK_DEPTH
    uint32_t flags = 0;   // ps_stack.flags (user stacks: PS_UNWIND_*)
    uint64_t last_used_window = 0;
  };
  absl::flat_hash_map<uint64_t, CachedStack> stack_cache_;
  // The cached stacks' ips, back to back; compacted at the end of Collect (CompactIpPool), so
  // at most twice the live ips plus a window's new stacks. A vector per stack was thousands of
  // small allocations a window under process churn (each short-lived process's stacks differ, by
  // ASLR), made in the holes the last window's records left and kept across the per-window
  // malloc_trim: pages that stayed resident.
  std::vector<uint64_t> ip_pool_;
  // Off-CPU intervals the last thread scan left whole to BPF, their weight not final at its
  // boundary (bpf/abi.h ps_offcpu_weight_final): tid -> out_ns. At most PS_THREAD_MAP_ENTRIES.
  absl::flat_hash_map<uint32_t, uint64_t> deferred_;
  // This window's sums of uncaptured off-CPU intervals by tid (Collect clears it).
  absl::flat_hash_map<uint32_t, Uncaptured> uncaptured_;
  MapStats map_stats_;
};

}  // namespace parascope::collect
