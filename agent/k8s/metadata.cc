#include "agent/k8s/metadata.h"

#include <utility>

namespace parascope::k8s {

KubernetesMetadata::KubernetesMetadata(const PodStore* store, std::string node,
                                       TargetOptions targets)
    : store_(store), node_(std::move(node)), targets_(std::move(targets)) {}

std::optional<KubernetesInfo> KubernetesMetadata::Lookup(absl::string_view cgroup) {
  CgroupInfo c = ParseCgroup(cgroup);
  KubernetesInfo info;
  info.node = node_;
  info.generation = store_->generation();  // before Find: a change after it is seen next time
  std::string container;
  std::optional<PodInfo> pod = store_->Find(c.container_id, c.pod_uid, &container);
  // A container outside the kubelet's hierarchy (docker run, podman, kind's node seen from its
  // host) that no pod lists is not Kubernetes': no pod UID means no pod to wait for.
  if (!pod.has_value() && c.pod_uid.empty()) {
    not_in_pod_.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  // Until the container's name is known, its short id keeps containers apart (the degraded mode
  // of an unreachable API server).
  const std::string short_id = c.container_id.substr(0, kShortContainerIdLength);
  if (!pod.has_value()) {
    pod_unknown_.fetch_add(1, std::memory_order_relaxed);
    info.complete = false;
    info.container_id = short_id;
    return info;
  }
  pod_.fetch_add(1, std::memory_order_relaxed);
  // The pod is known but does not list this container (yet): its labels come without
  // `container` until it does.
  info.complete = c.container_id.empty() || !container.empty();
  info.namespace_name = pod->namespace_name;
  info.pod = pod->name;
  info.container = container;
  if (container.empty()) info.container_id = short_id;
  info.service_name = pod->service_name;
  if (!pod->node.empty()) info.node = pod->node;
  return info;
}

bool KubernetesMetadata::Selected(absl::string_view cgroup) const {
  if (!targets_.enabled()) return true;
  CgroupInfo c = ParseCgroup(cgroup);
  if (c.container_id.empty() && c.pod_uid.empty()) return false;
  std::string container;
  std::optional<PodInfo> pod = store_->Find(c.container_id, c.pod_uid, &container);
  if (!pod.has_value()) return false;
  if (!targets_.namespaces.empty() && targets_.namespaces.count(pod->namespace_name) == 0) {
    return false;
  }
  return targets_.pod_selector.Matches(pod->labels);
}

MetadataStats KubernetesMetadata::stats() const {
  return MetadataStats{pod_.load(std::memory_order_relaxed),
                       pod_unknown_.load(std::memory_order_relaxed),
                       not_in_pod_.load(std::memory_order_relaxed)};
}

}  // namespace parascope::k8s
