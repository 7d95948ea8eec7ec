// Test-side handle on ps_test_receiver: starts it as a child process, sends control commands on
// its stdin (waiting for the acknowledgement), waits for `push` events on its stdout, and reads
// its JSON record. Everything is event-synchronized: no sleeps.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "test/e2e/e2e_util.h"
#include "test/receiver/record.pb.h"

namespace parascope::testing {

class TestReceiver {
 public:
  // Starts PS_RECEIVER_BIN with --record and --profile-dir in a fresh directory plus `args`
  // (e.g. {"--tls-cert=...", "--tls-key=..."}), and waits for its `listening` line. REQUIREs
  // success.
  explicit TestReceiver(const std::vector<std::string>& args = {});
  ~TestReceiver();

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }
  // Base URLs for --remote-url: "<scheme>://127.0.0.1:<port>".
  std::string GrpcUrl(bool tls = false) const;
  std::string HttpUrl(bool tls = false) const;

  // Sends one control command ("fail count=2 status=429 grpc=RESOURCE_EXHAUSTED", "refuse",
  // "accept", "delay ms=500 count=1", "reset") and waits for its reply; REQUIREs "ok".
  void Command(const std::string& command);

  // `push` events so far (key=value maps of the receiver's stdout lines: seq, protocol,
  // result, name, service_name, samples, id, violations). A background thread reads them as
  // they come, so the receiver never blocks on a full pipe.
  using Event = std::map<std::string, std::string>;
  std::vector<Event> events() const;
  // Waits until `done(events)` holds; false after timeout_s without it.
  bool WaitFor(const std::function<bool(const std::vector<Event>&)>& done, int timeout_s = 60);
  // Waits until at least `n` requests were answered "ok".
  bool WaitForOk(size_t n, int timeout_s = 60);
  size_t CountOk() const;

  // Every request recorded so far (the --record file), in arrival order.
  std::vector<receiver::PushRecord> Records() const;
  // Records with result "ok" only.
  std::vector<receiver::PushRecord> OkRecords() const;

  const std::string& dir() const { return dir_.path(); }
  // The receiver's stderr so far (for INFO on failure).
  std::string Stderr() const;

 private:
  void ReadLoop();  // the reader thread: stdout lines into events_ / replies_

  TempDir dir_;
  std::unique_ptr<Child> child_;
  int grpc_port_ = 0, http_port_ = 0, control_port_ = 0;
  std::thread reader_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Event> events_;        // guarded by mu_
  std::deque<std::string> replies_;  // command replies not yet taken, guarded by mu_
  bool eof_ = false;                 // guarded by mu_
};

// A CA and certificates made with the openssl command line in `dir`: ca.pem/ca.key, server.pem/
// server.key (CN localhost, SAN DNS:localhost and IP:127.0.0.1, signed by the CA), client.pem/
// client.key (signed by the CA), and other_ca.pem (an unrelated CA). REQUIREs success.
struct TestCerts {
  explicit TestCerts(const std::string& dir);
  std::string ca, server_cert, server_key, client_cert, client_key, other_ca;
};

}  // namespace parascope::testing
