// deploy/kubernetes/ without kubectl: every file the kustomization names exists and parses, and
// the manifests hold to what the agent needs, checked against the code's ground truth: the
// added capabilities are AgentCapabilities() (agent/util/capabilities.h), the ConfigMap's
// config.yaml is accepted by the agent's own --config loader (the built binary, as in a pod),
// the memory limit covers the measured peak plus the push queue and the configured unwind tables.
// `kubectl kustomize deploy/kubernetes` renders the same files where kubectl exists.
#include <sys/wait.h>
#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/util/capabilities.h"

namespace parascope {
namespace {

namespace fs = std::filesystem;

const std::string kDir = std::string(PS_SOURCE_DIR) + "/deploy/kubernetes";

// The kustomization and every object of the files it lists, by kind (each kind once here).
struct Manifests {
  YAML::Node kustomization;
  std::map<std::string, YAML::Node> by_kind;
  std::vector<std::string> files;
};

Manifests Load() {
  Manifests m;
  m.kustomization = YAML::LoadFile(kDir + "/kustomization.yaml");
  REQUIRE(m.kustomization["resources"].IsSequence());
  for (const YAML::Node& r : m.kustomization["resources"]) {
    std::string path = kDir + "/" + r.as<std::string>();
    INFO(path);
    REQUIRE(fs::is_regular_file(path));
    m.files.push_back(path);
    std::vector<YAML::Node> docs = YAML::LoadAllFromFile(path);
    REQUIRE(!docs.empty());
    for (const YAML::Node& d : docs) {
      REQUIRE(d.IsMap());
      REQUIRE(d["apiVersion"].IsScalar());
      REQUIRE(d["kind"].IsScalar());
      REQUIRE(d["metadata"]["name"].IsScalar());
      std::string kind = d["kind"].as<std::string>();
      REQUIRE(m.by_kind.count(kind) == 0);
      m.by_kind[kind] = d;
    }
  }
  return m;
}

std::set<std::string> Strings(const YAML::Node& seq) {
  std::set<std::string> out;
  if (!seq.IsSequence()) return out;
  for (const YAML::Node& n : seq) out.insert(n.as<std::string>());
  return out;
}

// A Kubernetes memory quantity ("512Mi", "1Gi", "268435456", "300M") in bytes; -1 if not one.
int64_t Bytes(const std::string& q) {
  static const std::vector<std::pair<std::string, int64_t>> kSuffixes = {
      {"Ki", int64_t{1} << 10}, {"Mi", int64_t{1} << 20}, {"Gi", int64_t{1} << 30},
      {"k", 1000},              {"M", 1000000},           {"G", 1000000000}};
  for (const auto& [suffix, unit] : kSuffixes) {
    int64_t n = 0;
    if (absl::EndsWith(q, suffix) && absl::SimpleAtoi(q.substr(0, q.size() - suffix.size()), &n)) {
      return n * unit;
    }
  }
  int64_t n = 0;
  return absl::SimpleAtoi(q, &n) ? n : -1;
}

// The one container of the DaemonSet's pod template.
YAML::Node Container(const Manifests& m) {
  YAML::Node spec = m.by_kind.at("DaemonSet")["spec"]["template"]["spec"];
  REQUIRE(spec["containers"].size() == 1);
  return spec["containers"][0];
}

// The ConfigMap's config.yaml (the kustomization's configMapGenerator) and its generator.
std::string ConfigPath(const Manifests& m, std::string* configmap_name) {
  const YAML::Node gens = m.kustomization["configMapGenerator"];
  REQUIRE(gens.IsSequence());
  REQUIRE(gens.size() == 1);
  REQUIRE(Strings(gens[0]["files"]) == std::set<std::string>{"config.yaml"});
  if (configmap_name != nullptr) *configmap_name = gens[0]["name"].as<std::string>();
  return kDir + "/config.yaml";
}

}  // namespace

TEST_CASE("deploy/kubernetes: every file of the kustomization exists and parses", "[deploy]") {
  Manifests m = Load();
  CHECK(m.kustomization["kind"].as<std::string>() == "Kustomization");
  for (const char* kind : {"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                           "DaemonSet"}) {
    INFO(kind);
    CHECK(m.by_kind.count(kind) == 1);
  }
  std::string config = ConfigPath(m, nullptr);
  REQUIRE(fs::is_regular_file(config));
  CHECK(YAML::LoadFile(config).IsMap());
  // Everything lands in the kustomization's namespace, which admits the DaemonSet.
  const std::string ns = m.kustomization["namespace"].as<std::string>();
  CHECK(m.by_kind["Namespace"]["metadata"]["name"].as<std::string>() == ns);
  CHECK(m.by_kind["Namespace"]["metadata"]["labels"]["pod-security.kubernetes.io/enforce"]
            .as<std::string>() == "privileged");
  for (const char* kind : {"ServiceAccount", "DaemonSet"}) {
    CHECK(m.by_kind[kind]["metadata"]["namespace"].as<std::string>() == ns);
  }
}

TEST_CASE("deploy/kubernetes: the DaemonSet adds exactly the agent's capabilities", "[deploy]") {
  Manifests m = Load();
  YAML::Node sc = Container(m)["securityContext"];
  std::set<std::string> want;
  for (const CapabilityNeed& c : AgentCapabilities()) {
    std::string name = c.name;
    REQUIRE(absl::StartsWith(name, "CAP_"));
    want.insert(name.substr(4));  // Kubernetes spells them without CAP_
  }
  CHECK(want.size() == 6);
  CHECK(Strings(sc["capabilities"]["add"]) == want);
  CHECK(Strings(sc["capabilities"]["drop"]) == std::set<std::string>{"ALL"});
  // File capabilities (the image's) apply only without no_new_privs.
  CHECK(sc["allowPrivilegeEscalation"].as<bool>());
  CHECK(sc["readOnlyRootFilesystem"].as<bool>());
  CHECK((!sc["privileged"] || !sc["privileged"].as<bool>()));
  YAML::Node pod = m.by_kind["DaemonSet"]["spec"]["template"]["spec"];
  CHECK(pod["securityContext"]["runAsNonRoot"].as<bool>());
  CHECK(!pod["initContainers"]);
  CHECK((!pod["hostNetwork"] || !pod["hostNetwork"].as<bool>()));
}

TEST_CASE("deploy/kubernetes: hostPID, no host paths, writable only emptyDirs", "[deploy]") {
  Manifests m = Load();
  YAML::Node pod = m.by_kind["DaemonSet"]["spec"]["template"]["spec"];
  CHECK(pod["hostPID"].as<bool>());
  std::map<std::string, YAML::Node> volumes;
  for (const YAML::Node& v : pod["volumes"]) {
    INFO(v["name"].as<std::string>());
    CHECK(!v["hostPath"]);
    volumes[v["name"].as<std::string>()] = v;
  }
  for (const YAML::Node& mount : Container(m)["volumeMounts"]) {
    std::string name = mount["name"].as<std::string>();
    INFO(name);
    REQUIRE(volumes.count(name) == 1);
    bool read_only = mount["readOnly"] && mount["readOnly"].as<bool>();
    if (!read_only) CHECK(volumes[name]["emptyDir"]);
  }
  CHECK(pod["serviceAccountName"].as<std::string>() ==
        m.by_kind["ServiceAccount"]["metadata"]["name"].as<std::string>());
}

TEST_CASE("deploy/kubernetes: NODE_NAME comes from spec.nodeName", "[deploy]") {
  Manifests m = Load();
  int found = 0;
  for (const YAML::Node& e : Container(m)["env"]) {
    if (e["name"].as<std::string>() != "NODE_NAME") continue;
    ++found;
    CHECK(e["valueFrom"]["fieldRef"]["fieldPath"].as<std::string>() == "spec.nodeName");
  }
  CHECK(found == 1);
}

TEST_CASE("deploy/kubernetes: the ClusterRole gets, lists and watches pods, nothing else",
          "[deploy]") {
  Manifests m = Load();
  YAML::Node rules = m.by_kind["ClusterRole"]["rules"];
  REQUIRE(rules.size() == 1);
  CHECK(Strings(rules[0]["apiGroups"]) == std::set<std::string>{""});
  CHECK(Strings(rules[0]["resources"]) == std::set<std::string>{"pods"});
  CHECK(Strings(rules[0]["verbs"]) == std::set<std::string>{"get", "list", "watch"});
  CHECK(!rules[0]["resourceNames"]);
  CHECK(!rules[0]["nonResourceURLs"]);
  YAML::Node binding = m.by_kind["ClusterRoleBinding"];
  CHECK(binding["roleRef"]["kind"].as<std::string>() == "ClusterRole");
  CHECK(binding["roleRef"]["name"].as<std::string>() ==
        m.by_kind["ClusterRole"]["metadata"]["name"].as<std::string>());
  REQUIRE(binding["subjects"].size() == 1);
  YAML::Node subject = binding["subjects"][0];
  CHECK(subject["kind"].as<std::string>() == "ServiceAccount");
  CHECK(subject["name"].as<std::string>() ==
        m.by_kind["ServiceAccount"]["metadata"]["name"].as<std::string>());
  CHECK(subject["namespace"].as<std::string>() == m.kustomization["namespace"].as<std::string>());
}

TEST_CASE("deploy/kubernetes: the container reads the ConfigMap's config.yaml and serves the probes",
          "[deploy]") {
  Manifests m = Load();
  std::string configmap;
  YAML::Node config = YAML::LoadFile(ConfigPath(m, &configmap));
  YAML::Node c = Container(m);
  CHECK(Strings(c["args"]) == std::set<std::string>{"--config=/etc/parascope/config.yaml"});
  std::string config_volume;
  for (const YAML::Node& v : m.by_kind["DaemonSet"]["spec"]["template"]["spec"]["volumes"]) {
    if (v["configMap"] && v["configMap"]["name"].as<std::string>() == configmap) {
      config_volume = v["name"].as<std::string>();
    }
  }
  REQUIRE(!config_volume.empty());
  bool mounted = false;
  for (const YAML::Node& mount : c["volumeMounts"]) {
    if (mount["name"].as<std::string>() == config_volume) {
      mounted = mount["mountPath"].as<std::string>() == "/etc/parascope";
    }
  }
  CHECK(mounted);
  // Pushes, writes no files; the HTTP endpoint listens on the pod IP at the container's port.
  CHECK(!config["remote-url"].as<std::string>().empty());
  CHECK((!config["output-dir"] || config["output-dir"].as<std::string>().empty()));
  std::string http = config["http-address"].as<std::string>();
  CHECK(absl::StartsWith(http, "0.0.0.0:"));
  REQUIRE(c["ports"].size() == 1);
  CHECK(http == absl::StrCat("0.0.0.0:", c["ports"][0]["containerPort"].as<int>()));
  CHECK(c["readinessProbe"]["httpGet"]["path"].as<std::string>() == "/readyz");
  CHECK(c["livenessProbe"]["httpGet"]["path"].as<std::string>() == "/healthz");
  // The debuginfod cache is inside a writable mount.
  std::string cache = config["debuginfod-cache-dir"].as<std::string>();
  bool writable = false;
  for (const YAML::Node& mount : c["volumeMounts"]) {
    bool read_only = mount["readOnly"] && mount["readOnly"].as<bool>();
    if (!read_only && absl::StartsWith(cache, mount["mountPath"].as<std::string>() + "/")) {
      writable = true;
    }
  }
  CHECK(writable);
}

// BPF maps are charged to the memory cgroup: the limit covers the peak measured with the default
// 32 MiB of unwind tables (237 MiB, daemonset.yaml), the push queue's bound, and any unwind
// table bytes configured beyond 32 MiB.
TEST_CASE("deploy/kubernetes: the memory limit covers the BPF maps and the push queue",
          "[deploy]") {
  Manifests m = Load();
  YAML::Node config = YAML::LoadFile(ConfigPath(m, nullptr));
  YAML::Node resources = Container(m)["resources"];
  int64_t limit = Bytes(resources["limits"]["memory"].as<std::string>());
  int64_t request = Bytes(resources["requests"]["memory"].as<std::string>());
  REQUIRE(limit > 0);
  REQUIRE(request > 0);
  CHECK(request <= limit);
  const int64_t kMiB = int64_t{1} << 20;
  int64_t unwind = config["unwind-table-bytes"] ? config["unwind-table-bytes"].as<int64_t>()
                                                : 32 * kMiB;
  int64_t queue = config["queue-max-bytes"] ? config["queue-max-bytes"].as<int64_t>() : 64 * kMiB;
  int64_t need = 237 * kMiB + queue + std::max<int64_t>(0, unwind - 32 * kMiB);
  INFO("limit " << limit / kMiB << " MiB, need " << need / kMiB << " MiB");
  CHECK(limit >= need);
  CHECK(resources["requests"]["cpu"]);
  CHECK(resources["limits"]["cpu"]);
}

// The agent's own --config loader (agent/config/config_file.h) over the agent's flags: the built
// binary applies the file, then --help exits 0 without touching the kernel.
TEST_CASE("deploy/kubernetes: config.yaml passes the agent's --config loader", "[deploy]") {
  Manifests m = Load();
  std::string cmd =
      absl::StrCat(PS_AGENT_BIN, " --config=", ConfigPath(m, nullptr), " --help 2>&1 >/dev/null");
  FILE* p = popen(cmd.c_str(), "r");
  REQUIRE(p != nullptr);
  std::string out;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) out.append(buf, n);
  int status = pclose(p);
  INFO(cmd << "\n" << out);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace parascope
