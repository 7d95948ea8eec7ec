// Series labels of pushed profiles (SPEC section 4): `__name__`, `service_name`, `hostname`,
// Kubernetes labels where known, `--external-label` pairs and the opt-in `pid`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "agent/proc/process_table.h"

namespace parascope {

// SPEC section 4 limits (they match Pyroscope's default max_label_names_per_series and
// max_label_value_length, which count `__name__` as a label).
inline constexpr size_t kMaxSeriesLabels = 30;
inline constexpr size_t kMaxLabelValueBytes = 2048;

using Label = std::pair<std::string, std::string>;
using LabelList = std::vector<Label>;

// Kubernetes metadata of a process (agent/k8s/: container id and pod UID from its cgroup path,
// names from the API server's pods of this node).
struct KubernetesInfo {
  std::string namespace_name;
  std::string pod;
  std::string container;
  std::string node;
  // The container id's first 12 hex digits (as `docker ps`/`crictl ps` show it), set only when
  // `container` is not known: the API server is unreachable or has not described the pod yet.
  // Series then carry `container_id` instead of `container`, so containers stay apart.
  std::string container_id;
  // The pod's parascope.io/service-name annotation: overrides the derived service_name.
  std::string service_name;
  // False when the cgroup names a pod the API server has not described (yet), or a container its
  // pod does not list (yet: the kubelet reports a new container's id a moment after it starts;
  // never: the pod's sandbox). The labeler then asks again in a later window, once `generation`
  // differs from LabelOptions::kubernetes_generation() (the pods changed).
  bool complete = true;
  uint64_t generation = 0;
};
// Returns the metadata of the process whose /proc/<pid>/cgroup text is `cgroup` (may be "" when
// the process is gone: the lookup may know its cgroup from elsewhere), or nullopt when it is not
// in a pod. Called once per process, and again while the result is not complete (above).
using KubernetesLookup =
    std::function<std::optional<KubernetesInfo>(const proc::ProcessKey&, absl::string_view cgroup)>;

struct LabelOptions {
  std::string hostname;             // "" = gethostname(2) at construction
  std::string service_name;         // --service-name: used when pid_filter_run
  bool pid_filter_run = false;      // --pid was given
  LabelList external;               // --external-label K=V, in flag order
  bool pid_label = false;           // --pid-label
  std::string proc_root = "/proc";  // a fixture directory in tests
  KubernetesLookup kubernetes;      // nullptr: not on Kubernetes
  // The pods' current generation (k8s::PodStore::generation()); nullptr: never look again.
  std::function<uint64_t()> kubernetes_generation;
  size_t max_cached_processes = 32768;
};

// Checks a label name against [a-zA-Z_][a-zA-Z0-9_]*. InvalidArgument naming the label.
absl::Status ValidateLabelName(absl::string_view name);

// Validates --external-label pairs for config validation: names per ValidateLabelName, not
// starting with "__" and not one the agent sets itself (`service_name`, `hostname`, `pid`,
// `namespace`, `pod`, `container`, `node`; use --service-name for the service), no duplicates;
// values non-empty, valid UTF-8, at most kMaxLabelValueBytes; and the total with the agent's
// labels (3, plus `pid` with pid_label, plus 4 with kubernetes) at most kMaxSeriesLabels.
// InvalidArgument naming the offending label.
absl::Status ValidateExternalLabels(const LabelList& external, bool pid_label = false,
                                    bool kubernetes = false);

// Parses one --external-label value "K=V" (split at the first '='; V may contain '='). Does not
// validate beyond the shape; InvalidArgument when there is no '=' or K is empty.
absl::StatusOr<Label> ParseExternalLabel(absl::string_view flag_value);

// Makes a value derived from a process (environment, cgroup, executable) acceptable to the
// server: bytes that are not valid UTF-8 become '?', and the result is cut to at most
// kMaxLabelValueBytes without splitting a UTF-8 sequence.
std::string SanitizeLabelValue(absl::string_view value);

// Returns the value of the first `name`=value entry of /proc/<pid>/environ text (NUL-separated
// "NAME=value" entries, man 5 proc; the environment as of execve, later setenv() calls are not
// visible), or nullopt when absent.
std::optional<std::string> EnvironValue(absl::string_view environ, absl::string_view name);

// What the agent learns from /proc/<pid>/cgroup (man 7 cgroups: "hierarchy-ID:controllers:path"
// lines; cgroup v2 has the single line "0::<path>").
struct CgroupInfo {
  // The cgroup v2 path ("0::" line) unless it is "/" or absent, else the v1 "name=systemd"
  // hierarchy's path, else the first non-"/" path; "" when none.
  std::string path;
  // The deepest "<unit>.service" component of `path`, without ".service", ignoring
  // "user@<uid>.service" (per-user managers); "" when none, or when only components above a
  // container's are services (a container's processes are not labeled by the unit that runs the
  // container engine). session-*.scope, init.scope and slices are never units here.
  std::string systemd_unit;
  // A container id recognised in `path`, lower case: "<runtime>-<id>.scope" for docker, libpod
  // (podman), crio, cri-containerd (systemd cgroup driver), "crio-<id>" (CRI-O with cgroupfs), or
  // a 64-hex-digit component (cgroupfs driver, e.g. "/docker/<id>", "/kubepods/.../pod<uid>/<id>");
  // "" when none. libpod-conmon-*.scope and crio-conmon-*.scope (monitors) are not ones. The
  // deepest one wins: in nested containers (kind's nodes) the innermost is the process's own.
  std::string container_id;
  // The kubelet's pod UID from the pod's cgroup above the container (cgroupfs "pod<uid>", systemd
  // "kubepods-<qos>-pod<uid with _>.slice", kind's "kubelet-kubepods-...-pod<uid>.slice"), dashed
  // and lower case; a static pod's is its 32-hex-digit config hash. "" when none.
  std::string pod_uid;
};
CgroupInfo ParseCgroup(absl::string_view cgroup_text);

// Where a service_name came from, in the order of SPEC section 4; the pod annotation (issue 12:
// an operator's explicit choice for the pod) comes right after the flag.
enum class ServiceNameSource {
  kFlag,          // --service-name (pid filter run)
  kPodAnnotation,  // the pod's parascope.io/service-name annotation
  kOtelEnv,       // OTEL_SERVICE_NAME
  kPyroscopeEnv,  // PYROSCOPE_SERVICE_NAME
  kKubernetes,    // <namespace>/<container>
  kSystemdUnit,
  kExecutable,   // base name of /proc/<pid>/exe
  kProcessName,  // the comm passed in (exe unreadable, or the process is gone)
};
const char* ServiceNameSourceName(ServiceNameSource source);

// Builds the labels of each pushed series, caching what it reads per process. Thread-safe.
//
// Invariants: at most options.max_cached_processes cached entries (when full, new processes are
// resolved on every call instead of cached); an entry's /proc data was read while
// <proc_root>/<pid>/stat's start time matched its ProcessKey (checked before and after reading),
// so a reused pid never inherits another process's service_name.
//
// Container names are not resolved (they need the engine's API or state files): a process in a
// container gets the next source of the chain, never the unit of the engine's service.
class SeriesLabeler {
 public:
  explicit SeriesLabeler(LabelOptions options);

  // Labels for one profile of `process`: `__name__`=profile_type, `service_name`, `hostname`,
  // Kubernetes `namespace`, `pod`, `container`, `node` (non-empty ones), the external labels in
  // flag order, then `pid` (decimal tgid) with pid_label. process_name is the comm the profile
  // was built with; it is the fallback service_name. Reads <proc_root>/<tgid>/{stat,environ,
  // cgroup,exe} on a process's first use; unreadable files (permissions, exited process) move
  // down the chain, they are not errors. Errors: InvalidArgument for an empty profile_type or
  // more than kMaxSeriesLabels labels (external labels not validated).
  absl::StatusOr<LabelList> Labels(const proc::ProcessKey& process, const std::string& process_name,
                                   const std::string& profile_type);

  // The service_name of `process` and where it came from (cached like Labels).
  std::pair<std::string, ServiceNameSource> ServiceName(const proc::ProcessKey& process,
                                                        const std::string& process_name);

  // Marks the end of a collection window: forgets processes not used during it.
  void EndWindow();

  size_t cached_processes() const;
  const std::string& hostname() const { return hostname_; }

 private:
  struct Entry {
    std::string service_name;
    ServiceNameSource source = ServiceNameSource::kProcessName;
    std::optional<KubernetesInfo> kubernetes;
    uint64_t last_used_window = 0;
  };
  Entry Resolve(const proc::ProcessKey& process, const std::string& process_name) const;
  // OK when <proc_root>/<tgid>/stat's start time matches key (within 1 tick, as ProcessTable).
  absl::Status CheckIdentity(const proc::ProcessKey& key) const;
  const Entry& Lookup(const proc::ProcessKey& process, const std::string& process_name)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const LabelOptions options_;
  std::string hostname_;
  mutable absl::Mutex mu_;
  uint64_t window_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<proc::ProcessKey, Entry> cache_ ABSL_GUARDED_BY(mu_);
  Entry uncached_ ABSL_GUARDED_BY(mu_);  // the last entry resolved while the cache was full
};

}  // namespace parascope
