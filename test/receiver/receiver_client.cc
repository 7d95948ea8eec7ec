#include "test/receiver/receiver_client.h"

#include <signal.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/util/json_util.h"

namespace parascope::testing {

TestReceiver::TestReceiver(const std::vector<std::string>& args) {
  // stderr goes to a file: a pipe nobody reads could fill up and stall the receiver.
  std::vector<std::string> argv = {"/bin/sh",
                                   "-c",
                                   "f=$1; shift; exec \"$@\" 2>>\"$f\"",
                                   "sh",
                                   dir_.path() + "/receiver.stderr",
                                   PS_RECEIVER_BIN,
                                   "--record=" + dir_.path() + "/record.jsonl",
                                   "--profile-dir=" + dir_.path() + "/profiles"};
  argv.insert(argv.end(), args.begin(), args.end());
  child_ = std::make_unique<Child>(argv);
  std::string line;
  bool started = child_->ReadStdoutLine(&line, 30);
  INFO("receiver stderr: " << Stderr());
  REQUIRE(started);
  REQUIRE(absl::StartsWith(line, "listening "));
  auto kv = KeyValues(line);
  REQUIRE(absl::SimpleAtoi(kv["grpc"], &grpc_port_));
  REQUIRE(absl::SimpleAtoi(kv["http"], &http_port_));
  REQUIRE(absl::SimpleAtoi(kv["control"], &control_port_));
  reader_ = std::thread([this] { ReadLoop(); });
}

TestReceiver::~TestReceiver() {
  // Killing the receiver ends its stdout, which ends the reader thread.
  if (child_ != nullptr) kill(child_->pid(), SIGKILL);
  if (reader_.joinable()) reader_.join();
}

void TestReceiver::ReadLoop() {
  std::string line;
  // Only this thread reads the child's stdout; the test thread only writes its stdin.
  while (child_->ReadStdoutLine(&line, 3600)) {
    std::lock_guard<std::mutex> l(mu_);
    if (absl::StartsWith(line, "push ")) {
      events_.push_back(KeyValues(line));
    } else if (absl::StartsWith(line, "ok") || absl::StartsWith(line, "error")) {
      replies_.push_back(line);
    }
    cv_.notify_all();
  }
  std::lock_guard<std::mutex> l(mu_);
  eof_ = true;
  cv_.notify_all();
}

std::string TestReceiver::GrpcUrl(bool tls) const {
  return absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", grpc_port_);
}

std::string TestReceiver::HttpUrl(bool tls) const {
  return absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", http_port_);
}

void TestReceiver::Command(const std::string& command) {
  child_->WriteStdin(command + "\n");
  std::unique_lock<std::mutex> l(mu_);
  bool got = cv_.wait_for(l, std::chrono::seconds(30), [&] { return !replies_.empty() || eof_; });
  INFO("command " << command << "; receiver stderr: " << Stderr());
  REQUIRE(got);
  REQUIRE(!replies_.empty());
  std::string reply = replies_.front();
  replies_.pop_front();
  INFO("reply " << reply);
  REQUIRE(absl::StartsWith(reply, "ok"));
}

std::vector<TestReceiver::Event> TestReceiver::events() const {
  std::lock_guard<std::mutex> l(mu_);
  return events_;
}

bool TestReceiver::WaitFor(const std::function<bool(const std::vector<Event>&)>& done,
                           int timeout_s) {
  std::unique_lock<std::mutex> l(mu_);
  return cv_.wait_for(l, std::chrono::seconds(timeout_s), [&] { return done(events_) || eof_; }) &&
         done(events_);
}

namespace {
size_t CountOkIn(const std::vector<TestReceiver::Event>& events) {
  size_t n = 0;
  for (const auto& e : events) n += e.count("result") && e.at("result") == "ok";
  return n;
}
}  // namespace

size_t TestReceiver::CountOk() const {
  std::lock_guard<std::mutex> l(mu_);
  return CountOkIn(events_);
}

bool TestReceiver::WaitForOk(size_t n, int timeout_s) {
  return WaitFor([&](const std::vector<Event>& e) { return CountOkIn(e) >= n; }, timeout_s);
}

std::vector<receiver::PushRecord> TestReceiver::Records() const {
  std::vector<receiver::PushRecord> out;
  std::ifstream f(dir_.path() + "/record.jsonl");
  std::string line;
  google::protobuf::util::JsonParseOptions opts;
  opts.ignore_unknown_fields = true;
  while (std::getline(f, line)) {
    receiver::PushRecord r;
    auto st = google::protobuf::util::JsonStringToMessage(line, &r, opts);
    INFO(line);
    REQUIRE(st.ok());
    out.push_back(std::move(r));
  }
  return out;
}

std::vector<receiver::PushRecord> TestReceiver::OkRecords() const {
  std::vector<receiver::PushRecord> out;
  for (auto& r : Records()) {
    if (r.result() == "ok") out.push_back(std::move(r));
  }
  return out;
}

std::string TestReceiver::Stderr() const {
  std::ifstream f(dir_.path() + "/receiver.stderr");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

TestCerts::TestCerts(const std::string& dir) {
  ca = dir + "/ca.pem";
  server_cert = dir + "/server.pem";
  server_key = dir + "/server.key";
  client_cert = dir + "/client.pem";
  client_key = dir + "/client.key";
  other_ca = dir + "/other_ca.pem";
  std::string d = "'" + dir + "'";
  std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
  std::string script = absl::StrCat(
      "set -e; cd ", d, "\n", "openssl req -x509 ", key,
      " -keyout ca.key -out ca.pem -days 2 -subj /CN=parascope-test-ca\n", "openssl req -x509 ",
      key,
      " -keyout other_ca.key -out other_ca.pem -days 2 "
      "-subj /CN=parascope-other-ca\n",
      "openssl req ", key, " -keyout server.key -out server.csr -subj /CN=localhost\n",
      "printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\\nextendedKeyUsage=serverAuth\\n' "
      "> server.ext\n",
      "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem "
      "-days 2 -extfile server.ext\n",
      "openssl req ", key, " -keyout client.key -out client.csr -subj /CN=parascope-client\n",
      "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n",
      "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem "
      "-days 2 -extfile client.ext\n");
  {
    std::ofstream f(dir + "/make_certs.sh");
    f << script;
  }
  std::string out, err;
  int rc = RunCommand("sh " + d.substr(0, d.size() - 1) + "/make_certs.sh'", &out, &err);
  INFO("openssl: " << err);
  REQUIRE(rc == 0);
}

}  // namespace parascope::testing
