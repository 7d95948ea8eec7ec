#include "test/receiver/receiver_client.h"

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
  std::vector<std::string> argv = {"/bin/sh", "-c", "f=$1; shift; exec \"$@\" 2>>\"$f\"", "sh",
                                   dir_.path() + "/receiver.stderr", PS_RECEIVER_BIN,
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
}

TestReceiver::~TestReceiver() = default;

std::string TestReceiver::GrpcUrl(bool tls) const {
  return absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", grpc_port_);
}

std::string TestReceiver::HttpUrl(bool tls) const {
  return absl::StrCat(tls ? "https" : "http", "://127.0.0.1:", http_port_);
}

bool TestReceiver::ReadEvent(int timeout_s) {
  std::string line;
  if (!child_->ReadStdoutLine(&line, timeout_s)) return false;
  if (absl::StartsWith(line, "push ")) {
    events_.push_back(KeyValues(line));
  } else if (absl::StartsWith(line, "ok") || absl::StartsWith(line, "error")) {
    pending_reply_ = line;
  }
  return true;
}

void TestReceiver::Command(const std::string& command) {
  pending_reply_.clear();
  child_->WriteStdin(command + "\n");
  while (pending_reply_.empty()) {
    bool got = ReadEvent(30);
    INFO("command " << command << "; receiver stderr: " << Stderr());
    REQUIRE(got);
  }
  INFO("command " << command);
  REQUIRE(absl::StartsWith(pending_reply_, "ok"));
}

bool TestReceiver::WaitFor(const std::function<bool(const std::vector<Event>&)>& done,
                           int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (!done(events_)) {
    auto left = std::chrono::duration_cast<std::chrono::seconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0 || !ReadEvent(static_cast<int>(left))) return done(events_);
  }
  return true;
}

size_t TestReceiver::CountOk() const {
  size_t n = 0;
  for (const auto& e : events_) n += e.count("result") && e.at("result") == "ok";
  return n;
}

bool TestReceiver::WaitForOk(size_t n, int timeout_s) {
  return WaitFor([&](const std::vector<Event>&) { return CountOk() >= n; }, timeout_s);
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
      "set -e; cd ", d, "\n",
      "openssl req -x509 ", key, " -keyout ca.key -out ca.pem -days 2 -subj /CN=parascope-test-ca\n",
      "openssl req -x509 ", key, " -keyout other_ca.key -out other_ca.pem -days 2 "
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
