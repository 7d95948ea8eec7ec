// Kubernetes metadata (agent/k8s/): cgroup paths as container runtimes and the kubelet write
// them, the API server's JSON shapes (test/fixtures/kubernetes/), the pod store, label
// selectors, and the list/watch client against an in-process fake API server.
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "agent/export/labels.h"
#include "agent/k8s/metadata.h"
#include "agent/k8s/pod_watcher.h"
#include "agent/k8s/pods.h"
#include "catch2/catch.hpp"
#include "test/k8s/fake_apiserver.h"
#include "test/unit/temp_dir.h"

namespace parascope {
namespace {

std::string Fixture(const std::string& name) {
  std::ifstream in(std::string(PS_FIXTURE_DIR) + "/kubernetes/" + name);
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Ids as runtimes print them (64 hex digits) and pod UIDs as the API server does.
const std::string kId = "8d2f4a6c0e1b3d5f7a9c2e4b6d8f0a1c3e5b7d9f1a2c4e6b8d0f2a4c6e8b0d1f";
const std::string kNodeId = "3c1e5a7b9d0f2e4a6c8b0d1f3e5a7c9b1d3f5e7a9c0b2d4f6e8a0c1b3d5f7e9a";
const std::string kUid = "5f0c3a9e-2b7d-4c1a-8e6f-9d3b2a1c0e4f";
const std::string kUidSlice = "5f0c3a9e_2b7d_4c1a_8e6f_9d3b2a1c0e4f";

struct CgroupCase {
  const char* what;
  std::string text;  // /proc/<pid>/cgroup
  std::string container_id, pod_uid, systemd_unit;
};

TEST_CASE("ParseCgroup: container ids and pod UIDs of real cgroup paths") {
  const std::vector<CgroupCase> cases = {
      // Docker, cgroup v1 (cgroupfs driver): every controller names /docker/<id>.
      {"docker v1",
       "12:pids:/docker/" + kId + "\n11:memory:/docker/" + kId + "\n4:cpu,cpuacct:/docker/" + kId +
           "\n1:name=systemd:/docker/" + kId + "\n",
       kId, "", ""},
      // Docker with cgroupfs on a hybrid host: runc also makes the unified hierarchy's cgroup.
      {"docker hybrid",
       "11:memory:/docker/" + kId + "\n1:name=systemd:/docker/" + kId + "\n0::/docker/" + kId +
           "\n",
       kId, "", ""},
      // Docker, cgroup v2 with the systemd driver (Docker's default on systemd hosts).
      {"docker v2 systemd", "0::/system.slice/docker-" + kId + ".scope\n", kId, "", ""},
      // Docker, cgroup v2 with the cgroupfs driver.
      {"docker v2 cgroupfs", "0::/docker/" + kId + "\n", kId, "", ""},
      // containerd (CRI) under the kubelet's systemd driver, each QoS class.
      {"containerd burstable",
       "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSlice +
           ".slice/cri-containerd-" + kId + ".scope\n",
       kId, kUid, ""},
      {"containerd besteffort",
       "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod" + kUidSlice +
           ".slice/cri-containerd-" + kId + ".scope\n",
       kId, kUid, ""},
      {"containerd guaranteed",
       "0::/kubepods.slice/kubepods-pod" + kUidSlice + ".slice/cri-containerd-" + kId + ".scope\n",
       kId, kUid, ""},
      // containerd under the kubelet's cgroupfs driver, cgroup v1 (hybrid hosts).
      {"containerd cgroupfs v1",
       "11:memory:/kubepods/burstable/pod" + kUid + "/" + kId + "\n1:name=systemd:/kubepods/"
           "burstable/pod" + kUid + "/" + kId + "\n0::/\n",
       kId, kUid, ""},
      {"containerd cgroupfs guaranteed", "0::/kubepods/pod" + kUid + "/" + kId + "\n", kId, kUid,
       ""},
      // CRI-O: systemd driver (crio-<id>.scope), its monitor (crio-conmon-, not the container),
      // and the cgroupfs driver (crio-<id>).
      {"cri-o systemd",
       "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSlice +
           ".slice/crio-" + kId + ".scope\n",
       kId, kUid, ""},
      {"cri-o conmon",
       "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + kUidSlice +
           ".slice/crio-conmon-" + kId + ".scope\n",
       "", kUid, ""},
      {"cri-o cgroupfs", "0::/kubepods/besteffort/pod" + kUid + "/crio-" + kId + "\n", kId, kUid,
       ""},
      // A static pod: its cgroup names the config hash (32 hex digits), not a dashed UID.
      {"static pod",
       "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod"
       "5ae6c1cd9bcfe4bb1ad05d1c8ecd7c3e.slice/cri-containerd-" + kId + ".scope\n",
       kId, "5ae6c1cd9bcfe4bb1ad05d1c8ecd7c3e", ""},
      // kind: the node is a Docker container; the kubelet's cgroup root is /kubelet. Seen from
      // the host (cgroup v2, the node's own cgroup namespace not entered) ...
      {"kind from the host",
       "0::/system.slice/docker-" + kNodeId +
           ".scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
           "kubelet-kubepods-besteffort-pod" + kUidSlice + ".slice/cri-containerd-" + kId +
           ".scope\n",
       kId, kUid, ""},
      // ... from inside the node (an agent pod in the node's cgroup namespace) ...
      {"kind in the node",
       "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
       "kubelet-kubepods-burstable-pod" + kUidSlice + ".slice/cri-containerd-" + kId + ".scope\n",
       kId, kUid, ""},
      // ... and with cgroup v1 (Docker's cgroupfs driver around the kubelet's).
      {"kind v1",
       "11:memory:/docker/" + kNodeId + "/kubelet/kubepods/besteffort/pod" + kUid + "/" + kId +
           "\n1:name=systemd:/docker/" + kNodeId + "/kubelet/kubepods/besteffort/pod" + kUid +
           "/" + kId + "\n",
       kId, kUid, ""},
      // An agent pod in a private cgroup namespace sees other pods' paths relative to its own.
      {"relative to a cgroup namespace",
       "0::/../../kubepods-besteffort-pod" + kUidSlice + ".slice/cri-containerd-" + kId +
           ".scope\n",
       kId, kUid, ""},
      // The pod's own cgroup (a process directly in the pod slice): the pod, no container.
      {"pod slice", "0::/kubepods.slice/kubepods-pod" + kUidSlice + ".slice\n", "", kUid, ""},
      // Hosts: systemd services and user sessions are neither containers nor pods.
      {"systemd service", "0::/system.slice/nginx.service\n", "", "", "nginx"},
      {"systemd template", "0::/system.slice/system-getty.slice/getty@tty1.service\n", "", "",
       "getty@tty1"},
      {"user slice", "0::/user.slice/user-1000.slice/session-3.scope\n", "", "", ""},
      {"user manager app",
       "0::/user.slice/user-1000.slice/user@1000.service/app.slice/app-gnome-firefox-2145.scope\n",
       "", "", ""},
      {"kubelet itself", "0::/system.slice/kubelet.service\n", "", "", "kubelet"},
      {"containerd shim",
       "0::/system.slice/containerd.service\n", "", "", "containerd"},
      // Not ids: too short, not hex, a "pod" that is no UID.
      {"not an id", "0::/system.slice/docker-xyz.scope\n", "", "", ""},
      {"not a uid", "0::/kubepods.slice/kubepods-podcast.slice\n", "", "", ""},
  };
  for (const CgroupCase& c : cases) {
    INFO(c.what << ": " << c.text);
    CgroupInfo info = ParseCgroup(c.text);
    CHECK(info.container_id == c.container_id);
    CHECK(info.pod_uid == c.pod_uid);
    CHECK(info.systemd_unit == c.systemd_unit);
  }
}

TEST_CASE("k8s: a PodList of the API reference's shape parses") {
  auto list = k8s::ParsePodList(Fixture("pod-list.json"));
  REQUIRE(list.ok());
  CHECK(list->resource_version == "48377");
  CHECK(list->continue_token == "");
  CHECK(list->bad_items == 0);
  REQUIRE(list->pods.size() == 2);
  const k8s::PodInfo& a = list->pods[0];
  CHECK(a.uid == kUid);
  CHECK(a.name == "checkout-7c9d5b8f6d-x2x8q");
  CHECK(a.namespace_name == "shop");
  CHECK(a.node == "node-a");
  CHECK(a.labels == std::map<std::string, std::string>{
                        {"app", "checkout"}, {"pod-template-hash", "7c9d5b8f6d"}, {"tier", "api"}});
  CHECK(a.service_name == "");
  CHECK(a.resource_version == "48211");
  REQUIRE(a.containers.size() == 2);
  CHECK(a.containers[0].name == "checkout");
  CHECK(a.containers[0].id == kId);  // "containerd://" removed
  CHECK(a.containers[1].name == "proxy");
  const k8s::PodInfo& b = list->pods[1];
  CHECK(b.namespace_name == "web");
  CHECK(b.service_name == "search-frontend");
  REQUIRE(b.containers.size() == 2);
  CHECK(b.containers[0].id == "b7e9c1a3d5f7b9e1c3a5d7f9b1e3c5a7d9f1b3e5c7a9d1f3b5e7c9a1d3f5b7e9");
}

TEST_CASE("k8s: watch events of the API reference's shape parse") {
  std::vector<k8s::WatchEvent> events;
  std::istringstream in(Fixture("watch-events.jsonl"));
  for (std::string line; std::getline(in, line);) {
    auto e = k8s::ParseWatchEvent(line);
    REQUIRE(e.ok());
    events.push_back(*e);
  }
  REQUIRE(events.size() == 5);
  using T = k8s::WatchEvent::Type;
  CHECK(events[0].type == T::kAdded);
  CHECK(events[0].pod.name == "worker-5d8f9");
  CHECK(events[0].pod.containers.empty());  // Pending: no container created yet
  CHECK(events[0].resource_version == "48390");
  CHECK(events[1].type == T::kModified);
  REQUIRE(events[1].pod.containers.size() == 2);
  CHECK(events[1].pod.containers[0].name == "worker");
  CHECK(events[2].type == T::kBookmark);
  CHECK(events[2].resource_version == "48410");
  CHECK(events[3].type == T::kDeleted);
  CHECK(events[3].pod.uid == kUid);
  CHECK(events[4].type == T::kError);
  CHECK(events[4].error_code == 410);
  CHECK(events[4].error_message.find("Expired") != std::string::npos);

  CHECK(!k8s::ParseWatchEvent("{\"type\":\"ADDED\"").ok());
  CHECK(!k8s::ParseWatchEvent("{\"type\":\"SHRUG\",\"object\":{}}").ok());
  CHECK(!k8s::ParseWatchEvent("{\"type\":\"ADDED\",\"object\":{\"metadata\":{}}}").ok());
  CHECK(!k8s::ParsePodList("[]").ok());
  CHECK(!k8s::ParsePodList("not json").ok());
  CHECK(k8s::ContainerIdFromStatus("cri-o://ABCdef") == "abcdef");
  CHECK(k8s::ContainerIdFromStatus("docker://0123") == "0123");
}

TEST_CASE("k8s: the pod store finds pods by container id, pod UID and config hash") {
  auto list = k8s::ParsePodList(Fixture("pod-list.json"));
  REQUIRE(list.ok());
  k8s::PodStore store(3);
  store.Replace(list->pods);
  CHECK(store.stats().pods == 2);
  std::string container;
  auto p = store.Find(kId, "", &container);
  REQUIRE(p.has_value());
  CHECK(p->name == "checkout-7c9d5b8f6d-x2x8q");
  CHECK(container == "checkout");
  // Upper-case ids and systemd's underscored UIDs are the same pod.
  std::string upper = kId;
  for (char& c : upper) c = static_cast<char>(toupper(c));
  CHECK(store.Find(upper, "", &container).has_value());
  p = store.Find("", kUidSlice, &container);
  REQUIRE(p.has_value());
  CHECK(p->namespace_name == "shop");
  CHECK(container == "");
  // An unknown container (a sandbox) of a known pod: the pod, no container name.
  p = store.Find(std::string(64, 'a'), kUid, &container);
  REQUIRE(p.has_value());
  CHECK(container == "");
  CHECK(!store.Find(std::string(64, 'a'), "", &container).has_value());

  // A static pod's mirror: found by the config hash its cgroup carries.
  k8s::PodInfo mirror;
  mirror.uid = "0d8e7f6a-5b4c-4d3e-9f2a-1b0c9d8e7f6a";
  mirror.name = "kube-apiserver-node-a";
  mirror.namespace_name = "kube-system";
  mirror.config_hash = "5ae6c1cd9bcfe4bb1ad05d1c8ecd7c3e";
  store.Upsert(mirror);
  p = store.Find("", "5ae6c1cd9bcfe4bb1ad05d1c8ecd7c3e", &container);
  REQUIRE(p.has_value());
  CHECK(p->name == "kube-apiserver-node-a");

  // Bounded: a fourth pod is dropped and counted.
  k8s::PodInfo extra = mirror;
  extra.uid = "11111111-2222-4333-8444-555555555555";
  store.Upsert(extra);
  CHECK(store.stats().pods == 3);
  CHECK(store.stats().dropped == 1);

  // Deleting a pod removes its containers from the index.
  const uint64_t g = store.generation();
  store.Delete(kUid);
  CHECK(store.generation() > g);
  CHECK(!store.Find(kId, "", &container).has_value());
  CHECK(store.stats().pods == 2);
  // A replaced pod's old container ids go too.
  k8s::PodInfo search = list->pods[1];
  const std::string old_id = search.containers[0].id;
  search.containers[0].id = std::string(64, 'c');
  store.Upsert(search);
  CHECK(!store.Find(old_id, "", &container).has_value());
  CHECK(store.Find(std::string(64, 'c'), "", &container).has_value());
  CHECK(container == "search");
}

TEST_CASE("k8s: label selectors in kubectl's syntax") {
  const std::map<std::string, std::string> labels = {
      {"app", "web"}, {"tier", "front"}, {"app.kubernetes.io/name", "shop"}};
  struct Case {
    const char* selector;
    bool matches;
  };
  for (const Case& c : std::vector<Case>{
           {"", true},
           {"app=web", true},
           {"app==web", true},
           {"app=api", false},
           {"app!=api", true},
           {"missing!=x", true},  // != matches pods without the key, as in Kubernetes
           {"app", true},
           {"!app", false},
           {"!canary", true},
           {"tier in (front,back)", true},
           {"tier in (back)", false},
           {"tier notin (back, batch)", true},
           {"missing notin (a)", true},
           {"app=web,tier in (front),!canary", true},
           {"app=web, tier=back", false},
           {"app.kubernetes.io/name=shop", true},
       }) {
    INFO(c.selector);
    auto s = k8s::LabelSelector::Parse(c.selector);
    REQUIRE(s.ok());
    CHECK(s->Matches(labels) == c.matches);
  }
  for (const char* bad : {"app=", "=web", "app in", "app in ()", "app in (a", "app ~ b",
                          "app=we b", ",", "app=web,"}) {
    INFO(bad);
    auto s = k8s::LabelSelector::Parse(bad);
    if (std::string(bad) == "app=") {
      CHECK(s.ok());  // an empty value is a valid label value
      continue;
    }
    CHECK(!s.ok());
  }
}

TEST_CASE("k8s: metadata and targeting of a process from its cgroup") {
  auto list = k8s::ParsePodList(Fixture("pod-list.json"));
  REQUIRE(list.ok());
  k8s::PodStore store;
  store.Replace(list->pods);
  const std::string checkout = "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" +
                               kUidSlice + ".slice/cri-containerd-" + kId + ".scope\n";
  const std::string search =
      "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podc1d2e3f4_a5b6_4c7d_"
      "8e9f_0a1b2c3d4e5f.slice/crio-b7e9c1a3d5f7b9e1c3a5d7f9b1e3c5a7d9f1b3e5c7a9d1f3b5e7c9a1d3f5b7e9"
      ".scope\n";
  const std::string unknown = "0::/kubepods.slice/kubepods-pod11111111_2222_4333_8444_555555555555"
                              ".slice/cri-containerd-" + std::string(64, 'f') + ".scope\n";
  const std::string host = "0::/system.slice/sshd.service\n";

  k8s::KubernetesMetadata m(&store, "node-a", {});
  auto info = m.Lookup(checkout);
  REQUIRE(info.has_value());
  CHECK(info->complete);
  CHECK(info->namespace_name == "shop");
  CHECK(info->pod == "checkout-7c9d5b8f6d-x2x8q");
  CHECK(info->container == "checkout");
  CHECK(info->container_id == "");  // the name is known: no short id
  CHECK(info->node == "node-a");
  CHECK(info->service_name == "");
  info = m.Lookup(search);
  REQUIRE(info.has_value());
  CHECK(info->container == "search");
  CHECK(info->service_name == "search-frontend");
  info = m.Lookup(unknown);
  REQUIRE(info.has_value());
  CHECK(!info->complete);
  CHECK(info->pod == "");
  CHECK(info->container_id == "ffffffffffff");
  CHECK(info->node == "node-a");
  CHECK(info->generation == store.generation());
  CHECK(!m.Lookup(host).has_value());
  CHECK(!m.Lookup("").has_value());
  // A container of another engine (docker run on the node): no pod UID, no pod lists it.
  CHECK(!m.Lookup("0::/system.slice/docker-" + std::string(64, 'd') + ".scope\n").has_value());
  // A known pod that does not list this container (yet; or its sandbox): the pod's labels, no
  // container, incomplete.
  info = m.Lookup("0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" +
                  kUidSlice + ".slice/cri-containerd-" + std::string(64, '9') + ".scope\n");
  REQUIRE(info.has_value());
  CHECK(!info->complete);
  CHECK(info->pod == "checkout-7c9d5b8f6d-x2x8q");
  CHECK(info->container == "");
  CHECK(info->container_id == "999999999999");
  k8s::MetadataStats st = m.stats();
  CHECK(st.pod == 3);
  CHECK(st.pod_unknown == 1);
  CHECK(st.not_in_pod == 3);
  CHECK(!m.targeting());
  CHECK(m.Selected(host));  // no targeting: everything

  k8s::TargetOptions by_ns;
  by_ns.namespaces = {"shop"};
  k8s::KubernetesMetadata ns(&store, "node-a", by_ns);
  CHECK(ns.targeting());
  CHECK(ns.Selected(checkout));
  CHECK(!ns.Selected(search));
  CHECK(!ns.Selected(unknown));
  CHECK(!ns.Selected(host));

  k8s::TargetOptions by_labels;
  by_labels.pod_selector = *k8s::LabelSelector::Parse("tier in (front)");
  k8s::KubernetesMetadata sel(&store, "node-a", by_labels);
  CHECK(!sel.Selected(checkout));
  CHECK(sel.Selected(search));
}

// The watcher against the fake API server: the initial list, watch events applied in order, a
// 410 Expired answered by a new list, a server that goes away counted and survived.
TEST_CASE("k8s: the pod watcher lists, watches, relists on 410 and survives the server's death") {
  testing::FakeApiServer server("node-a", "secret-token");
  testing::FakePod web;
  web.uid = kUid;
  web.name = "web-0";
  web.namespace_name = "shop";
  web.node = "node-a";
  web.app = "web";
  web.container = "web";
  web.container_id = kId;
  server.Apply(web);

  unit_testing::TempDir dir;
  const std::string token_file = dir.path() + "/token";
  {
    std::ofstream(token_file) << "secret-token\n";
  }
  k8s::PodStore store;
  k8s::PodWatcherOptions o;
  o.api_url = server.url();
  o.node_name = "node-a";
  o.token_file = token_file;
  o.backoff_initial = absl::Milliseconds(50);
  o.backoff_max = absl::Milliseconds(200);
  o.request_timeout = absl::Seconds(2);
  k8s::PodWatcher watcher(o, &store);
  REQUIRE(watcher.Start().ok());

  // Waits (bounded) for a condition on the store or the watcher's stats.
  auto wait_for = [&](const std::function<bool()>& done) {
    for (int i = 0; i < 500 && !done(); ++i) absl::SleepFor(absl::Milliseconds(10));
    return done();
  };
  std::string container;
  REQUIRE(wait_for([&] { return store.Find(kId, "", &container).has_value(); }));
  CHECK(container == "web");
  CHECK(watcher.stats().up);
  CHECK(watcher.stats().synced);
  CHECK(watcher.stats().lists == 1);
  REQUIRE(wait_for([&] { return server.watches() >= 1; }));

  // A new pod, first Pending, then running: ADDED, then MODIFIED with its container id.
  testing::FakePod worker = web;
  worker.uid = "7a6b5c4d-3e2f-4a1b-9c8d-7e6f5a4b3c2d";
  worker.name = "worker-1";
  worker.namespace_name = "jobs";
  worker.container = "worker";
  worker.container_id = "";
  server.Apply(worker);
  REQUIRE(wait_for([&] { return store.stats().pods == 2; }));
  worker.container_id = std::string(64, 'b');
  server.Apply(worker);
  REQUIRE(wait_for([&] { return store.Find(std::string(64, 'b'), "", &container).has_value(); }));
  CHECK(container == "worker");
  server.Remove(web.uid);
  REQUIRE(wait_for([&] { return !store.Find(kId, "", &container).has_value(); }));
  CHECK(watcher.stats().events_added == 1);
  CHECK(watcher.stats().events_modified == 1);
  CHECK(watcher.stats().events_deleted == 1);

  // 410 Expired: listed again.
  server.ExpireWatches();
  REQUIRE(wait_for([&] { return watcher.stats().lists == 2; }));
  CHECK(watcher.stats().errors_expired == 1);
  CHECK(store.stats().pods == 1);
  CHECK(server.refused().empty());

  // The server dies: the store keeps its pods, the watcher reports down and counts errors.
  server.Stop();
  REQUIRE(wait_for([&] { return !watcher.stats().up && watcher.stats().errors_connect >= 2; }));
  CHECK(store.Find(std::string(64, 'b'), "", &container).has_value());
  watcher.Stop();
}

TEST_CASE("k8s: a wrong token or node is refused by the server and counted") {
  testing::FakeApiServer server("node-a", "right");
  k8s::PodStore store;
  k8s::PodWatcherOptions o;
  o.api_url = server.url() + "/";
  o.node_name = "node-b";
  o.token_file = "";  // no token: 401
  o.backoff_initial = absl::Milliseconds(20);
  o.backoff_max = absl::Milliseconds(40);
  k8s::PodWatcher watcher(o, &store);
  REQUIRE(watcher.Start().ok());
  for (int i = 0; i < 500 && watcher.stats().errors_status < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  CHECK(watcher.stats().errors_status >= 2);
  CHECK(!watcher.stats().up);
  CHECK(!watcher.stats().synced);
  REQUIRE(!server.refused().empty());
  CHECK(server.refused()[0].rfind("401 ", 0) == 0);
  watcher.Stop();

  // The right token, the wrong node: 400 from the field selector check.
  unit_testing::TempDir dir;
  std::ofstream(dir.path() + "/token") << "right";
  o.token_file = dir.path() + "/token";
  const size_t refused = server.refused().size();
  k8s::PodWatcher wrong_node(o, &store);
  REQUIRE(wrong_node.Start().ok());
  for (int i = 0; i < 500 && server.refused().size() < refused + 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  REQUIRE(server.refused().size() >= refused + 2);
  CHECK(server.refused()[refused].rfind("400 ", 0) == 0);
  wrong_node.Stop();

  for (const char* url : {"", "ftp://h", "http://", "http://[::1", "http://h:99999", "http://h:x"}) {
    INFO(url);
    k8s::PodWatcherOptions bad_url;
    bad_url.api_url = url;
    k8s::PodWatcher bad(bad_url, &store);
    CHECK(!bad.Start().ok());
  }
}

// A server that lists but refuses every watch (RBAC without "watch") is not listed again every
// second: the backoff grows while no watch stays healthy.
TEST_CASE("k8s: a server that refuses watches is listed with growing backoff") {
  testing::FakeApiServer server("node-a");
  server.RefuseWatches(403);
  k8s::PodStore store;
  k8s::PodWatcherOptions o;
  o.api_url = server.url();
  o.node_name = "node-a";
  o.token_file = "";
  o.backoff_initial = absl::Milliseconds(100);
  o.backoff_max = absl::Seconds(30);
  k8s::PodWatcher watcher(o, &store);
  REQUIRE(watcher.Start().ok());
  absl::SleepFor(absl::Seconds(3));  // the measurement interval, not a synchronization
  const int lists = server.lists();
  watcher.Stop();
  // 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s (each with jitter down to half): at most 7 lists in 3 s, where a
  // reset after each list would give about 30.
  INFO("lists in 3 s: " << lists);
  CHECK(lists >= 2);
  CHECK(lists <= 7);
  CHECK(watcher.stats().errors_status >= 2);
  CHECK(!watcher.stats().up);
}

// An IPv6 API server address (the in-cluster default on IPv6 clusters), bracketed in the URL:
// httplib 0.11's own URL parser takes only [digits and colons], so the watcher parses it.
TEST_CASE("k8s: the watcher lists from an IPv6 address") {
  testing::FakeApiServer server("node-a", "", "::1");
  testing::FakePod pod;
  pod.uid = kUid;
  pod.name = "web-0";
  pod.namespace_name = "shop";
  pod.node = "node-a";
  pod.app = "web";
  pod.container = "web";
  pod.container_id = kId;
  server.Apply(pod);
  k8s::PodStore store;
  k8s::PodWatcherOptions o;
  o.api_url = server.url();
  o.node_name = "node-a";
  o.token_file = "";
  k8s::PodWatcher watcher(o, &store);
  REQUIRE(watcher.Start().ok());
  for (int i = 0; i < 500 && !watcher.stats().synced; ++i) absl::SleepFor(absl::Milliseconds(10));
  CHECK(watcher.stats().synced);
  CHECK(store.stats().pods == 1);
  watcher.Stop();
}

}  // namespace
}  // namespace parascope

namespace parascope {
namespace {

// Stop() interrupts a quiet watch at once instead of waiting for its timeoutSeconds (300 s).
TEST_CASE("k8s: Stop() ends a quiet watch at once") {
  testing::FakeApiServer server("node-a");
  k8s::PodStore store;
  k8s::PodWatcherOptions o;
  o.api_url = server.url();
  o.node_name = "node-a";
  o.token_file = "";
  k8s::PodWatcher watcher(o, &store);
  REQUIRE(watcher.Start().ok());
  for (int i = 0; i < 500 && server.watches() < 1; ++i) absl::SleepFor(absl::Milliseconds(10));
  REQUIRE(server.watches() == 1);
  const absl::Time t0 = absl::Now();
  watcher.Stop();
  CHECK(absl::Now() - t0 < absl::Seconds(2));
}

}  // namespace
}  // namespace parascope
