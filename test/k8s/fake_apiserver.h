// A Kubernetes API server for tests: serves GET /api/v1/pods as a PodList and, with watch=1, as
// a stream of watch events, in the shapes of the Kubernetes API reference (core/v1 Pod, PodList,
// WatchEvent, Status), from pods built on test/fixtures/kubernetes/pod.json. In process, on
// 127.0.0.1 with an ephemeral port; Stop() "kills" it (listener and connections closed).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace httplib {
class Server;
}

namespace parascope::testing {

// The placeholders of test/fixtures/kubernetes/pod.json.
struct FakePod {
  std::string uid;
  std::string name;
  std::string namespace_name;
  std::string node;
  std::string app;             // label app
  std::string tier = "api";    // label tier
  std::string container;       // the first container's name
  std::string container_id;    // its id (64 hex digits); "" = not created yet (Pending)
  std::string runtime = "containerd";
  std::string service_annotation;  // parascope.io/service-name, "" = absent
};
// The pod as JSON (one line), with `resource_version`.
std::string FakePodJson(const FakePod& pod, uint64_t resource_version);

class FakeApiServer {
 public:
  // Only requests with fieldSelector=spec.nodeName=<node> and, when token is not "",
  // "Authorization: Bearer <token>" are served (else 400 / 401 with a Status).
  // `host`: the address to listen on ("::1" for an IPv6 test).
  explicit FakeApiServer(std::string node, std::string token = "", std::string host = "127.0.0.1");
  ~FakeApiServer();  // Stop()

  std::string url() const;  // "http://127.0.0.1:<port>", "http://[::1]:<port>"

  // Adds or replaces a pod (by uid) and records ADDED or MODIFIED for watchers.
  void Apply(const FakePod& pod);
  // Removes a pod and records DELETED.
  void Remove(const std::string& uid);
  // Answers every later watch request with `status` (e.g. 403: RBAC without "watch"); 0 = serve.
  void RefuseWatches(int status);
  // Ends every open watch with an ERROR 410 Expired event (the client must list again).
  void ExpireWatches();
  // Closes the listener and every connection; later requests are refused. Idempotent.
  void Stop();

  int lists() const;    // list requests answered 200
  int watches() const;  // watch requests accepted
  // Requests refused (bad selector, bad token), as "<status> <path>".
  std::vector<std::string> refused() const;

 private:
  struct Event {
    uint64_t rv;
    std::string line;  // {"type":...,"object":...}\n
  };
  std::string node_, token_, host_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  int port_ = 0;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t rv_ = 1000;
  uint64_t expire_generation_ = 0;
  std::map<std::string, std::pair<FakePod, uint64_t>> pods_;  // uid -> pod, its rv
  std::vector<Event> events_;
  int lists_ = 0, watches_ = 0;
  int refuse_watches_ = 0;
  std::vector<std::string> refused_;
};

}  // namespace parascope::testing
