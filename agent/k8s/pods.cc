#include "agent/k8s/pods.h"

#include <algorithm>

#include <nlohmann/json.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace parascope::k8s {
namespace {

using nlohmann::json;

// The string at obj[key], or "" when absent or not a string.
std::string Str(const json& obj, const char* key) {
  if (!obj.is_object()) return "";
  auto it = obj.find(key);
  return it != obj.end() && it->is_string() ? it->get<std::string>() : "";
}

const json& Member(const json& obj, const char* key) {
  static const json kNull;
  if (!obj.is_object()) return kNull;
  auto it = obj.find(key);
  return it != obj.end() ? *it : kNull;
}

std::map<std::string, std::string> StringMap(const json& obj) {
  std::map<std::string, std::string> out;
  if (!obj.is_object()) return out;
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (it->is_string()) out[it.key()] = it->get<std::string>();
  }
  return out;
}

absl::StatusOr<PodInfo> PodFromJson(const json& pod) {
  if (!pod.is_object()) return absl::InvalidArgumentError("pod: not a JSON object");
  const json& meta = Member(pod, "metadata");
  PodInfo p;
  p.uid = Str(meta, "uid");
  p.name = Str(meta, "name");
  p.namespace_name = Str(meta, "namespace");
  if (p.uid.empty() || p.name.empty() || p.namespace_name.empty()) {
    return absl::InvalidArgumentError(
        "pod: metadata.uid, metadata.name and metadata.namespace are required");
  }
  p.resource_version = Str(meta, "resourceVersion");
  p.labels = StringMap(Member(meta, "labels"));
  std::map<std::string, std::string> annotations = StringMap(Member(meta, "annotations"));
  if (auto it = annotations.find(std::string(kServiceNameAnnotation)); it != annotations.end()) {
    p.service_name = it->second;
  }
  if (auto it = annotations.find(std::string(kConfigHashAnnotation)); it != annotations.end()) {
    p.config_hash = absl::AsciiStrToLower(it->second);
  }
  p.node = Str(Member(pod, "spec"), "nodeName");
  const json& status = Member(pod, "status");
  for (const char* list : {"containerStatuses", "initContainerStatuses",
                           "ephemeralContainerStatuses"}) {
    const json& items = Member(status, list);
    if (!items.is_array()) continue;
    for (const json& c : items) {
      PodContainer pc;
      pc.name = Str(c, "name");
      pc.id = ContainerIdFromStatus(Str(c, "containerID"));
      if (!pc.id.empty() && !pc.name.empty()) p.containers.push_back(std::move(pc));
    }
  }
  return p;
}

absl::StatusOr<json> ParseJson(absl::string_view text, const char* what) {
  json j = json::parse(text.begin(), text.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return absl::InvalidArgumentError(absl::StrCat(what, ": not JSON"));
  return j;
}

// A label key or value as Kubernetes allows them (validation.IsQualifiedName / IsValidLabelValue,
// loosely: the characters, not the lengths).
bool IsLabelToken(absl::string_view s, bool key) {
  if (s.empty()) return !key;
  for (char c : s) {
    if (!(absl::ascii_isalnum(c) || c == '-' || c == '_' || c == '.' || (key && c == '/'))) {
      return false;
    }
  }
  return true;
}

// Normalizes a pod UID for lookups: lower case, '_' (systemd slice names) as '-'.
std::string NormalUid(absl::string_view uid) {
  return absl::StrReplaceAll(absl::AsciiStrToLower(uid), {{"_", "-"}});
}

}  // namespace

absl::StatusOr<PodInfo> ParsePod(absl::string_view text) {
  auto j = ParseJson(text, "pod");
  if (!j.ok()) return j.status();
  return PodFromJson(*j);
}

absl::StatusOr<PodList> ParsePodList(absl::string_view text) {
  auto j = ParseJson(text, "pod list");
  if (!j.ok()) return j.status();
  const json& items = Member(*j, "items");
  // The API server writes "items": null for an empty list in some versions.
  if (!items.is_array() && !items.is_null()) {
    return absl::InvalidArgumentError("pod list: no items array");
  }
  if (!j->is_object() || !Member(*j, "metadata").is_object()) {
    return absl::InvalidArgumentError("pod list: no metadata");
  }
  PodList list;
  list.resource_version = Str(Member(*j, "metadata"), "resourceVersion");
  list.continue_token = Str(Member(*j, "metadata"), "continue");
  if (items.is_array()) {
    for (const json& item : items) {
      auto pod = PodFromJson(item);
      if (pod.ok()) {
        list.pods.push_back(*std::move(pod));
      } else {
        ++list.bad_items;
      }
    }
  }
  return list;
}

absl::StatusOr<WatchEvent> ParseWatchEvent(absl::string_view line) {
  auto j = ParseJson(line, "watch event");
  if (!j.ok()) return j.status();
  std::string type = Str(*j, "type");
  const json& object = Member(*j, "object");
  WatchEvent e;
  e.resource_version = Str(Member(object, "metadata"), "resourceVersion");
  if (type == "ERROR") {
    e.type = WatchEvent::Type::kError;
    const json& code = Member(object, "code");
    e.error_code = code.is_number_integer() ? code.get<int>() : 0;
    e.error_message = absl::StrCat(Str(object, "reason"), ": ", Str(object, "message"));
    return e;
  }
  if (type == "BOOKMARK") {
    e.type = WatchEvent::Type::kBookmark;
    return e;
  }
  if (type == "ADDED") {
    e.type = WatchEvent::Type::kAdded;
  } else if (type == "MODIFIED") {
    e.type = WatchEvent::Type::kModified;
  } else if (type == "DELETED") {
    e.type = WatchEvent::Type::kDeleted;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("watch event: unknown type \"", type, "\""));
  }
  auto pod = PodFromJson(object);
  if (!pod.ok()) return pod.status();
  e.pod = *std::move(pod);
  return e;
}

std::string ContainerIdFromStatus(absl::string_view container_id) {
  size_t scheme = container_id.find("://");
  if (scheme != absl::string_view::npos) container_id.remove_prefix(scheme + 3);
  return absl::AsciiStrToLower(container_id);
}

// ---- LabelSelector ----

absl::StatusOr<LabelSelector> LabelSelector::Parse(absl::string_view text) {
  LabelSelector s;
  // Split on commas outside parentheses.
  std::vector<std::string> parts;
  std::string cur;
  int depth = 0;
  for (char c : text) {
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (c == ',' && depth == 0) {
      parts.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  parts.push_back(cur);
  if (parts.size() == 1 && absl::StripAsciiWhitespace(parts[0]).empty()) return s;
  for (const std::string& raw : parts) {
    absl::string_view p = absl::StripAsciiWhitespace(raw);
    auto bad = [&](absl::string_view why) {
      return absl::InvalidArgumentError(absl::StrCat("\"", p, "\": ", why));
    };
    if (p.empty()) return bad("empty requirement");
    Requirement r;
    if (absl::ConsumePrefix(&p, "!")) {
      r.key = std::string(absl::StripAsciiWhitespace(p));
      r.op = Requirement::Op::kNotExists;
      if (!IsLabelToken(r.key, true)) return bad("not a label key");
      s.requirements_.push_back(std::move(r));
      continue;
    }
    size_t op_at = p.find_first_of("=!");
    if (op_at != absl::string_view::npos) {
      r.key = std::string(absl::StripAsciiWhitespace(p.substr(0, op_at)));
      absl::string_view rest = p.substr(op_at);
      if (absl::ConsumePrefix(&rest, "!=")) {
        r.op = Requirement::Op::kNotIn;
      } else if (absl::ConsumePrefix(&rest, "==") || absl::ConsumePrefix(&rest, "=")) {
        r.op = Requirement::Op::kIn;
      } else {
        return bad("expected =, == or !=");
      }
      std::string value(absl::StripAsciiWhitespace(rest));
      if (!IsLabelToken(r.key, true)) return bad("not a label key");
      if (!IsLabelToken(value, false)) return bad("not a label value");
      r.values.push_back(std::move(value));
      s.requirements_.push_back(std::move(r));
      continue;
    }
    // key, key in (...), key notin (...)
    size_t space = p.find_first_of(" \t");
    r.key = std::string(p.substr(0, space));
    if (!IsLabelToken(r.key, true)) return bad("not a label key");
    if (space == absl::string_view::npos) {
      r.op = Requirement::Op::kExists;
      s.requirements_.push_back(std::move(r));
      continue;
    }
    absl::string_view rest = absl::StripAsciiWhitespace(p.substr(space));
    if (absl::ConsumePrefix(&rest, "notin")) {
      r.op = Requirement::Op::kNotIn;
    } else if (absl::ConsumePrefix(&rest, "in")) {
      r.op = Requirement::Op::kIn;
    } else {
      return bad("expected in, notin, =, == or !=");
    }
    rest = absl::StripAsciiWhitespace(rest);
    if (!absl::ConsumePrefix(&rest, "(") || !absl::ConsumeSuffix(&rest, ")")) {
      return bad("expected a (value, ...) list");
    }
    for (absl::string_view v : absl::StrSplit(rest, ',')) {
      v = absl::StripAsciiWhitespace(v);
      if (!IsLabelToken(v, false)) return bad("not a label value");
      r.values.push_back(std::string(v));
    }
    if (r.values.empty() || (r.values.size() == 1 && r.values[0].empty() && rest.empty())) {
      return bad("empty value list");
    }
    s.requirements_.push_back(std::move(r));
  }
  return s;
}

bool LabelSelector::Matches(const std::map<std::string, std::string>& labels) const {
  for (const Requirement& r : requirements_) {
    auto it = labels.find(r.key);
    bool has = it != labels.end();
    bool in = has && std::find(r.values.begin(), r.values.end(), it->second) != r.values.end();
    switch (r.op) {
      case Requirement::Op::kExists:
        if (!has) return false;
        break;
      case Requirement::Op::kNotExists:
        if (has) return false;
        break;
      case Requirement::Op::kIn:
        if (!in) return false;
        break;
      case Requirement::Op::kNotIn:
        if (in) return false;
        break;
    }
  }
  return true;
}

// ---- PodStore ----

void PodStore::EraseLocked(const std::string& uid) {
  auto it = by_uid_.find(uid);
  if (it == by_uid_.end()) return;
  for (const PodContainer& c : it->second.containers) {
    auto ci = uid_of_container_.find(c.id);
    if (ci != uid_of_container_.end() && ci->second == uid) uid_of_container_.erase(ci);
  }
  if (!it->second.config_hash.empty()) {
    auto hi = uid_of_hash_.find(it->second.config_hash);
    if (hi != uid_of_hash_.end() && hi->second == uid) uid_of_hash_.erase(hi);
  }
  by_uid_.erase(it);
}

void PodStore::InsertLocked(PodInfo pod) {
  pod.uid = NormalUid(pod.uid);
  EraseLocked(pod.uid);
  if (by_uid_.size() >= max_pods_) {
    ++dropped_;
    return;
  }
  for (const PodContainer& c : pod.containers) uid_of_container_[c.id] = pod.uid;
  if (!pod.config_hash.empty()) uid_of_hash_[pod.config_hash] = pod.uid;
  std::string uid = pod.uid;
  by_uid_.emplace(std::move(uid), std::move(pod));
}

void PodStore::Replace(std::vector<PodInfo> pods) {
  absl::MutexLock lock(&mu_);
  by_uid_.clear();
  uid_of_container_.clear();
  uid_of_hash_.clear();
  for (PodInfo& p : pods) InsertLocked(std::move(p));
  ++generation_;
}

void PodStore::Upsert(PodInfo pod) {
  absl::MutexLock lock(&mu_);
  InsertLocked(std::move(pod));
  ++generation_;
}

void PodStore::Delete(const std::string& uid) {
  absl::MutexLock lock(&mu_);
  EraseLocked(NormalUid(uid));
  ++generation_;
}

std::optional<PodInfo> PodStore::Find(absl::string_view container_id, absl::string_view pod_uid,
                                      std::string* container) const {
  absl::MutexLock lock(&mu_);
  container->clear();
  if (!container_id.empty()) {
    auto ci = uid_of_container_.find(absl::AsciiStrToLower(container_id));
    if (ci != uid_of_container_.end()) {
      auto it = by_uid_.find(ci->second);
      if (it != by_uid_.end()) {
        for (const PodContainer& c : it->second.containers) {
          if (c.id == ci->first) *container = c.name;
        }
        return it->second;
      }
    }
  }
  if (!pod_uid.empty()) {
    std::string uid = NormalUid(pod_uid);
    auto it = by_uid_.find(uid);
    if (it != by_uid_.end()) return it->second;
    // A static pod: its cgroup carries the config hash (32 hex digits, no dashes).
    auto hi = uid_of_hash_.find(absl::StrReplaceAll(uid, {{"-", ""}}));
    if (hi != uid_of_hash_.end()) {
      auto pi = by_uid_.find(hi->second);
      if (pi != by_uid_.end()) return pi->second;
    }
  }
  return std::nullopt;
}

PodStoreStats PodStore::stats() const {
  absl::MutexLock lock(&mu_);
  return PodStoreStats{by_uid_.size(), dropped_};
}

uint64_t PodStore::generation() const {
  absl::MutexLock lock(&mu_);
  return generation_;
}

}  // namespace parascope::k8s
