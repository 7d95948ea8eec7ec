#include "agent/config/config.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "agent/proc/read_file.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bpf/abi.h"

namespace parascope {

absl::Status Config::Validate() const {
  // 10 kHz keeps well under the kernel's default kernel.perf_event_max_sample_rate (100000,
  // lowered automatically when sampling takes too long: kernel/events/core.c).
  if (sampling_frequency_hz < 1 || sampling_frequency_hz > 10000) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sampling-frequency: must be in [1, 10000] Hz, got ", sampling_frequency_hz));
  }
  if (collect_interval < absl::Milliseconds(100) || collect_interval > absl::Hours(1)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--collect-interval: must be in [100ms, 1h], got ", absl::FormatDuration(collect_interval)));
  }
  if (duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--duration: must not be negative, got ", absl::FormatDuration(duration)));
  }
  if (off_cpu_min_duration < absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--off-cpu-min-duration: must not be negative, got ",
        absl::FormatDuration(off_cpu_min_duration)));
  }
  if (off_cpu_stack_rate < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--off-cpu-stack-rate: must not be negative, got ", off_cpu_stack_rate));
  }
  if (off_cpu_stack_budget < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--off-cpu-stack-budget: must not be negative, got ", off_cpu_stack_budget));
  }
  if (!(off_cpu_stack_cpu_budget >= 0 && off_cpu_stack_cpu_budget <= 100)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--off-cpu-stack-cpu-budget: must be a percentage from 0 to 100, got ",
                     off_cpu_stack_cpu_budget));
  }
  if (!remote_url.empty()) {
    if (!absl::StartsWith(remote_url, "http://") && !absl::StartsWith(remote_url, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--remote-url: must start with http:// or https://, got '", remote_url, "'"));
    }
    if (remote_protocol != "grpc" && remote_protocol != "connect") {
      return absl::InvalidArgumentError(absl::StrCat(
          "--remote-protocol: must be grpc or connect, got '", remote_protocol, "'"));
    }
  }
  if (output_max_bytes < 0 || (output_max_bytes > 0 && output_max_bytes < (int64_t{1} << 20))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--output-max-bytes: must be 0 (no bound) or at least 1048576 (1 MiB), got ",
        output_max_bytes));
  }
  if (output_max_age < absl::ZeroDuration() ||
      (output_max_age > absl::ZeroDuration() && output_max_age < collect_interval)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--output-max-age: must be 0 (no bound) or at least --collect-interval (",
        absl::FormatDuration(collect_interval), "), got ", absl::FormatDuration(output_max_age)));
  }
  if (output_max_new_processes < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--output-max-new-processes: must be 0 or more, got ", output_max_new_processes));
  }
  if ((output_max_bytes > 0 || output_max_age > absl::ZeroDuration()) && output_dir.empty()) {
    return absl::InvalidArgumentError(
        output_max_bytes > 0 ? "--output-max-bytes: needs --output-dir"
                             : "--output-max-age: needs --output-dir");
  }
  if (queue_max_bytes < 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("--queue-max-bytes: must be at least 1024, got ", queue_max_bytes));
  }
  // At least libc's table (~450 KiB); at most 16 GiB (2^30 rows).
  if (unwind_table_bytes < (int64_t{1} << 20) || unwind_table_bytes > (int64_t{16} << 30)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--unwind-table-bytes: must be between 1048576 (1 MiB) and 17179869184 (16 GiB), got ",
        unwind_table_bytes));
  }
  if (shutdown_timeout < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--shutdown-timeout: must not be negative");
  }
  if (!basic_auth_password_file.empty() && basic_auth_user.empty()) {
    return absl::InvalidArgumentError(
        "--basic-auth-password-file: needs --basic-auth-user as well");
  }
  if (latency_group == LatencyGroup::kTree && command.empty()) {
    return absl::InvalidArgumentError(
        "--latency-group: tree needs command mode (parascope [flags] -- CMD ARGS...)");
  }
  if (!command.empty() && !pids.empty()) {
    return absl::InvalidArgumentError(
        "--pid: cannot be combined with a command (command mode profiles the command's "
        "processes)");
  }
  if (latency_group == LatencyGroup::kCgroup && !profiles.has(ProfileType::kLatency)) {
    return absl::InvalidArgumentError(
        "--latency-group: cgroup needs the latency profile (--profiles=...,latency)");
  }
  if (pids.size() > PS_PID_FILTER_ENTRIES) {
    return absl::InvalidArgumentError(absl::StrCat("--pid: at most ", PS_PID_FILTER_ENTRIES,
                                                   " pids, got ", pids.size()));
  }
  for (const std::string& d : debug_dirs) {
    if (d.empty() || d[0] != '/') {
      return absl::InvalidArgumentError(
          absl::StrCat("--debug-dirs: '", d, "' is not an absolute directory"));
    }
  }
  for (const std::string& u : debuginfod_urls) {
    // The schemes libdebuginfod lets libcurl use (CURLOPT_PROTOCOLS in debuginfod-client.c).
    if (!absl::StartsWith(u, "http://") && !absl::StartsWith(u, "https://") &&
        !absl::StartsWith(u, "file://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--debuginfod-urls: '", u, "' must start with http://, https:// or file://"));
    }
  }
  if (!debuginfod_urls.empty() && symbolize_server) {
    return absl::InvalidArgumentError(
        "--debuginfod-urls: needs --symbolize=agent (with server-side symbolization the server "
        "fetches debug info)");
  }
  if (debuginfod_cache_dir.empty() || debuginfod_cache_dir[0] != '/') {
    return absl::InvalidArgumentError(absl::StrCat(
        "--debuginfod-cache-dir: '", debuginfod_cache_dir, "' is not an absolute directory"));
  }
  if (debuginfod_cache_max_bytes < (int64_t{1} << 20)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--debuginfod-cache-max-bytes: must be at least 1048576 (1 MiB), got ",
        debuginfod_cache_max_bytes));
  }
  if (kubernetes) {
    if (kubernetes_node_name.empty()) {
      return absl::InvalidArgumentError(
          "--kubernetes-node-name: needed with Kubernetes metadata (set the NODE_NAME "
          "environment variable from the downward API, fieldRef spec.nodeName)");
    }
    if (!absl::StartsWith(kubernetes_api_url, "http://") &&
        !absl::StartsWith(kubernetes_api_url, "https://")) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kubernetes-api-url: '", kubernetes_api_url,
          "' is not an http(s):// URL (in a pod it defaults to https://$KUBERNETES_SERVICE_HOST:"
          "$KUBERNETES_SERVICE_PORT)"));
    }
  }
  const bool targeting = !target_namespaces.empty() || !target_pod_selector.empty();
  if (targeting && !kubernetes) {
    return absl::InvalidArgumentError(absl::StrCat(
        target_namespaces.empty() ? "--target-pod-selector" : "--target-namespaces",
        ": needs Kubernetes metadata (--kubernetes=true, or run in a pod)"));
  }
  if (targeting && !command.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        target_namespaces.empty() ? "--target-pod-selector" : "--target-namespaces",
        ": cannot be combined with a command (command mode profiles the command's processes)"));
  }
  for (const std::string& ns : target_namespaces) {
    bool ok = !ns.empty() && ns.size() <= 63;
    for (char c : ns) ok = ok && ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-');
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("--target-namespaces: '", ns, "' is not a namespace name (RFC 1123 label)"));
    }
  }
  if (summary_processes < 1 || summary_functions < 1) {
    return absl::InvalidArgumentError("--summary-processes/--summary-functions: must be >= 1");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseKeyValues(
    const std::vector<std::string>& items) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& item : items) {
    if (item.empty()) continue;
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) {
      return absl::InvalidArgumentError(absl::StrCat("'", item, "' is not KEY=VALUE"));
    }
    out.emplace_back(item.substr(0, eq), item.substr(eq + 1));
  }
  return out;
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  auto text = proc::ReadFileToString(path);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("cannot read secret file ", path, ": ",
                                     text.status().code() == absl::StatusCode::kNotFound
                                         ? "no such file"
                                         : "unreadable"));
  }
  std::string s = *std::move(text);
  while (!s.empty() && (s.back() == '\n' || s.back() == '\r')) s.pop_back();
  return s;
}

std::vector<std::string> SplitUrls(absl::string_view text) {
  return absl::StrSplit(text, absl::ByAnyChar(" \t\n"), absl::SkipEmpty());
}

absl::StatusOr<std::vector<uint32_t>> ParsePidList(absl::string_view text) {
  std::vector<uint32_t> out;
  if (text.empty()) return out;
  for (absl::string_view item : absl::StrSplit(text, ',')) {
    uint32_t pid = 0;
    if (!absl::SimpleAtoi(item, &pid) || pid == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("'", item, "' is not a process id (a positive integer)"));
    }
    out.push_back(pid);
  }
  return out;
}

}  // namespace parascope
