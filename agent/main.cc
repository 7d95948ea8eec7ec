// parascope: flags -> Config -> Validate -> RunAgent. Exit codes (SPEC section 7): 0 clean stop,
// 1 runtime or environment failure, 2 usage error; in command mode (`-- CMD`) the command's exit
// status (127: not found, 126: not executable, as a shell reports them).
#include <malloc.h>
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <iostream>
#include <optional>

#include "absl/flags/flag.h"
#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "agent/agent.h"
#include "agent/config/config.h"
#include "agent/config/config_file.h"
#include "agent/config/flags.h"
#include "agent/export/labels.h"
#include "agent/k8s/pods.h"
#include "agent/util/log.h"

ABSL_FLAG(std::string, config, "",
          "YAML file of flag values, keys named like the flags (deploy/config.example.yaml); "
          "flags given on the command line win");
ABSL_FLAG(std::string, log_format, "text",
          "text (\"<time> <level letter> <message>\") or json (one object a line: ts, level, "
          "msg)");
ABSL_FLAG(int32_t, sampling_frequency, 19, "on-CPU samples per second per CPU (Hz)");
ABSL_FLAG(absl::Duration, collect_interval, absl::Seconds(15),
          "window length: one profile per process per window");
ABSL_FLAG(absl::Duration, duration, absl::ZeroDuration(),
          "stop after this long, flushing the last partial window (0: until SIGINT/SIGTERM)");
ABSL_FLAG(std::string, pid, "", "profile only these processes, e.g. 123,456 (default: all)");
ABSL_FLAG(std::string, profiles, "cpu,off_cpu,wall,latency",
          "profile types to build: cpu, off_cpu, wall, latency (comma-separated)");
ABSL_FLAG(absl::Duration, off_cpu_min_duration, absl::ZeroDuration(),
          "ignore off-CPU intervals shorter than this");
ABSL_FLAG(int32_t, off_cpu_stack_rate, 1000,
          "off-CPU stack captures per second per thread; above it stacks are sampled and "
          "weighted (0: capture at every switch-out)");
ABSL_FLAG(
    int32_t, off_cpu_stack_budget, 1000,
    "off-CPU stack captures per second per CPU, all threads together; above it stacks are "
    "sampled and weighted, intervals of 100 ms or more still count exactly, and threads whose "
    "last wait lasted that long are captured within as many again (0: no budget)");
ABSL_FLAG(double, off_cpu_stack_cpu_budget, 0.5,
          "percent of each CPU the off-CPU stack captures may take; above it they are sampled "
          "like --off-cpu-stack-budget (the stricter of the two applies; 0: no limit in time)");
ABSL_FLAG(std::string, output_dir, "",
          "write DIR/<pid>/<start ticks>.<exec id>/<profile>-<t0 unix ms>.pb.gz (gzip pprof) each "
          "window");
ABSL_FLAG(int64_t, output_max_bytes, 0,
          "bound of --output-dir's profile files in bytes allocated on disk (at least 1 MiB); "
          "the oldest windows are deleted first (0: no bound)");
ABSL_FLAG(absl::Duration, output_max_age, absl::ZeroDuration(),
          "delete --output-dir's windows that started longer ago than this (0: keep them)");
ABSL_FLAG(int64_t, output_max_new_processes, 256,
          "new process directories --output-dir gets per window; past it, the profiles of "
          "processes already exited are merged into DIR/overflow/<part>/<profile>-<t0>.pb.gz, "
          "each sample labelled with its pid (process churn)");
ABSL_FLAG(std::string, log_level, "info", "debug, info, warning or error");
ABSL_FLAG(std::string, remote_url, "", "Pyroscope base URL, e.g. http://127.0.0.1:4040");
ABSL_FLAG(std::string, remote_protocol, "grpc",
          "grpc (HTTP/2; h2c for http://) or connect (unary over HTTP/1.1)");
ABSL_FLAG(std::string, tenant_id, "", "tenant sent as X-Scope-OrgID");
ABSL_FLAG(std::string, basic_auth_user, "", "basic auth user (password from a file)");
ABSL_FLAG(std::string, basic_auth_password_file, "", "file holding the basic auth password");
ABSL_FLAG(std::string, bearer_token_file, "", "file holding a bearer token");
ABSL_FLAG(std::vector<std::string>, remote_header, {},
          "extra request header K=V (repeatable)");
ABSL_FLAG(std::string, tls_ca_file, "", "CA bundle to verify the server (https)");
ABSL_FLAG(std::string, tls_cert_file, "", "client certificate (mutual TLS)");
ABSL_FLAG(std::string, tls_key_file, "", "client key (mutual TLS)");
ABSL_FLAG(std::vector<std::string>, external_label, {},
          "label K=V added to every pushed series (repeatable)");
ABSL_FLAG(std::string, service_name, "", "service_name of pushed series for a --pid run");
ABSL_FLAG(bool, pid_label, false, "add a pid label to pushed series (high cardinality)");
ABSL_FLAG(int64_t, queue_max_bytes, int64_t{64} << 20,
          "bound of the push queue in bytes; the oldest profiles are dropped beyond it");
ABSL_FLAG(std::string, symbolize, "agent",
          "agent: name frames here (ELF symbols, DWARF lines and inlines); server: send ELF "
          "addresses with build ids for the server's symbolizer (Pyroscope, debuginfod)");
ABSL_FLAG(std::vector<std::string>, debug_dirs, {"/usr/lib/debug"},
          "directories of separate debug files (.build-id/xx/yyyy.debug, or the binary's path "
          "below them for .gnu_debuglink), comma-separated, searched in order");
ABSL_FLAG(std::string, debuginfod_urls, "",
          "debuginfod servers for debug files the --debug-dirs lack, space-separated (e.g. "
          "\"https://debuginfod.debian.net\"); fetched in the background, used from a later "
          "window on. Empty: off (the DEBUGINFOD_URLS environment variable is not read)");
ABSL_FLAG(std::string, debuginfod_cache_dir, "/var/cache/parascope/debuginfod",
          "where debug files from --debuginfod-urls are kept (<dir>/<build id>/debuginfo)");
ABSL_FLAG(int64_t, debuginfod_cache_max_bytes, int64_t{1} << 30,
          "bound of --debuginfod-cache-dir in bytes; least recently used debug files are "
          "deleted beyond it");
ABSL_FLAG(int64_t, unwind_table_bytes, int64_t{32} << 20,
          "BPF memory for .eh_frame unwind tables in bytes (16 per row; libc takes ~450 KiB); "
          "unused tables are evicted least recently used first, code without a table is unwound "
          "with frame pointers");
ABSL_FLAG(absl::Duration, shutdown_timeout, absl::Seconds(5),
          "on SIGTERM, how long to keep delivering queued profiles");
ABSL_FLAG(std::string, http_address, "127.0.0.1:7070",
          "address of /metrics, /healthz and /readyz (empty: no HTTP server)");
ABSL_FLAG(bool, print_summary, false,
          "at exit, print the busiest processes and their top functions by CPU");
ABSL_FLAG(int32_t, summary_processes, 5, "processes shown by --print-summary");
ABSL_FLAG(int32_t, summary_functions, 8, "functions per process shown by --print-summary");
ABSL_FLAG(std::string, latency_group, "process",
          "what shares one parallelism count in the latency profile: process (each process), "
          "cgroup (each cgroup v2: a systemd unit, a container; latency profiles written per "
          "cgroup) or tree (a command and its descendants; the default in command mode, "
          "parascope [flags] -- CMD ARGS...)");
ABSL_FLAG(std::string, kubernetes, "auto",
          "Kubernetes pod metadata (namespace, pod, container, node labels): auto (on when "
          "KUBERNETES_SERVICE_HOST is set, as in a pod), true or false");
ABSL_FLAG(std::string, kubernetes_api_url, "",
          "API server URL (default in a pod: https://$KUBERNETES_SERVICE_HOST:"
          "$KUBERNETES_SERVICE_PORT)");
ABSL_FLAG(std::string, kubernetes_node_name, "",
          "this node's name: only its pods are watched (default: $NODE_NAME, set from the "
          "downward API's spec.nodeName)");
ABSL_FLAG(std::string, kubernetes_token_file,
          "/var/run/secrets/kubernetes.io/serviceaccount/token",
          "bearer token for the API server, read again before each request (empty: none)");
ABSL_FLAG(std::string, kubernetes_ca_file, "/var/run/secrets/kubernetes.io/serviceaccount/ca.crt",
          "CA bundle that signed the API server's certificate (https)");
ABSL_FLAG(std::vector<std::string>, target_namespaces, {},
          "profile only processes of pods in these namespaces (comma-separated; default: all "
          "processes)");
ABSL_FLAG(std::string, target_pod_selector, "",
          "profile only processes of pods whose labels match this label selector, e.g. "
          "\"app=web,tier in (front,api),!canary\" (default: all processes)");

namespace {

// Where each flag set by --config came from ("FILE:LINE"), and the command line: a range check
// that fails on a value from the file names the file (the command line's value wins otherwise).
std::map<std::string, std::string> g_config_origins;
std::vector<std::string> g_argv;

bool OnCommandLine(const std::string& underscored);

// True when the flag was given on the command line or in the --config file.
bool Explicit(const std::string& underscored) {
  return OnCommandLine(underscored) || g_config_origins.count(underscored) > 0;
}

bool OnCommandLine(const std::string& underscored) {
  for (const std::string& a : g_argv) {
    if (a == "--") break;
    std::string name = a.substr(0, a.find('='));
    std::replace(name.begin(), name.end(), '_', '-');
    std::string dashed = underscored;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (name == "--" + dashed || name == "-" + dashed || name == "--no" + dashed) return true;
  }
  return false;
}

int UsageError(const std::string& message) {
  std::string text = message;
  for (const auto& [name, origin] : g_config_origins) {
    std::string dashed = name;
    std::replace(dashed.begin(), dashed.end(), '_', '-');
    if (absl::StartsWith(text, "--" + dashed + ":") && !OnCommandLine(name)) {
      text += " (set in " + origin + ")";
      break;
    }
  }
  std::fprintf(stderr, "parascope: %s\nRun 'parascope --help' for the flags.\n", text.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  // Allocations of 128 KiB or more that free heap space cannot serve are mmap(2)ed, and
  // unmapped when freed (mallopt(3) M_MMAP_THRESHOLD). glibc's default raises that threshold
  // to the largest mmapped block freed so far (up to 32 MiB on 64-bit), after which libdw's
  // decompressed debug sections (megabytes each, libc6-dbg's file) and a window's record
  // arrays come from the heap and stay in RSS as free space until a trim can reach them.
  // Setting it turns that adjustment off (and overrides a GLIBC_TUNABLES value). Measured, 60 s
  // of process churn: RSS at the end 63 MiB -> 57 MiB.
  mallopt(M_MMAP_THRESHOLD, 128 * 1024);
  // Block the handled signals before any thread exists; the agent reads them from a signalfd.
  const sigset_t handled = parascope::HandledSignals();
  sigprocmask(SIG_BLOCK, &handled, nullptr);
  // A push connection closed by the server must be an error, not a kill (signal(7)).
  signal(SIGPIPE, SIG_IGN);
  // Command mode reaps its command with waitpid(2): an ignored SIGCHLD inherited from the parent
  // would make the kernel reap it first and lose its exit status.
  signal(SIGCHLD, SIG_DFL);

  // The config file first, so that the command line's flags override it.
  if (std::optional<std::string> file = parascope::FindConfigFlag(argc, argv); file) {
    g_argv.assign(argv + 1, argv + argc);
    if (absl::Status s =
            parascope::ApplyConfigFile(*file, "agent/main.cc", nullptr, &g_config_origins);
        !s.ok()) {
      return UsageError(std::string(s.message()));
    }
  }
  std::vector<std::string> positional, command;
  bool help = false;
  if (absl::Status s = parascope::ParseFlags(argc, argv, &positional, &help, &command); !s.ok()) {
    return UsageError(std::string(s.message()));
  }
  if (help) {
    std::cout << parascope::FlagsHelp("parascope", "agent/main.cc");
    return 0;
  }
  if (!positional.empty()) {
    return UsageError("unexpected argument '" + positional[0] +
                      "' (to profile a command, put it after '--': parascope [flags] -- CMD)");
  }
  if (g_argv.empty()) g_argv.assign(argv + 1, argv + argc);

  parascope::Config config;
  config.sampling_frequency_hz = absl::GetFlag(FLAGS_sampling_frequency);
  config.collect_interval = absl::GetFlag(FLAGS_collect_interval);
  config.duration = absl::GetFlag(FLAGS_duration);
  auto pids = parascope::ParsePidList(absl::GetFlag(FLAGS_pid));
  if (!pids.ok()) return UsageError("--pid: " + std::string(pids.status().message()));
  config.pids = *pids;
  auto profiles = parascope::ParseProfileTypes(absl::GetFlag(FLAGS_profiles));
  if (!profiles.ok()) return UsageError("--profiles: " + std::string(profiles.status().message()));
  config.profiles = *profiles;
  config.off_cpu_min_duration = absl::GetFlag(FLAGS_off_cpu_min_duration);
  config.off_cpu_stack_rate = absl::GetFlag(FLAGS_off_cpu_stack_rate);
  config.off_cpu_stack_budget = absl::GetFlag(FLAGS_off_cpu_stack_budget);
  config.off_cpu_stack_cpu_budget = absl::GetFlag(FLAGS_off_cpu_stack_cpu_budget);
  config.output_dir = absl::GetFlag(FLAGS_output_dir);
  config.output_max_bytes = absl::GetFlag(FLAGS_output_max_bytes);
  config.output_max_age = absl::GetFlag(FLAGS_output_max_age);
  config.output_max_new_processes = absl::GetFlag(FLAGS_output_max_new_processes);
  const std::string log_format = absl::GetFlag(FLAGS_log_format);
  if (log_format != "text" && log_format != "json") {
    return UsageError("--log-format: expected text or json, got '" + log_format + "'");
  }
  if (!parascope::ParseLogLevel(absl::GetFlag(FLAGS_log_level), &config.log_level)) {
    return UsageError("--log-level: expected debug, info, warning or error, got '" +
                      absl::GetFlag(FLAGS_log_level) + "'");
  }
  config.remote_url = absl::GetFlag(FLAGS_remote_url);
  config.remote_protocol = absl::GetFlag(FLAGS_remote_protocol);
  config.tenant_id = absl::GetFlag(FLAGS_tenant_id);
  config.basic_auth_user = absl::GetFlag(FLAGS_basic_auth_user);
  config.basic_auth_password_file = absl::GetFlag(FLAGS_basic_auth_password_file);
  config.bearer_token_file = absl::GetFlag(FLAGS_bearer_token_file);
  auto headers = parascope::ParseKeyValues(absl::GetFlag(FLAGS_remote_header));
  if (!headers.ok()) return UsageError("--remote-header: " + std::string(headers.status().message()));
  config.remote_headers = *headers;
  config.tls_ca_file = absl::GetFlag(FLAGS_tls_ca_file);
  config.tls_cert_file = absl::GetFlag(FLAGS_tls_cert_file);
  config.tls_key_file = absl::GetFlag(FLAGS_tls_key_file);
  auto external = parascope::ParseKeyValues(absl::GetFlag(FLAGS_external_label));
  if (!external.ok()) {
    return UsageError("--external-label: " + std::string(external.status().message()));
  }
  config.external_labels = *external;
  config.service_name = absl::GetFlag(FLAGS_service_name);
  config.pid_label = absl::GetFlag(FLAGS_pid_label);
  config.queue_max_bytes = absl::GetFlag(FLAGS_queue_max_bytes);
  config.shutdown_timeout = absl::GetFlag(FLAGS_shutdown_timeout);
  config.unwind_table_bytes = absl::GetFlag(FLAGS_unwind_table_bytes);
  config.debug_dirs = absl::GetFlag(FLAGS_debug_dirs);
  const std::string symbolize_mode = absl::GetFlag(FLAGS_symbolize);
  if (symbolize_mode != "agent" && symbolize_mode != "server") {
    return UsageError("--symbolize: expected agent or server, got '" + symbolize_mode + "'");
  }
  config.symbolize_server = symbolize_mode == "server";
  config.debuginfod_urls = parascope::SplitUrls(absl::GetFlag(FLAGS_debuginfod_urls));
  config.debuginfod_cache_dir = absl::GetFlag(FLAGS_debuginfod_cache_dir);
  config.debuginfod_cache_max_bytes = absl::GetFlag(FLAGS_debuginfod_cache_max_bytes);
  config.http_address = absl::GetFlag(FLAGS_http_address);
  config.print_summary = absl::GetFlag(FLAGS_print_summary);
  config.summary_processes = absl::GetFlag(FLAGS_summary_processes);
  config.summary_functions = absl::GetFlag(FLAGS_summary_functions);
  config.command = command;
  const std::string group = absl::GetFlag(FLAGS_latency_group);
  if (group == "process") {
    // Command mode counts parallelism over the command's tree unless told otherwise.
    config.latency_group = !command.empty() && !Explicit("latency_group")
                               ? parascope::Config::LatencyGroup::kTree
                               : parascope::Config::LatencyGroup::kProcess;
  } else if (group == "cgroup") {
    config.latency_group = parascope::Config::LatencyGroup::kCgroup;
  } else if (group == "tree") {
    config.latency_group = parascope::Config::LatencyGroup::kTree;
  } else {
    return UsageError("--latency-group: expected process, cgroup or tree, got '" + group + "'");
  }
  const std::string kubernetes = absl::GetFlag(FLAGS_kubernetes);
  const char* service_host = std::getenv("KUBERNETES_SERVICE_HOST");
  const char* node_env = std::getenv("NODE_NAME");
  // auto: on in a pod that says which node it is on (the DaemonSet), never in command mode (a
  // profiled build in a CI pod is no node agent).
  std::string auto_off_reason;
  if (kubernetes == "auto") {
    const bool in_pod = service_host != nullptr && *service_host != '\0';
    const bool node_known = !absl::GetFlag(FLAGS_kubernetes_node_name).empty() ||
                            (node_env != nullptr && *node_env != '\0');
    config.kubernetes = in_pod && node_known && command.empty();
    if (in_pod && !config.kubernetes) {
      auto_off_reason = command.empty() ? "NODE_NAME is not set (the DaemonSet sets it from the "
                                          "downward API; or give --kubernetes-node-name)"
                                        : "command mode";
    }
  } else if (kubernetes == "true" || kubernetes == "false") {
    config.kubernetes = kubernetes == "true";
  } else {
    return UsageError("--kubernetes: expected auto, true or false, got '" + kubernetes + "'");
  }
  config.kubernetes_api_url = absl::GetFlag(FLAGS_kubernetes_api_url);
  if (config.kubernetes_api_url.empty() && service_host != nullptr && *service_host != '\0') {
    // The in-cluster address (client-go rest.InClusterConfig); an IPv6 host needs brackets.
    const char* port = std::getenv("KUBERNETES_SERVICE_PORT");
    std::string host = service_host;
    if (host.find(':') != std::string::npos) host = "[" + host + "]";
    config.kubernetes_api_url =
        "https://" + host + ":" + (port != nullptr && *port != '\0' ? port : "443");
  }
  config.kubernetes_node_name = absl::GetFlag(FLAGS_kubernetes_node_name);
  if (config.kubernetes_node_name.empty() && node_env != nullptr) {
    config.kubernetes_node_name = node_env;
  }
  config.kubernetes_token_file = absl::GetFlag(FLAGS_kubernetes_token_file);
  config.kubernetes_ca_file = absl::GetFlag(FLAGS_kubernetes_ca_file);
  for (const std::string& ns : absl::GetFlag(FLAGS_target_namespaces)) {
    if (!ns.empty()) config.target_namespaces.push_back(ns);
  }
  config.target_pod_selector = absl::GetFlag(FLAGS_target_pod_selector);
  if (auto sel = parascope::k8s::LabelSelector::Parse(config.target_pod_selector); !sel.ok()) {
    return UsageError("--target-pod-selector: " + std::string(sel.status().message()));
  }
  if (absl::Status s = parascope::ValidateExternalLabels(
          config.external_labels, absl::GetFlag(FLAGS_pid_label), config.kubernetes);
      !s.ok()) {
    return UsageError("--external-label: " + std::string(s.message()));
  }
  if (!command.empty()) {
    // Command mode, like `perf record -- CMD`: the summary is printed, profiles are written to
    // ./profiles unless sent elsewhere, and no HTTP server is started unless asked for (a
    // daemon may hold the default port).
    config.print_summary = true;
    if (config.output_dir.empty() && config.remote_url.empty()) config.output_dir = "profiles";
    if (!Explicit("http_address")) config.http_address.clear();
  }
  if (absl::Status s = config.Validate(); !s.ok()) return UsageError(std::string(s.message()));

  parascope::SetLogLevel(config.log_level);
  parascope::SetLogFormat(log_format == "json" ? parascope::LogFormat::kJson
                                               : parascope::LogFormat::kText);
  if (!auto_off_reason.empty()) {
    parascope::Log(parascope::LogLevel::kInfo,
                   "kubernetes: off (--kubernetes=auto in a pod, but %s): no pod labels",
                   auto_off_reason);
  }
  int exit_status = 0;
  if (absl::Status s = parascope::RunAgent(config, &exit_status); !s.ok()) {
    parascope::Log(parascope::LogLevel::kError, "%s", std::string(s.message()));
    return exit_status != 0 ? exit_status : 1;
  }
  return exit_status;
}
