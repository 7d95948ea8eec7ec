#include "test/k8s/fake_apiserver.h"

#include <httplib.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace parascope::testing {
namespace {

std::string ReadFixture() {
  std::ifstream in(std::string(PS_FIXTURE_DIR) + "/kubernetes/pod.json");
  if (!in) throw std::runtime_error("cannot read test/fixtures/kubernetes/pod.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void ReplaceAll(std::string* s, const std::string& from, const std::string& to) {
  for (size_t at = 0; (at = s->find(from, at)) != std::string::npos; at += to.size()) {
    s->replace(at, from.size(), to);
  }
}

std::string StatusJson(int code, const std::string& reason, const std::string& message) {
  nlohmann::json j = {{"kind", "Status"},   {"apiVersion", "v1"}, {"metadata", nlohmann::json::object()},
                      {"status", "Failure"}, {"message", message}, {"reason", reason},
                      {"code", code}};
  return j.dump();
}

}  // namespace

std::string FakePodJson(const FakePod& pod, uint64_t resource_version) {
  static const std::string kTemplate = ReadFixture();
  std::string s = kTemplate;
  ReplaceAll(&s, "${UID}", pod.uid);
  ReplaceAll(&s, "${NAME}", pod.name);
  ReplaceAll(&s, "${NAME_PREFIX}", pod.name + "-");
  ReplaceAll(&s, "${NAMESPACE}", pod.namespace_name);
  ReplaceAll(&s, "${NODE}", pod.node);
  ReplaceAll(&s, "${APP}", pod.app);
  ReplaceAll(&s, "${TIER}", pod.tier);
  ReplaceAll(&s, "${CONTAINER}", pod.container);
  ReplaceAll(&s, "${RUNTIME}", pod.runtime);
  ReplaceAll(&s, "${CONTAINER_ID}", pod.container_id);
  ReplaceAll(&s, "${PROXY_CONTAINER_ID}", std::string(64, 'e'));
  ReplaceAll(&s, "${SERVICE_ANNOTATION}", pod.service_annotation);
  ReplaceAll(&s, "${RESOURCE_VERSION}", std::to_string(resource_version));
  nlohmann::json j = nlohmann::json::parse(s);
  if (pod.service_annotation.empty()) j["metadata"]["annotations"].erase("parascope.io/service-name");
  if (pod.container_id.empty()) {
    // Pending: scheduled, no container created yet.
    j["status"] = {{"phase", "Pending"}, {"qosClass", "Burstable"}};
  }
  return j.dump();
}

FakeApiServer::FakeApiServer(std::string node, std::string token, std::string host)
    : node_(std::move(node)),
      token_(std::move(token)),
      host_(std::move(host)),
      server_(std::make_unique<httplib::Server>()) {
  server_->Get("/api/v1/pods", [this](const httplib::Request& req, httplib::Response& res) {
    auto refuse = [&](int status, const std::string& reason, const std::string& message) {
      res.status = status;
      res.set_content(StatusJson(status, reason, message), "application/json");
      std::lock_guard<std::mutex> l(mu_);
      refused_.push_back(std::to_string(status) + " " + req.target);
    };
    if (!token_.empty() && req.get_header_value("Authorization") != "Bearer " + token_) {
      return refuse(401, "Unauthorized", "Unauthorized");
    }
    if (req.get_param_value("fieldSelector") != "spec.nodeName=" + node_) {
      return refuse(400, "BadRequest", "expected fieldSelector=spec.nodeName=" + node_);
    }
    const bool watch = req.get_param_value("watch") == "1" || req.get_param_value("watch") == "true";
    int refuse_status = 0;
    {
      std::lock_guard<std::mutex> g(mu_);
      refuse_status = refuse_watches_;
    }
    if (watch && refuse_status != 0) {
      return refuse(refuse_status, "Forbidden", "pods is forbidden: watch");
    }
    std::unique_lock<std::mutex> l(mu_);
    if (!watch) {
      ++lists_;
      nlohmann::json list = {{"kind", "PodList"},
                             {"apiVersion", "v1"},
                             {"metadata", {{"resourceVersion", std::to_string(rv_)}}},
                             {"items", nlohmann::json::array()}};
      for (const auto& [uid, p] : pods_) {
        list["items"].push_back(nlohmann::json::parse(FakePodJson(p.first, p.second)));
      }
      res.set_content(list.dump(), "application/json");
      return;
    }
    ++watches_;
    uint64_t from = std::stoull("0" + req.get_param_value("resourceVersion"));
    int timeout_s = std::stoi("0" + req.get_param_value("timeoutSeconds"));
    if (timeout_s <= 0) timeout_s = 300;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
    const uint64_t expire_at_start = expire_generation_;
    l.unlock();
    res.set_chunked_content_provider(
        "application/json",
        [this, from, deadline, expire_at_start](size_t, httplib::DataSink& sink) mutable {
          std::unique_lock<std::mutex> lock(mu_);
          for (;;) {
            if (stopping_) return false;
            if (expire_generation_ != expire_at_start) {
              std::string line =
                  nlohmann::json{{"type", "ERROR"},
                                 {"object", nlohmann::json::parse(StatusJson(
                                                410, "Expired", "too old resource version"))}}
                      .dump() +
                  "\n";
              lock.unlock();
              sink.write(line.data(), line.size());
              sink.done();
              return true;
            }
            std::string out;
            for (const Event& e : events_) {
              if (e.rv > from) {
                out += e.line;
                from = e.rv;
              }
            }
            if (!out.empty()) {
              lock.unlock();
              return sink.write(out.data(), out.size());
            }
            if (std::chrono::steady_clock::now() >= deadline) {
              lock.unlock();
              sink.done();
              return true;
            }
            cv_.wait_until(lock, deadline);
          }
        });
  });
  port_ = server_->bind_to_any_port(host_);
  if (port_ <= 0) throw std::runtime_error("fake API server: cannot bind");
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  // stop() before the accept loop runs would be lost (httplib 0.11 has no wait_until_ready).
  while (!server_->is_running()) std::this_thread::yield();
}

FakeApiServer::~FakeApiServer() { Stop(); }

std::string FakeApiServer::url() const {
  const bool v6 = host_.find(':') != std::string::npos;
  return "http://" + (v6 ? "[" + host_ + "]" : host_) + ":" + std::to_string(port_);
}

void FakeApiServer::Apply(const FakePod& pod) {
  std::lock_guard<std::mutex> l(mu_);
  const bool added = pods_.count(pod.uid) == 0;
  const uint64_t rv = ++rv_;
  pods_[pod.uid] = {pod, rv};
  events_.push_back({rv, std::string("{\"type\":\"") + (added ? "ADDED" : "MODIFIED") +
                             "\",\"object\":" + FakePodJson(pod, rv) + "}\n"});
  cv_.notify_all();
}

void FakeApiServer::Remove(const std::string& uid) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = pods_.find(uid);
  if (it == pods_.end()) return;
  const uint64_t rv = ++rv_;
  events_.push_back(
      {rv, "{\"type\":\"DELETED\",\"object\":" + FakePodJson(it->second.first, rv) + "}\n"});
  pods_.erase(it);
  cv_.notify_all();
}

void FakeApiServer::RefuseWatches(int status) {
  std::lock_guard<std::mutex> l(mu_);
  refuse_watches_ = status;
}

void FakeApiServer::ExpireWatches() {
  std::lock_guard<std::mutex> l(mu_);
  ++expire_generation_;
  cv_.notify_all();
}

void FakeApiServer::Stop() {
  {
    std::lock_guard<std::mutex> l(mu_);
    if (stopping_ && !thread_.joinable()) return;
    stopping_ = true;
    cv_.notify_all();
  }
  server_->stop();
  if (thread_.joinable()) thread_.join();
}

int FakeApiServer::lists() const {
  std::lock_guard<std::mutex> l(mu_);
  return lists_;
}

int FakeApiServer::watches() const {
  std::lock_guard<std::mutex> l(mu_);
  return watches_;
}

std::vector<std::string> FakeApiServer::refused() const {
  std::lock_guard<std::mutex> l(mu_);
  return refused_;
}

}  // namespace parascope::testing
