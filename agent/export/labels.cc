#include "agent/export/labels.h"

#include <unistd.h>

#include <algorithm>
#include <climits>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/util/status.h"

namespace parascope {
namespace {

// Labels the agent sets itself; external labels may not use them.
constexpr absl::string_view kAgentLabelNames[] = {
    "service_name", "hostname", "pid", "namespace", "pod", "container", "container_id", "node"};
// __name__, service_name, hostname.
constexpr size_t kBaseLabels = 3;
// namespace, pod, container or container_id, node.
constexpr size_t kKubernetesLabels = 4;

bool IsNameStart(char c) { return absl::ascii_isalpha(c) || c == '_'; }

// Length of the valid UTF-8 sequence starting at s[i], or 0 if invalid (RFC 3629: no overlong
// forms, no surrogates, at most U+10FFFF).
size_t Utf8SequenceLength(absl::string_view s, size_t i) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = byte(i);
  if (c < 0x80) return 1;
  size_t n;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  if (byte(i + 1) < lo || byte(i + 1) > hi) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

bool IsValidUtf8(absl::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t n = Utf8SequenceLength(s, i);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

bool IsContainerIdChars(absl::string_view id) {
  if (id.size() < 12) return false;
  for (char c : id) {
    if (!absl::ascii_isxdigit(c)) return false;
  }
  return true;
}

// The container id named by one cgroup path component, or "": "<runtime>-<id>.scope" (systemd
// cgroup driver: docker, libpod, crio, cri-containerd), "crio-<id>" (CRI-O's cgroupfs driver) or
// a bare id of 64 hex digits (cgroupfs driver: docker, containerd). Monitors (conmon) are not
// containers.
std::string ContainerIdOfComponent(absl::string_view component) {
  const bool scope = absl::ConsumeSuffix(&component, ".scope");
  if (absl::StartsWith(component, "libpod-conmon-") || absl::StartsWith(component, "crio-conmon-")) {
    return "";
  }
  for (absl::string_view runtime : {"docker-", "libpod-", "crio-", "cri-containerd-"}) {
    absl::string_view id = component;
    if (absl::ConsumePrefix(&id, runtime) && IsContainerIdChars(id) &&
        (scope || runtime == "crio-")) {
      return absl::AsciiStrToLower(id);
    }
  }
  if (!scope && component.size() == 64 && IsContainerIdChars(component)) {
    return absl::AsciiStrToLower(component);
  }
  return "";
}

// The pod UID named by one cgroup path component of the kubelet's hierarchy, or "":
// "pod<uid>" (cgroupfs driver: /kubepods/burstable/pod<uid>) or "...-pod<uid>.slice" (systemd
// driver: kubepods-besteffort-pod<uid with '_' for '-'>.slice; kind's kubelet-kubepods-...). The
// uid is 36 characters (8-4-4-4-12 hex) or, for a static pod, its 32-hex-digit config hash.
std::string PodUidOfComponent(absl::string_view component) {
  absl::ConsumeSuffix(&component, ".slice");
  size_t at = component.rfind("pod");
  if (at == absl::string_view::npos || (at != 0 && component[at - 1] != '-')) return "";
  absl::string_view uid = component.substr(at + 3);
  if (uid.size() != 36 && uid.size() != 32) return "";
  for (size_t i = 0; i < uid.size(); ++i) {
    char c = uid[i];
    bool dash_pos = uid.size() == 36 && (i == 8 || i == 13 || i == 18 || i == 23);
    if (dash_pos ? (c != '-' && c != '_') : !absl::ascii_isxdigit(c)) return "";
  }
  std::string out = absl::AsciiStrToLower(uid);
  std::replace(out.begin(), out.end(), '_', '-');
  return out;
}

std::string BaseName(absl::string_view path) {
  absl::ConsumeSuffix(&path, " (deleted)");
  size_t slash = path.rfind('/');
  if (slash != absl::string_view::npos) path.remove_prefix(slash + 1);
  return std::string(path);
}

}  // namespace

absl::Status ValidateLabelName(absl::string_view name) {
  bool ok = !name.empty() && IsNameStart(name[0]);
  for (char c : name) ok = ok && (absl::ascii_isalnum(c) || c == '_');
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("label name \"", name, "\" does not match [a-zA-Z_][a-zA-Z0-9_]*"));
  }
  return absl::OkStatus();
}

absl::Status ValidateExternalLabels(const LabelList& external, bool pid_label, bool kubernetes) {
  for (size_t i = 0; i < external.size(); ++i) {
    const auto& [name, value] = external[i];
    std::string where = absl::StrCat("--external-label ", name, ": ");
    PS_RETURN_IF_ERROR(ValidateLabelName(name));
    if (absl::StartsWith(name, "__")) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "names starting with \"__\" are reserved"));
    }
    for (absl::string_view agent_label : kAgentLabelNames) {
      if (name == agent_label) {
        return absl::InvalidArgumentError(absl::StrCat(
            where, "the agent sets this label itself",
            name == "service_name" ? " (use --service-name with --pid, or set OTEL_SERVICE_NAME)"
                                   : ""));
      }
    }
    for (size_t j = 0; j < i; ++j) {
      if (external[j].first == name) {
        return absl::InvalidArgumentError(absl::StrCat(where, "given more than once"));
      }
    }
    if (value.empty()) return absl::InvalidArgumentError(absl::StrCat(where, "empty value"));
    if (value.size() > kMaxLabelValueBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "value is ", value.size(), " bytes, at most ", kMaxLabelValueBytes));
    }
    if (!IsValidUtf8(value)) {
      return absl::InvalidArgumentError(absl::StrCat(where, "value is not valid UTF-8"));
    }
  }
  size_t agent_labels = kBaseLabels + (pid_label ? 1 : 0) + (kubernetes ? kKubernetesLabels : 0);
  if (agent_labels + external.size() > kMaxSeriesLabels) {
    return absl::InvalidArgumentError(
        absl::StrCat("--external-label: ", external.size(), " labels plus the agent's ",
                     agent_labels, " exceed the limit of ", kMaxSeriesLabels, " series labels"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Label> ParseExternalLabel(absl::string_view flag_value) {
  size_t eq = flag_value.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--external-label \"", flag_value, "\": expected NAME=VALUE"));
  }
  return Label(std::string(flag_value.substr(0, eq)), std::string(flag_value.substr(eq + 1)));
}

std::string SanitizeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(std::min(value.size(), kMaxLabelValueBytes));
  for (size_t i = 0; i < value.size();) {
    size_t n = Utf8SequenceLength(value, i);
    absl::string_view piece = n == 0 ? absl::string_view("?") : value.substr(i, n);
    if (out.size() + piece.size() > kMaxLabelValueBytes) break;
    out.append(piece.data(), piece.size());
    i += n == 0 ? 1 : n;
  }
  return out;
}

std::optional<std::string> EnvironValue(absl::string_view environ, absl::string_view name) {
  for (absl::string_view entry : absl::StrSplit(environ, '\0')) {
    if (entry.size() > name.size() && entry[name.size()] == '=' && absl::StartsWith(entry, name)) {
      return std::string(entry.substr(name.size() + 1));
    }
  }
  return std::nullopt;
}

CgroupInfo ParseCgroup(absl::string_view cgroup_text) {
  absl::string_view v2, systemd, first;
  for (absl::string_view line : absl::StrSplit(cgroup_text, '\n')) {
    // hierarchy-ID:controller-list:cgroup-path; the path may itself contain ':'.
    std::vector<absl::string_view> parts = absl::StrSplit(line, absl::MaxSplits(':', 2));
    if (parts.size() != 3) continue;
    absl::string_view path = parts[2];
    if (path.empty() || path == "/") continue;
    if (parts[0] == "0" && parts[1].empty()) {
      v2 = path;
    } else if (parts[1] == "name=systemd") {
      systemd = path;
    } else if (first.empty()) {
      first = path;
    }
  }
  CgroupInfo info;
  info.path = std::string(!v2.empty() ? v2 : !systemd.empty() ? systemd : first);

  std::vector<absl::string_view> components = absl::StrSplit(info.path, '/', absl::SkipEmpty());
  // Deepest first: a unit below the container (systemd inside it) names the service; one above
  // it runs the container engine and does not.
  bool unit_done = false;
  for (auto it = components.rbegin(); it != components.rend(); ++it) {
    absl::string_view c = *it;
    if (info.container_id.empty() && info.pod_uid.empty()) {
      std::string id = ContainerIdOfComponent(c);
      if (!id.empty()) {
        info.container_id = std::move(id);
        unit_done = true;
        continue;
      }
    }
    if (info.pod_uid.empty()) {
      std::string uid = PodUidOfComponent(c);
      if (!uid.empty()) {
        info.pod_uid = std::move(uid);
        unit_done = true;
        continue;
      }
    }
    if (!unit_done && absl::ConsumeSuffix(&c, ".service") && !c.empty() &&
        !absl::StartsWith(c, "user@")) {
      info.systemd_unit = std::string(c);
      unit_done = true;
    }
  }
  return info;
}

const char* ServiceNameSourceName(ServiceNameSource source) {
  switch (source) {
    case ServiceNameSource::kFlag:
      return "--service-name";
    case ServiceNameSource::kOtelEnv:
      return "OTEL_SERVICE_NAME";
    case ServiceNameSource::kPyroscopeEnv:
      return "PYROSCOPE_SERVICE_NAME";
    case ServiceNameSource::kPodAnnotation:
      return "pod annotation parascope.io/service-name";
    case ServiceNameSource::kKubernetes:
      return "kubernetes";
    case ServiceNameSource::kSystemdUnit:
      return "systemd unit";
    case ServiceNameSource::kExecutable:
      return "executable";
    case ServiceNameSource::kProcessName:
      return "process name";
  }
  return "?";
}

// ---- SeriesLabeler ----

SeriesLabeler::SeriesLabeler(LabelOptions options) : options_(std::move(options)) {
  hostname_ = options_.hostname;
  if (hostname_.empty()) {
    char buf[HOST_NAME_MAX + 1] = {};
    if (gethostname(buf, sizeof(buf) - 1) == 0) hostname_ = buf;
  }
  hostname_ = SanitizeLabelValue(hostname_);
}

absl::Status SeriesLabeler::CheckIdentity(const proc::ProcessKey& key) const {
  std::string path = absl::StrCat(options_.proc_root, "/", key.tgid, "/stat");
  PS_ASSIGN_OR_RETURN(std::string text, proc::ReadFileToString(path));
  PS_ASSIGN_OR_RETURN(proc::ProcStat stat, proc::ParseStat(text));
  uint64_t want = proc::BootNsToTicks(key.start_boot_ns);
  uint64_t have = stat.start_time_ticks;
  if ((want > have ? want - have : have - want) > 1) {
    return absl::NotFoundError(
        absl::StrCat(path, ": start time ", have, " ticks, expected ", want, " (pid reused)"));
  }
  return absl::OkStatus();
}

SeriesLabeler::Entry SeriesLabeler::Resolve(const proc::ProcessKey& process,
                                            const std::string& process_name) const {
  Entry e;
  auto found = [&e](absl::string_view value, ServiceNameSource source) {
    e.service_name = SanitizeLabelValue(value);
    e.source = source;
    return e;
  };
  bool use_flag = options_.pid_filter_run && !options_.service_name.empty();
  if (use_flag && !options_.kubernetes) {
    return found(options_.service_name, ServiceNameSource::kFlag);
  }

  // Read everything, then re-check identity so all of it is known to belong to `process`.
  bool same_process = CheckIdentity(process).ok();
  std::string dir = absl::StrCat(options_.proc_root, "/", process.tgid);
  absl::StatusOr<std::string> environ, cgroup, exe;
  if (same_process) {
    environ = proc::ReadFileToString(dir + "/environ");
    cgroup = proc::ReadFileToString(dir + "/cgroup");
    exe = proc::ReadLink(dir + "/exe");
    same_process = CheckIdentity(process).ok();
  }
  if (options_.kubernetes) {
    // An exited process's cgroup may still be known to the lookup (read at exec).
    e.kubernetes = options_.kubernetes(process, same_process && cgroup.ok() ? *cgroup : "");
  }
  if (use_flag) return found(options_.service_name, ServiceNameSource::kFlag);
  if (e.kubernetes.has_value() && !e.kubernetes->service_name.empty()) {
    return found(e.kubernetes->service_name, ServiceNameSource::kPodAnnotation);
  }
  auto kubernetes_name = [&e]() -> std::optional<std::string> {
    if (!e.kubernetes.has_value() || e.kubernetes->namespace_name.empty() ||
        e.kubernetes->container.empty()) {
      return std::nullopt;
    }
    return absl::StrCat(e.kubernetes->namespace_name, "/", e.kubernetes->container);
  };
  // The process is gone (or its pid reused): its container (known from the cgroup read at exec)
  // or the name the profile was built with is left.
  if (!same_process) {
    if (auto k = kubernetes_name()) return found(*k, ServiceNameSource::kKubernetes);
    return found(process_name.empty() ? "unknown" : process_name, ServiceNameSource::kProcessName);
  }

  if (environ.ok()) {
    for (auto [var, source] :
         {std::pair("OTEL_SERVICE_NAME", ServiceNameSource::kOtelEnv),
          std::pair("PYROSCOPE_SERVICE_NAME", ServiceNameSource::kPyroscopeEnv)}) {
      std::optional<std::string> value = EnvironValue(*environ, var);
      if (value.has_value() && !value->empty()) return found(*value, source);
    }
  }
  if (auto k = kubernetes_name()) return found(*k, ServiceNameSource::kKubernetes);
  if (cgroup.ok()) {
    // The container name would come here (SPEC section 4); it is not cheaply known from /proc, so
    // containers fall through to the executable (ParseCgroup gives no unit for them).
    CgroupInfo info = ParseCgroup(*cgroup);
    if (!info.systemd_unit.empty()) {
      return found(info.systemd_unit, ServiceNameSource::kSystemdUnit);
    }
  }
  if (exe.ok()) {
    std::string base = BaseName(*exe);
    if (!base.empty()) return found(base, ServiceNameSource::kExecutable);
  }
  return found(process_name.empty() ? "unknown" : process_name, ServiceNameSource::kProcessName);
}

const SeriesLabeler::Entry& SeriesLabeler::Lookup(const proc::ProcessKey& process,
                                                  const std::string& process_name) {
  auto it = cache_.find(process);
  if (it != cache_.end()) {
    Entry& cached = it->second;
    // A pod or container the API server had not described: asked again (at most once a window)
    // once the pods changed.
    if (cached.kubernetes.has_value() && !cached.kubernetes->complete &&
        cached.last_used_window != window_ && options_.kubernetes_generation &&
        options_.kubernetes_generation() != cached.kubernetes->generation) {
      cached = Resolve(process, process_name);
    }
    cached.last_used_window = window_;
    return cached;
  }
  Entry e = Resolve(process, process_name);
  e.last_used_window = window_;
  if (cache_.size() >= options_.max_cached_processes) {
    uncached_ = std::move(e);
    return uncached_;
  }
  return cache_.emplace(process, std::move(e)).first->second;
}

std::pair<std::string, ServiceNameSource> SeriesLabeler::ServiceName(
    const proc::ProcessKey& process, const std::string& process_name) {
  absl::MutexLock lock(&mu_);
  const Entry& e = Lookup(process, process_name);
  return {e.service_name, e.source};
}

absl::StatusOr<LabelList> SeriesLabeler::Labels(const proc::ProcessKey& process,
                                                const std::string& process_name,
                                                const std::string& profile_type) {
  if (profile_type.empty()) return absl::InvalidArgumentError("empty profile type (__name__)");
  LabelList labels;
  labels.reserve(kBaseLabels + kKubernetesLabels + options_.external.size() + 1);
  labels.emplace_back("__name__", profile_type);
  {
    absl::MutexLock lock(&mu_);
    const Entry& e = Lookup(process, process_name);
    labels.emplace_back("service_name", e.service_name);
    labels.emplace_back("hostname", hostname_);
    if (e.kubernetes.has_value()) {
      const KubernetesInfo& k = *e.kubernetes;
      for (auto [name, value] :
           {std::pair("namespace", &k.namespace_name), std::pair("pod", &k.pod),
            std::pair("container", &k.container), std::pair("container_id", &k.container_id),
            std::pair("node", &k.node)}) {
        if (!value->empty()) labels.emplace_back(name, SanitizeLabelValue(*value));
      }
    }
  }
  for (const Label& l : options_.external) labels.push_back(l);
  if (options_.pid_label) labels.emplace_back("pid", absl::StrCat(process.tgid));
  if (labels.size() > kMaxSeriesLabels) {
    return absl::InvalidArgumentError(absl::StrCat(labels.size(), " series labels, at most ",
                                                   kMaxSeriesLabels, " (SPEC section 4)"));
  }
  return labels;
}

void SeriesLabeler::EndWindow() {
  absl::MutexLock lock(&mu_);
  for (auto it = cache_.begin(); it != cache_.end();) {
    if (it->second.last_used_window != window_) {
      cache_.erase(it++);
    } else {
      ++it;
    }
  }
  ++window_;
}

size_t SeriesLabeler::cached_processes() const {
  absl::MutexLock lock(&mu_);
  return cache_.size();
}

}  // namespace parascope
