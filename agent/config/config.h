// Agent configuration: what main's flags (SPEC section 5) turn into, validated once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "agent/profile/profile_set.h"
#include "agent/util/log.h"

namespace parascope {

struct Config {
  // On-CPU samples per second per CPU (perf_event_attr.sample_freq), Hz.
  int32_t sampling_frequency_hz = 19;
  // Window length; each window yields one profile per process and type.
  absl::Duration collect_interval = absl::Seconds(15);
  // Stop after this long (the last window is partial); zero = until SIGINT/SIGTERM.
  absl::Duration duration = absl::ZeroDuration();
  // Profile only these tgids (all their threads); empty = every process.
  std::vector<uint32_t> pids;
  // Which profiles to build (--profiles).
  ProfileTypes profiles;
  // --latency-group (SPEC section 2): what shares one parallelism count. kProcess: each process
  // (tgid); kCgroup: each cgroup v2 (latency profiles are then written per cgroup); kTree: a
  // process and its descendants (command mode only).
  enum class LatencyGroup { kProcess, kCgroup, kTree };
  LatencyGroup latency_group = LatencyGroup::kProcess;
  // Command mode (`parascope [flags] -- CMD ARGS...`): the command to run; it and every process
  // it starts are profiled as one tree until it exits. Empty: the daemon.
  std::vector<std::string> command;
  // Off-CPU intervals shorter than this are ignored (--off-cpu-min-duration).
  absl::Duration off_cpu_min_duration = absl::ZeroDuration();
  // Off-CPU stack captures per second per thread before stacks are sampled with unbiased weights
  // (--off-cpu-stack-rate; bpf/abi.h PS_RATE_PERIOD_NS); 0 captures every switch-out.
  int32_t off_cpu_stack_rate = 1000;
  // Off-CPU stack captures per second per CPU, over all its threads, before they are sampled
  // with unbiased weights (--off-cpu-stack-budget; bpf/abi.h PS_BUDGET_EXACT_OFFCPU_NS); 0: no
  // budget.
  int32_t off_cpu_stack_budget = 1000;
  // Percent of each CPU its off-CPU stack captures may take before they are sampled with
  // unbiased weights (--off-cpu-stack-cpu-budget; bpf/abi.h, the budget in CPU time); the
  // stricter of this and off_cpu_stack_budget applies. 0: no limit in time. In [0, 100].
  double off_cpu_stack_cpu_budget = 0.5;
  // Write DIR/<pid>/<start ticks>.<exec id>/<name>-<t0 unix ms>.pb.gz; empty = no files.
  std::string output_dir;
  // Retention of output_dir (export/retention.h): bound of the profile files' allocated bytes
  // (0 = none) and of a window's age (zero = none); the oldest windows are deleted first.
  int64_t output_max_bytes = 0;
  absl::Duration output_max_age = absl::ZeroDuration();
  // Process directories output_dir gets per window before the profiles of exited processes are
  // merged into DIR/overflow/ (export/file_exporter.h, "Process churn"); >= 0.
  int64_t output_max_new_processes = 256;
  LogLevel log_level = LogLevel::kInfo;

  // Pyroscope push (SPEC sections 4-6). Empty remote_url: no push.
  std::string remote_url;
  std::string remote_protocol = "grpc";  // "grpc" or "connect"
  std::string tenant_id;                 // X-Scope-OrgID
  std::string basic_auth_user;
  std::string basic_auth_password_file;  // secrets only from files, never argv
  std::string bearer_token_file;
  std::vector<std::pair<std::string, std::string>> remote_headers;  // --remote-header K=V
  std::string tls_ca_file, tls_cert_file, tls_key_file;
  std::vector<std::pair<std::string, std::string>> external_labels;  // --external-label K=V
  std::string service_name;  // --service-name (for --pid runs)
  bool pid_label = false;    // --pid-label
  int64_t queue_max_bytes = int64_t{64} << 20;
  // --unwind-table-bytes: BPF array memory for unwind table rows (agent/unwind/).
  int64_t unwind_table_bytes = int64_t{32} << 20;
  // --symbolize=server: leave ELF frames to the server (StackSymbolizer::SetServerSide).
  bool symbolize_server = false;
  // Global directories of separate debug files (.build-id/ and mirrored paths), searched in order.
  std::vector<std::string> debug_dirs = {"/usr/lib/debug"};
  // debuginfod servers for debug files no debug dir has (--debuginfod-urls, space-separated like
  // DEBUGINFOD_URLS, which itself is not read); empty = off. Fetched in the background into
  // debuginfod_cache_dir, bounded to debuginfod_cache_max_bytes (symbolize/debuginfod.h).
  std::vector<std::string> debuginfod_urls;
  std::string debuginfod_cache_dir = "/var/cache/parascope/debuginfod";
  int64_t debuginfod_cache_max_bytes = int64_t{1} << 30;
  absl::Duration shutdown_timeout = absl::Seconds(5);
  // /metrics, /healthz, /readyz; empty = no HTTP server.
  std::string http_address = "127.0.0.1:7070";
  // Kubernetes metadata (agent/k8s/, SPEC section 4): the pods of kubernetes_node_name, listed
  // and watched on the API server, label each pushed series with namespace, pod, container and
  // node. main resolves --kubernetes=auto and the in-cluster defaults (environment, service
  // account files) before Validate.
  bool kubernetes = false;
  std::string kubernetes_api_url;     // "https://<KUBERNETES_SERVICE_HOST>:<..._PORT>"
  std::string kubernetes_node_name;   // $NODE_NAME (downward API spec.nodeName)
  std::string kubernetes_token_file;  // the service account token, re-read per request
  std::string kubernetes_ca_file;     // the service account CA bundle
  // --target-namespaces, --target-pod-selector: profile only processes of pods in these
  // namespaces whose labels match (label selector syntax, agent/k8s/pods.h); empty = all.
  std::vector<std::string> target_namespaces;
  std::string target_pod_selector;
  // At exit, print the busiest processes and their top functions to stdout.
  bool print_summary = false;
  int32_t summary_processes = 5;
  int32_t summary_functions = 8;

  // Checks ranges and combinations. InvalidArgument whose message starts with the offending
  // flag, e.g. "--sampling-frequency: must be in [1, 10000], got 0".
  absl::Status Validate() const;
};

// Parses "K=V" items (e.g. --remote-header, --external-label). InvalidArgument naming the item
// when it has no '=' or an empty key.
absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    const std::vector<std::string>& items);

// Reads a secret from a file (trailing newline removed). Errors name the file, never its content.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

// Splits --debuginfod-urls' value on spaces (and tabs) like libdebuginfod's DEBUGINFOD_URLS;
// empty items are skipped, so "" is no URL.
std::vector<std::string> SplitUrls(absl::string_view text);

// Parses "123,456" into tgids. InvalidArgument on an empty item, a non-number or 0.
absl::StatusOr<std::vector<uint32_t>> ParsePidList(absl::string_view text);

}  // namespace parascope
