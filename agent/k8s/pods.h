// Kubernetes pods as the agent needs them: parsed from the API server's JSON (core/v1 Pod,
// PodList and watch events), kept in a bounded store indexed by container id and pod UID, and
// matched against label selectors (--target-pod-selector).
//
// Wire facts (Kubernetes API reference, core/v1): a Pod has metadata{name, namespace, uid,
// labels, annotations, resourceVersion}, spec{nodeName}, status{containerStatuses[],
// initContainerStatuses[], ephemeralContainerStatuses[]} whose items carry {name, containerID}
// with containerID "<runtime>://<id>" (containerd://, cri-o://, docker://) once the container was
// created. A list is PodList{metadata{resourceVersion, continue}, items[]}; a watch streams one
// JSON object a line, {"type": ADDED|MODIFIED|DELETED|BOOKMARK|ERROR, "object": ...}; an ERROR's
// object is a Status{code, reason, message} (410 Gone / reason Expired: the resourceVersion is too
// old, list again). A static pod's mirror has its own uid; its cgroup is named after the
// annotation kubernetes.io/config.hash instead.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
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

namespace parascope::k8s {

// The pod annotation that overrides the derived service_name (SPEC section 4).
inline constexpr absl::string_view kServiceNameAnnotation = "parascope.io/service-name";
// The kubelet's annotation naming a static pod's config hash, which its cgroup carries as UID.
inline constexpr absl::string_view kConfigHashAnnotation = "kubernetes.io/config.hash";

struct PodContainer {
  std::string id;    // runtime's id without the "<runtime>://" prefix, lower case; "" until created
  std::string name;  // the container's name in the pod spec
};

struct PodInfo {
  std::string uid;
  std::string namespace_name;
  std::string name;
  std::string node;  // spec.nodeName ("" while unscheduled)
  std::map<std::string, std::string> labels;
  std::string service_name;  // annotation parascope.io/service-name, "" when absent
  std::string config_hash;   // annotation kubernetes.io/config.hash (static pods), "" when absent
  std::string resource_version;
  std::vector<PodContainer> containers;  // containers, init and ephemeral containers with an id
};

// Parses one Pod object. InvalidArgument when it is not an object or lacks metadata.uid,
// metadata.name or metadata.namespace; other missing fields are left empty.
absl::StatusOr<PodInfo> ParsePod(absl::string_view json);

struct PodList {
  std::string resource_version;  // metadata.resourceVersion: where a watch continues
  std::string continue_token;    // metadata.continue: "" on the last page
  std::vector<PodInfo> pods;     // items that parsed
  size_t bad_items = 0;          // items ParsePod refused
};
// Parses a PodList response body. InvalidArgument when it is not JSON or has no items array.
absl::StatusOr<PodList> ParsePodList(absl::string_view json);

struct WatchEvent {
  enum class Type { kAdded, kModified, kDeleted, kBookmark, kError };
  Type type = Type::kAdded;
  PodInfo pod;                   // kAdded, kModified, kDeleted
  std::string resource_version;  // the object's metadata.resourceVersion (kBookmark too)
  int error_code = 0;            // kError: Status.code (410: list again)
  std::string error_message;     // kError: Status.reason and message
};
// Parses one line of a watch stream. InvalidArgument for bad JSON, an unknown type or a pod
// ParsePod refuses.
absl::StatusOr<WatchEvent> ParseWatchEvent(absl::string_view line);

// The runtime's id from a containerID field: "containerd://abc" -> "abc" (any scheme), lower case.
std::string ContainerIdFromStatus(absl::string_view container_id);

// A label selector (the syntax of `kubectl -l`, k8s.io/apimachinery/pkg/labels): comma-separated
// requirements, all of which must hold:
//   key=value, key==value, key!=value, key in (v1,v2), key notin (v1,v2), key, !key
// Keys may carry a DNS prefix (app.kubernetes.io/name). `!=` and `notin` also match pods without
// the key, as Kubernetes does.
class LabelSelector {
 public:
  // InvalidArgument naming the requirement that does not parse. "" selects everything.
  static absl::StatusOr<LabelSelector> Parse(absl::string_view text);
  bool Matches(const std::map<std::string, std::string>& labels) const;
  bool empty() const { return requirements_.empty(); }

 private:
  struct Requirement {
    enum class Op { kIn, kNotIn, kExists, kNotExists };
    std::string key;
    Op op = Op::kExists;
    std::vector<std::string> values;
  };
  std::vector<Requirement> requirements_;
};

// Counts of a PodStore, for /metrics.
struct PodStoreStats {
  size_t pods = 0;
  uint64_t dropped = 0;  // pods not stored because the store was full
};

// The pods of this node, indexed by container id and by pod UID (and config hash). Thread-safe:
// the watcher thread writes, the window loop reads.
//
// Invariants: at most max_pods pods; every index entry names a stored pod (a pod's old container
// ids are removed when it is replaced or deleted).
class PodStore {
 public:
  explicit PodStore(size_t max_pods = 10000) : max_pods_(max_pods) {}

  // Replaces every pod with `pods` (a fresh list).
  void Replace(std::vector<PodInfo> pods);
  // Adds or replaces the pod with pod.uid.
  void Upsert(PodInfo pod);
  void Delete(const std::string& uid);

  // The pod running container `container_id` (and the container's name in *container), or the
  // pod whose UID (dashed or with underscores, as systemd slices write it) or config hash is
  // `pod_uid`. nullopt when neither is known.
  std::optional<PodInfo> Find(absl::string_view container_id, absl::string_view pod_uid,
                              std::string* container) const;

  PodStoreStats stats() const;
  // Increases each time the store changes (the labeler looks again for what it could not find).
  uint64_t generation() const;

 private:
  void InsertLocked(PodInfo pod) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(const std::string& uid) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_pods_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, PodInfo> by_uid_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> uid_of_container_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, std::string> uid_of_hash_ ABSL_GUARDED_BY(mu_);
  uint64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace parascope::k8s
