#include "agent/export/labels.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace parascope {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = std::string(PS_FIXTURE_DIR) + "/proc/root";
constexpr uint64_t kTick = 10'000'000;  // ns per USER_HZ tick
// Fixture pid 500N has start time 20000N ticks.
proc::ProcessKey Key(uint32_t pid) { return {pid, (200000 + pid - 5000) * kTick + 4321}; }

// A writable copy of the fixture proc root with exe links (kept out of the source tree so
// fs::copy of the fixture root does not follow dangling links), removed at scope exit.
class TempProcRoot {
 public:
  TempProcRoot() {
    std::string tmpl = (fs::temp_directory_path() / "ps-labels-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    fs::copy(kRoot, dir_, fs::copy_options::recursive);
    Exe(5001, "/usr/sbin/nginx");
    Exe(5002, "/usr/bin/python3.11");
    Exe(5003, "/usr/sbin/nginx");
    Exe(5004, "/opt/app/bin/worker (deleted)");
    Exe(5006, "/home/u/bin/myapp");
  }
  ~TempProcRoot() { fs::remove_all(dir_); }
  const std::string& dir() const { return dir_; }
  void Exe(uint32_t pid, const std::string& target) {
    fs::create_symlink(target, absl::StrCat(dir_, "/", pid, "/exe"));
  }
  void Write(uint32_t pid, const std::string& file, const std::string& text) {
    std::ofstream(absl::StrCat(dir_, "/", pid, "/", file), std::ios::trunc) << text;
  }

 private:
  std::string dir_;
};

LabelOptions Options(const std::string& proc_root) {
  LabelOptions o;
  o.hostname = "node-a";
  o.proc_root = proc_root;
  return o;
}

TEST_CASE("Labels: OTEL_SERVICE_NAME wins, first occurrence, fixed label order") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  o.external = {{"env", "prod"}, {"region", "eu-west-1"}};
  SeriesLabeler labeler(o);
  auto labels = labeler.Labels(Key(5001), "nginx", "process_cpu");
  INFO(labels.status().ToString());
  REQUIRE(labels.ok());
  CHECK(*labels == LabelList{{"__name__", "process_cpu"},
                             {"service_name", "checkout"},
                             {"hostname", "node-a"},
                             {"env", "prod"},
                             {"region", "eu-west-1"}});
  CHECK(labeler.ServiceName(Key(5001), "nginx") ==
        std::pair<std::string, ServiceNameSource>("checkout", ServiceNameSource::kOtelEnv));
}

TEST_CASE("Labels: service_name chain per fixture process") {
  TempProcRoot root;
  SeriesLabeler labeler(Options(root.dir()));
  using P = std::pair<std::string, ServiceNameSource>;
  // Empty OTEL_SERVICE_NAME is unset; cgroup v1 hybrid would give "billing".
  CHECK(labeler.ServiceName(Key(5002), "python3") ==
        P("billing-api", ServiceNameSource::kPyroscopeEnv));
  CHECK(labeler.ServiceName(Key(5003), "nginx") == P("nginx", ServiceNameSource::kSystemdUnit));
  CHECK(labeler.ServiceName(Key(5004), "worker") == P("worker", ServiceNameSource::kExecutable));
  // In a docker container: no unit, no readable exe -> the comm passed in.
  CHECK(labeler.ServiceName(Key(5005), "redis-server") ==
        P("redis-server", ServiceNameSource::kProcessName));
  CHECK(labeler.ServiceName(Key(5006), "myapp") == P("myapp", ServiceNameSource::kSystemdUnit));
  // Gone, or the pid now belongs to a process started 2 ticks later.
  CHECK(labeler.ServiceName({9999, 1}, "short-lived") ==
        P("short-lived", ServiceNameSource::kProcessName));
  CHECK(labeler.ServiceName({5001, Key(5001).start_boot_ns - 2 * kTick}, "nginx") ==
        P("nginx", ServiceNameSource::kProcessName));
  CHECK(labeler.ServiceName({9998, 1}, "") == P("unknown", ServiceNameSource::kProcessName));
  CHECK(labeler.cached_processes() == 8);
}

TEST_CASE("Labels: executable name when nothing else is known") {
  TempProcRoot root;
  root.Write(5003, "cgroup", "0::/\n");
  root.Write(5003, "environ", "");
  SeriesLabeler labeler(Options(root.dir()));
  auto labels = labeler.Labels(Key(5003), "nginx: worker", "off_cpu");
  REQUIRE(labels.ok());
  CHECK(*labels ==
        LabelList{{"__name__", "off_cpu"}, {"service_name", "nginx"}, {"hostname", "node-a"}});
}

TEST_CASE("Labels: --service-name for a pid filter run, pid label") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  o.pid_filter_run = true;
  o.service_name = "my-service";
  o.pid_label = true;
  SeriesLabeler labeler(o);
  auto labels = labeler.Labels(Key(5001), "nginx", "wall");
  REQUIRE(labels.ok());
  CHECK(*labels == LabelList{{"__name__", "wall"},
                             {"service_name", "my-service"},
                             {"hostname", "node-a"},
                             {"pid", "5001"}});

  // A pid filter run without --service-name uses the chain.
  LabelOptions no_flag = Options(root.dir());
  no_flag.pid_filter_run = true;
  SeriesLabeler chain(no_flag);
  CHECK(chain.ServiceName(Key(5001), "nginx").first == "checkout");
}

TEST_CASE("Labels: Kubernetes seam adds labels and <namespace>/<container>") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  std::string seen_cgroup;
  o.kubernetes = [&seen_cgroup](const proc::ProcessKey& key,
                                absl::string_view cgroup) -> std::optional<KubernetesInfo> {
    seen_cgroup = std::string(cgroup);
    if (key.tgid != 5005) return std::nullopt;
    KubernetesInfo k;
    k.namespace_name = "shop";
    k.pod = "redis-0";
    k.container = "redis";
    return k;
  };
  SeriesLabeler labeler(o);
  auto labels = labeler.Labels(Key(5005), "redis-server", "latency");
  REQUIRE(labels.ok());
  CHECK(*labels == LabelList{{"__name__", "latency"},
                             {"service_name", "shop/redis"},
                             {"hostname", "node-a"},
                             {"namespace", "shop"},
                             {"pod", "redis-0"},
                             {"container", "redis"}});
  CHECK(seen_cgroup ==
        "0::/system.slice/"
        "docker-3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899.scope\n");
  // The environment still wins over Kubernetes.
  CHECK(labeler.ServiceName(Key(5001), "nginx").first == "checkout");
}

TEST_CASE("Labels: cache lives while used, forgotten after an unused window") {
  TempProcRoot root;
  SeriesLabeler labeler(Options(root.dir()));
  CHECK(labeler.ServiceName(Key(5003), "nginx").first == "nginx");
  labeler.EndWindow();
  root.Write(5003, "environ", std::string("OTEL_SERVICE_NAME=renamed\0", 26));
  CHECK(labeler.ServiceName(Key(5003), "nginx").first == "nginx");  // cached
  labeler.EndWindow();
  CHECK(labeler.cached_processes() == 1);
  labeler.EndWindow();  // not used during this window
  CHECK(labeler.cached_processes() == 0);
  CHECK(labeler.ServiceName(Key(5003), "nginx").first == "renamed");
}

TEST_CASE("Labels: a full cache resolves without caching") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  o.max_cached_processes = 1;
  SeriesLabeler labeler(o);
  CHECK(labeler.ServiceName(Key(5003), "nginx").first == "nginx");
  CHECK(labeler.ServiceName(Key(5001), "nginx").first == "checkout");
  CHECK(labeler.ServiceName(Key(5002), "python3").first == "billing-api");
  CHECK(labeler.cached_processes() == 1);
}

TEST_CASE("Labels: derived values are sanitized and truncated to 2048 bytes") {
  TempProcRoot root;
  // 2047 ASCII bytes then a 2-byte UTF-8 sequence: cut before it, not inside it.
  std::string name = std::string(2047, 'a') + "\xc3\xa9" + "tail";
  root.Write(5003, "environ", "OTEL_SERVICE_NAME=" + name + std::string(1, '\0'));
  SeriesLabeler labeler(Options(root.dir()));
  CHECK(labeler.ServiceName(Key(5003), "nginx").first == std::string(2047, 'a'));

  CHECK(SanitizeLabelValue("caf\xc3\xa9") == "caf\xc3\xa9");
  CHECK(SanitizeLabelValue("bad\xff\xc3(x") == "bad\?\?(x");
  CHECK(SanitizeLabelValue("\xed\xa0\x80") == "???");  // a UTF-16 surrogate
  CHECK(SanitizeLabelValue(std::string(3000, 'b')) == std::string(2048, 'b'));
}

TEST_CASE("Labels: more than 30 labels is an error, empty type too") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  for (int i = 0; i < 27; ++i) o.external.emplace_back(absl::StrCat("l", i), "v");
  {
    SeriesLabeler labeler(o);
    auto labels = labeler.Labels(Key(5003), "nginx", "process_cpu");
    REQUIRE(labels.ok());
    CHECK(labels->size() == 30);
    CHECK(labeler.Labels(Key(5003), "nginx", "").status().message() ==
          "empty profile type (__name__)");
  }
  o.pid_label = true;
  SeriesLabeler labeler(o);
  CHECK(labeler.Labels(Key(5003), "nginx", "process_cpu").status().message() ==
        "31 series labels, at most 30 (SPEC section 4)");
}

TEST_CASE("ValidateExternalLabels") {
  CHECK(ValidateExternalLabels({{"env", "prod"}, {"_team9", "a=b"}}).ok());
  CHECK(ValidateLabelName("9lives").message() ==
        "label name \"9lives\" does not match [a-zA-Z_][a-zA-Z0-9_]*");
  CHECK(ValidateExternalLabels({{"env", "prod"}, {"bad-name", "x"}}).message() ==
        "label name \"bad-name\" does not match [a-zA-Z_][a-zA-Z0-9_]*");
  CHECK(ValidateExternalLabels({{"", "x"}}).code() == absl::StatusCode::kInvalidArgument);
  CHECK(ValidateExternalLabels({{"__name__", "x"}}).message() ==
        "--external-label __name__: names starting with \"__\" are reserved");
  CHECK(ValidateExternalLabels({{"hostname", "x"}}).message() ==
        "--external-label hostname: the agent sets this label itself");
  CHECK(ValidateExternalLabels({{"container_id", "x"}}).message() ==
        "--external-label container_id: the agent sets this label itself");
  CHECK(ValidateExternalLabels({{"service_name", "x"}}).message() ==
        "--external-label service_name: the agent sets this label itself (use --service-name "
        "with --pid, or set OTEL_SERVICE_NAME)");
  CHECK(ValidateExternalLabels({{"env", "a"}, {"env", "b"}}).message() ==
        "--external-label env: given more than once");
  CHECK(ValidateExternalLabels({{"env", ""}}).message() == "--external-label env: empty value");
  CHECK(ValidateExternalLabels({{"env", std::string(2048, 'x')}}).ok());
  CHECK(ValidateExternalLabels({{"env", std::string(2049, 'x')}}).message() ==
        "--external-label env: value is 2049 bytes, at most 2048");
  CHECK(ValidateExternalLabels({{"env", "\xff"}}).message() ==
        "--external-label env: value is not valid UTF-8");

  LabelList many;
  for (int i = 0; i < 27; ++i) many.emplace_back(absl::StrCat("l", i), "v");
  CHECK(ValidateExternalLabels(many).ok());
  CHECK(ValidateExternalLabels(many, /*pid_label=*/true).message() ==
        "--external-label: 27 labels plus the agent's 4 exceed the limit of 30 series labels");
  many.resize(22);
  CHECK(ValidateExternalLabels(many, true, /*kubernetes=*/true).ok());
  many.emplace_back("l22", "v");
  CHECK(ValidateExternalLabels(many, true, true).message() ==
        "--external-label: 23 labels plus the agent's 8 exceed the limit of 30 series labels");
}

TEST_CASE("ParseExternalLabel") {
  auto a = ParseExternalLabel("env=prod=blue");
  REQUIRE(a.ok());
  CHECK(*a == Label("env", "prod=blue"));
  auto b = ParseExternalLabel("env=");
  REQUIRE(b.ok());
  CHECK(*b == Label("env", ""));
  CHECK(ParseExternalLabel("env").status().message() ==
        "--external-label \"env\": expected NAME=VALUE");
  CHECK(ParseExternalLabel("=v").status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("EnvironValue") {
  std::string environ("A=1\0AB=2\0B=\0A=3\0C=x=y", 21);
  CHECK(EnvironValue(environ, "A") == std::optional<std::string>("1"));
  CHECK(EnvironValue(environ, "AB") == std::optional<std::string>("2"));
  CHECK(EnvironValue(environ, "B") == std::optional<std::string>(""));
  CHECK(EnvironValue(environ, "C") == std::optional<std::string>("x=y"));  // no trailing NUL
  CHECK(EnvironValue(environ, "D") == std::nullopt);
  CHECK(EnvironValue("", "A") == std::nullopt);
}

TEST_CASE("ParseCgroup: systemd units") {
  CgroupInfo v2 = ParseCgroup("0::/system.slice/nginx.service\n");
  CHECK(v2.path == "/system.slice/nginx.service");
  CHECK(v2.systemd_unit == "nginx");
  CHECK(v2.container_id == "");
  CHECK(ParseCgroup("0::/system.slice/system-getty.slice/getty@tty1.service\n").systemd_unit ==
        "getty@tty1");
  // Delegated sub-cgroups of a service.
  CHECK(ParseCgroup("0::/system.slice/app.service/payload\n").systemd_unit == "app");
  CHECK(ParseCgroup("0::/user.slice/user-1000.slice/user@1000.service/app.slice/"
                    "myapp.service\n")
            .systemd_unit == "myapp");
  CHECK(ParseCgroup("0::/user.slice/user-1000.slice/user@1000.service/init.scope\n").systemd_unit ==
        "");
  CHECK(ParseCgroup("0::/user.slice/user-1000.slice/session-3.scope\n").systemd_unit == "");
  CHECK(ParseCgroup("0::/init.scope\n").systemd_unit == "");
  CHECK(ParseCgroup("0::/\n").path == "");
  CHECK(ParseCgroup("").path == "");
  // v1 hybrid: the unified line is "/", name=systemd has the path.
  CgroupInfo v1 = ParseCgroup(
      "12:cpu,cpuacct:/system.slice/billing.service\n1:name=systemd:/system.slice/"
      "billing.service\n0::/\n");
  CHECK(v1.path == "/system.slice/billing.service");
  CHECK(v1.systemd_unit == "billing");
  // Pure v1 without name=systemd: the first non-root path.
  CHECK(ParseCgroup("3:memory:/\n2:pids:/system.slice/cron.service\n").systemd_unit == "cron");
}

TEST_CASE("ParseCgroup: containers") {
  const std::string id = "3f4e5d6c7b8a99887766554433221100ffeeddccbbaa00112233445566778899";
  CgroupInfo docker = ParseCgroup("0::/system.slice/docker-" + id + ".scope\n");
  CHECK(docker.container_id == id);
  CHECK(docker.systemd_unit == "");
  CHECK(ParseCgroup("0::/machine.slice/libpod-" + id + ".scope/container\n").container_id == id);
  CHECK(ParseCgroup("0::/machine.slice/libpod-conmon-" + id + ".scope\n").container_id == "");
  const std::string pod =
      "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234.slice";
  CgroupInfo k8s = ParseCgroup("0::" + pod + "/cri-containerd-" + id + ".scope\n");
  CHECK(k8s.container_id == id);
  CHECK(ParseCgroup("0::/kubepods/besteffort/pod1234/crio-" + id + ".scope\n").container_id == id);
  // cgroupfs driver; and a container run by a service: the engine's unit is not the service.
  CgroupInfo cgroupfs = ParseCgroup("0::/system.slice/containerd.service/docker/" + id + "\n");
  CHECK(cgroupfs.container_id == id);
  CHECK(cgroupfs.systemd_unit == "");
  // systemd inside a container (no cgroup namespace): the unit below the container counts.
  CgroupInfo inner =
      ParseCgroup("0::/system.slice/docker-" + id + ".scope/system.slice/postgres.service\n");
  CHECK(inner.container_id == id);
  CHECK(inner.systemd_unit == "postgres");
}

// The pod annotation beats OTEL_SERVICE_NAME; an incomplete lookup (container not listed yet) is
// repeated only once the pods changed; a process that is gone keeps <namespace>/<container>.
TEST_CASE("Labels: pod annotation first, incomplete pods looked up again once the pods change") {
  TempProcRoot root;
  LabelOptions o = Options(root.dir());
  uint64_t generation = 7;
  int lookups = 0;
  KubernetesInfo answer;
  answer.namespace_name = "shop";
  answer.pod = "checkout-0";
  answer.node = "node-a";
  answer.complete = false;  // the pod does not list the container yet
  answer.generation = 7;
  o.kubernetes = [&](const proc::ProcessKey&, absl::string_view) -> std::optional<KubernetesInfo> {
    ++lookups;
    return answer;
  };
  o.kubernetes_generation = [&] { return generation; };
  SeriesLabeler labeler(o);
  using P = std::pair<std::string, ServiceNameSource>;
  // 5001 has OTEL_SERVICE_NAME=checkout; no container yet, so no <namespace>/<container> either.
  CHECK(labeler.ServiceName(Key(5001), "nginx") == P("checkout", ServiceNameSource::kOtelEnv));
  CHECK(lookups == 1);
  labeler.EndWindow();
  // The pods did not change: not asked again.
  CHECK(labeler.ServiceName(Key(5001), "nginx").first == "checkout");
  CHECK(lookups == 1);
  labeler.EndWindow();
  // They changed: asked again (once this window), and the annotation now wins.
  answer.container = "web";
  answer.complete = true;
  answer.service_name = "storefront";
  answer.generation = 8;
  generation = 8;
  CHECK(labeler.ServiceName(Key(5001), "nginx") ==
        P("storefront", ServiceNameSource::kPodAnnotation));
  CHECK(labeler.ServiceName(Key(5001), "nginx").first == "storefront");
  CHECK(lookups == 2);
  auto labels = labeler.Labels(Key(5001), "nginx", "wall");
  REQUIRE(labels.ok());
  CHECK(*labels == LabelList{{"__name__", "wall"},
                             {"service_name", "storefront"},
                             {"hostname", "node-a"},
                             {"namespace", "shop"},
                             {"pod", "checkout-0"},
                             {"container", "web"},
                             {"node", "node-a"}});
  // A process that is gone (its cgroup known to the lookup from exec): <namespace>/<container>.
  answer.service_name = "";
  CHECK(labeler.ServiceName({9999, 1}, "sh") == P("shop/web", ServiceNameSource::kKubernetes));
}

}  // namespace
}  // namespace parascope
