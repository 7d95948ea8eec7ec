// A process's Kubernetes metadata and whether --target-namespaces / --target-pod-selector select
// it: its /proc/<pid>/cgroup text (ParseCgroup: container id, pod UID) looked up in the PodStore.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <set>
#include <string>

#include "absl/strings/string_view.h"
#include "agent/export/labels.h"
#include "agent/k8s/pods.h"

namespace parascope::k8s {

// Hex digits of a container id in the `container_id` label: docker's and crictl's short form.
inline constexpr size_t kShortContainerIdLength = 12;

struct TargetOptions {
  std::set<std::string> namespaces;  // --target-namespaces; empty = every namespace
  LabelSelector pod_selector;        // --target-pod-selector; empty = every pod
  bool enabled() const { return !namespaces.empty() || !pod_selector.empty(); }
};

// Counts of Lookup results, by outcome, for /metrics.
struct MetadataStats {
  uint64_t pod = 0;          // the pod (and the container, when its id is listed) was found
  uint64_t pod_unknown = 0;  // the cgroup names a pod UID the store does not hold
  uint64_t not_in_pod = 0;   // no pod UID, no listed container id (host processes, other engines)
};

// Thread-safe (the store locks; counters are atomics).
class KubernetesMetadata {
 public:
  // `store` must outlive this. `node` is this node's name (the `node` label).
  KubernetesMetadata(const PodStore* store, std::string node, TargetOptions targets);

  // The metadata of the process whose /proc/<pid>/cgroup text is `cgroup`: nullopt when the
  // cgroup names no pod UID and no container a pod lists (host processes, containers of other
  // engines, ""); complete == false while the store does not know the pod (the labels are then
  // `node` and `container_id`) or the pod does not list the container (then `container_id`
  // instead of `container`). Counted in stats().
  std::optional<KubernetesInfo> Lookup(absl::string_view cgroup);

  // True when targeting is off, or the process's pod is known and in a target namespace and
  // matches the pod selector. A process outside any pod, or in a pod the store does not know
  // (yet, or while the API server is unreachable since before it started), is not selected.
  bool Selected(absl::string_view cgroup) const;
  bool targeting() const { return targets_.enabled(); }

  MetadataStats stats() const;

 private:
  const PodStore* const store_;
  const std::string node_;
  const TargetOptions targets_;
  std::atomic<uint64_t> pod_{0}, pod_unknown_{0}, not_in_pod_{0};
};

}  // namespace parascope::k8s
