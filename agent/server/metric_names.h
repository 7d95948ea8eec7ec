// Names of the metrics of SPEC section 7, shared by the components that report them (BPF counters
// via the agent, collector, symbolizer, exporters) so /metrics stays consistent. Types and label
// names are given next to each; counters end in _total, units are base units (seconds, bytes).
#pragma once

namespace parascope::server::metric_names {

// counter: samples taken (on-CPU samples placed in profiles).
inline constexpr char kSamples[] = "parascope_samples_total";
// counter, label "reason": samples lost, reasons below.
inline constexpr char kSamplesLost[] = "parascope_samples_lost_total";
inline constexpr char kReasonRingFull[] = "ring_full";
inline constexpr char kReasonMapFull[] = "map_full";
inline constexpr char kReasonStackFault[] = "stack_fault";
inline constexpr char kReasonUnwindCut[] = "unwind_cut_short";
// gauge: processes in the process table.
inline constexpr char kProcessesTracked[] = "parascope_processes_tracked";
// counter: frames that could not be symbolized.
inline constexpr char kSymbolizationMisses[] = "parascope_symbolization_misses_total";
// counter: profiles written by the file exporter.
inline constexpr char kProfilesWritten[] = "parascope_profiles_written_total";
// counter: profiles accepted by the remote endpoint.
inline constexpr char kProfilesPushed[] = "parascope_profiles_pushed_total";
// counter, label "code" (gRPC status name or HTTP status): failed push attempts.
inline constexpr char kPushFailures[] = "parascope_push_failures_total";
// counter: push attempts that were retries.
inline constexpr char kPushRetries[] = "parascope_push_retries_total";
// gauge: bytes waiting in the push queue.
inline constexpr char kQueueBytes[] = "parascope_queue_bytes";
// counter, label "reason" (e.g. "queue_full", "rejected"): profiles dropped before delivery.
inline constexpr char kQueueDrops[] = "parascope_queue_dropped_total";
// counter, label "program": BPF program run time (kernel.bpf_stats_enabled), seconds.
inline constexpr char kBpfRunTime[] = "parascope_bpf_run_time_seconds_total";

}  // namespace parascope::server::metric_names
