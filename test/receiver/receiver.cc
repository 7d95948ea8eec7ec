// ps_test_receiver: a stand-in for a Pyroscope server's push endpoint, for tests and for users
// debugging a setup (see README.md next to this file).
//
// Serves push.v1.PusherService/Push as gRPC (grpc++, --grpc-address) and as Connect unary over
// HTTP/1.1 (cpp-httplib, --http-address), optionally with TLS, records every request as a JSON
// line (test/receiver/record.proto), writes each raw profile to --profile-dir, and injects
// failures on command: from stdin lines or HTTP `POST /control` on --control-address (which stays
// up while the push ports refuse connections) and on the HTTP push port.
//
// stdout is the event channel: `listening grpc=<port> http=<port> control=<port>` once every
// port accepts connections, then one `push seq=...` line per request and one `ok ...` / `error
// ...` line per stdin command, each printed before the corresponding response is sent.
#include <grpcpp/grpcpp.h>
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "agent/export/push_protocol.h"
#include "agent/profile/pprof_builder.h"
#include "google/protobuf/util/json_util.h"
#include "proto/push.grpc.pb.h"
#include "test/receiver/record.pb.h"

ABSL_FLAG(std::string, grpc_address, "127.0.0.1:0", "gRPC listen address (port 0: any; \"\": off)");
ABSL_FLAG(std::string, http_address, "127.0.0.1:0",
          "Connect (HTTP/1.1) listen address (port 0: any; \"\": off)");
ABSL_FLAG(std::string, control_address, "127.0.0.1:0",
          "plain-HTTP control endpoint (POST /control), never refused (\"\": off)");
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate: serve TLS on the push ports");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_client_ca, "", "require client certificates signed by this CA");
ABSL_FLAG(std::string, record, "", "append one JSON line per request to this file");
ABSL_FLAG(std::string, profile_dir, "", "write each raw profile (gzip pprof) into this directory");
ABSL_FLAG(bool, strict, false,
          "reject requests a Pyroscope server would reject (violations) with 400/INVALID_ARGUMENT");
ABSL_FLAG(bool, quiet, false, "no `push ...` lines on stdout");

namespace parascope::receiver {
namespace {

using push::v1::PushRequest;

// Label names of SPEC section 4.
const std::regex& LabelNameRe() {
  static const std::regex re("[a-zA-Z_][a-zA-Z0-9_]*");
  return re;
}

absl::Mutex g_stdout_mu;
void Emit(const std::string& line) {
  absl::MutexLock l(&g_stdout_mu);
  std::cout << line << std::endl;  // flushes
}

// The gRPC code an injected HTTP status stands for (inverse of Connect's mapping).
int GrpcCodeForHttp(int status) {
  switch (status) {
    case 400:
      return 3;
    case 401:
      return 16;
    case 403:
      return 7;
    case 404:
      return 5;
    case 408:
      return 4;
    case 409:
      return 10;
    case 429:
      return 8;
    case 499:
      return 1;
    case 501:
      return 12;
    case 502:
    case 503:
      return 14;
    case 504:
      return 4;
    default:
      return status >= 500 ? 13 : 2;
  }
}

std::string SanitizeForLine(absl::string_view v) {
  std::string out(v);
  for (char& c : out) {
    if (c == ' ' || !absl::ascii_isprint(static_cast<unsigned char>(c))) c = '_';
  }
  return out.empty() ? "-" : out;
}

// What to answer.
struct Answer {
  bool ok = true;
  int http_status = 200;
  int grpc_code = 0;
  std::string message;
};

class Receiver {
 public:
  Receiver(std::string record_path, std::string profile_dir, bool strict, bool quiet)
      : profile_dir_(std::move(profile_dir)), strict_(strict), quiet_(quiet) {
    if (!record_path.empty()) record_.open(record_path, std::ios::app);
  }

  bool record_ok() const { return !record_.fail(); }

  // One push request from either protocol; `request` is null when the body did not parse.
  Answer Handle(const std::string& protocol, const std::map<std::string, std::string>& headers,
                const PushRequest* request, const std::string& problem) {
    PushRecord rec;
    int delay_ms = 0;
    Answer answer;
    {
      absl::MutexLock l(&mu_);
      rec.set_seq(++seq_);
      ++requests_;
      if (fail_remaining_ > 0) {
        --fail_remaining_;
        answer.ok = false;
        answer.http_status = fail_http_;
        answer.grpc_code = fail_grpc_;
        answer.message = "injected failure";
        rec.set_injected(true);
      }
      if (delay_remaining_ != 0) {
        delay_ms = delay_ms_;
        if (delay_remaining_ > 0) --delay_remaining_;
      }
    }
    rec.set_protocol(protocol);
    rec.set_time_unix_nanos(absl::ToUnixNanos(absl::Now()));
    rec.set_delay_ms(delay_ms);
    for (const auto& [k, v] : headers) (*rec.mutable_headers())[k] = v;
    auto h = headers.find("content-type");
    if (protocol == "connect" && h != headers.end()) rec.set_content_type(h->second);
    h = headers.find("user-agent");
    if (h != headers.end()) rec.set_user_agent(h->second);

    if (!problem.empty()) rec.add_violations(problem);
    if (request != nullptr) Inspect(*request, &rec);
    if (answer.ok && request == nullptr) {
      answer = Answer{false, 400, 3, problem};
    } else if (answer.ok && strict_ && rec.violations_size() > 0) {
      answer = Answer{false, 400, 3, absl::StrJoin(rec.violations(), "; ")};
    }
    rec.set_result(answer.ok            ? "ok"
                   : protocol == "grpc" ? absl::StrCat("grpc ", GrpcCodeName(answer.grpc_code))
                                        : absl::StrCat("http ", answer.http_status));
    Log(rec);
    if (delay_ms > 0) {
      // Interrupted by `refuse`, so a stopping server does not wait for it.
      absl::MutexLock l(&mu_);
      struct Refused {
        const Receiver* r;
        uint64_t generation;
        bool Done() const ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return r->refuse_generation_ != generation;
        }
      } refused{this, refuse_generation_};
      mu_.AwaitWithTimeout(absl::Condition(&refused, &Refused::Done), absl::Milliseconds(delay_ms));
    }
    {
      absl::MutexLock l(&mu_);
      answer.ok ? ++ok_ : ++failed_;
    }
    return answer;
  }

  // A control command: "fail count=3 status=429 grpc=RESOURCE_EXHAUSTED", "delay ms=500
  // count=2", "refuse", "accept", "reset", "stats". Returns "ok ..." or "error ...".
  std::string Command(absl::string_view line, const std::function<std::string(bool)>& listen) {
    std::vector<std::string> words =
        absl::StrSplit(absl::StripAsciiWhitespace(line), ' ', absl::SkipEmpty());
    if (words.empty()) return "error empty command";
    std::map<std::string, std::string> kv;
    for (size_t i = 1; i < words.size(); ++i) {
      std::vector<std::string> p = absl::StrSplit(words[i], absl::MaxSplits('=', 1));
      if (p.size() != 2) return absl::StrCat("error bad argument \"", words[i], "\"");
      kv[p[0]] = p[1];
    }
    auto num = [&](const char* key, int dflt, int* out) {
      auto it = kv.find(key);
      if (it == kv.end()) {
        *out = dflt;
        return true;
      }
      return absl::SimpleAtoi(it->second, out);
    };
    const std::string& cmd = words[0];
    if (cmd == "fail") {
      int count, status = 0, code = -1;
      if (!num("count", 1, &count) || !num("status", 0, &status)) return "error bad number";
      if (auto it = kv.find("grpc"); it != kv.end()) {
        if (!absl::SimpleAtoi(it->second, &code)) code = GrpcCodeFromName(it->second);
        if (code <= 0 || code > 16) return "error bad grpc code";
      }
      if (status == 0 && code < 0) status = 503;
      if (status == 0) status = ConnectHttpStatus(code);
      if (code < 0) code = GrpcCodeForHttp(status);
      absl::MutexLock l(&mu_);
      fail_remaining_ = count;
      fail_http_ = status;
      fail_grpc_ = code;
      return absl::StrCat("ok fail count=", count, " status=", status,
                          " grpc=", GrpcCodeName(code));
    }
    if (cmd == "delay") {
      int ms, count;
      if (!num("ms", 0, &ms) || !num("count", -1, &count)) return "error bad number";
      absl::MutexLock l(&mu_);
      delay_ms_ = ms;
      delay_remaining_ = count;
      return absl::StrCat("ok delay ms=", ms, " count=", count);
    }
    if (cmd == "reset") {
      absl::MutexLock l(&mu_);
      fail_remaining_ = 0;
      delay_remaining_ = 0;
      return "ok reset";
    }
    if (cmd == "refuse" || cmd == "accept") {
      if (cmd == "refuse") {
        absl::MutexLock l(&mu_);
        ++refuse_generation_;
      }
      std::string err = listen(cmd == "accept");
      return err.empty() ? absl::StrCat("ok ", cmd) : absl::StrCat("error ", err);
    }
    if (cmd == "stats") {
      absl::MutexLock l(&mu_);
      return absl::StrCat("ok stats requests=", requests_, " ok=", ok_, " failed=", failed_,
                          " fail_pending=", fail_remaining_);
    }
    return absl::StrCat("error unknown command \"", cmd,
                        "\" (fail, delay, reset, refuse, accept, stats)");
  }

 private:
  // Fills the record's series and violations from what a Pyroscope server checks.
  void Inspect(const PushRequest& req, PushRecord* rec) {
    if (req.series_size() != 1) {
      rec->add_violations(absl::StrCat("series=", req.series_size(), " (one per request)"));
    }
    for (int si = 0; si < req.series_size(); ++si) {
      const auto& series = req.series(si);
      SeriesRecord* sr = rec->add_series();
      std::string name;
      for (const auto& l : series.labels()) {
        if (!std::regex_match(l.name(), LabelNameRe())) {
          rec->add_violations(absl::StrCat("bad label name \"", l.name(), "\""));
        }
        if (l.value().size() > 2048) {
          rec->add_violations(absl::StrCat("label ", l.name(), " value over 2048 bytes"));
        }
        if (l.value().empty()) rec->add_violations(absl::StrCat("empty label ", l.name()));
        if (!sr->mutable_labels()->insert({l.name(), l.value()}).second) {
          rec->add_violations(absl::StrCat("duplicate label ", l.name()));
        }
        if (l.name() == "__name__") name = l.value();
      }
      if (series.labels_size() > 30) {
        rec->add_violations(absl::StrCat(series.labels_size(), " labels (at most 30)"));
      }
      if (name.empty()) rec->add_violations("no __name__ label");
      if (!sr->labels().contains("service_name")) rec->add_violations("no service_name label");
      if (series.samples_size() != 1) {
        rec->add_violations(absl::StrCat("samples=", series.samples_size(), " (one per series)"));
      }
      for (int i = 0; i < series.samples_size(); ++i) {
        const auto& s = series.samples(i);
        SampleRecord* out = sr->add_samples();
        out->set_id(s.id());
        out->set_raw_bytes(s.raw_profile().size());
        if (!IsUuidV4(s.id())) rec->add_violations(absl::StrCat("ID \"", s.id(), "\" not a UUID"));
        if (!profile_dir_.empty()) {
          std::string file = absl::StrCat(profile_dir_, "/", rec->seq(), "-", si, "-", i, "-",
                                          SanitizeForLine(name), ".pb.gz");
          std::ofstream f(file, std::ios::binary);
          f.write(s.raw_profile().data(), s.raw_profile().size());
          if (f.good()) out->set_file(file);
        }
        if (!absl::StartsWith(s.raw_profile(), "\x1f\x8b")) {
          rec->add_violations("raw_profile is not gzip");
        }
        auto parsed = ParseMaybeGzip(s.raw_profile());
        if (!parsed.ok()) {
          rec->add_violations(absl::StrCat("profile: ", parsed.status().message()));
          continue;
        }
        Summarize(*parsed, out->mutable_profile(), rec);
      }
    }
  }

  static void Summarize(const perftools::profiles::Profile& p, ProfileSummary* s, PushRecord* rec) {
    auto str = [&](int64_t i) -> std::string {
      return i >= 0 && i < p.string_table_size() ? p.string_table(i) : "?";
    };
    if (p.string_table_size() == 0 || !p.string_table(0).empty()) {
      rec->add_violations("string_table[0] is not \"\"");
    }
    for (const auto& t : p.sample_type()) {
      s->add_sample_types(absl::StrCat(str(t.type()), "/", str(t.unit())));
      if (absl::StrContains(str(t.type()), "-")) {
        rec->add_violations(absl::StrCat("sample type \"", str(t.type()), "\" contains '-'"));
      }
      s->add_totals(0);
    }
    if (p.has_period_type()) {
      s->set_period_type(
          absl::StrCat(str(p.period_type().type()), "/", str(p.period_type().unit())));
    }
    s->set_period(p.period());
    s->set_samples(p.sample_size());
    s->set_time_nanos(p.time_nanos());
    s->set_duration_nanos(p.duration_nanos());
    s->set_uncompressed_bytes(p.ByteSizeLong());
    s->set_locations(p.location_size());
    s->set_functions(p.function_size());
    bool bad_values = false;
    for (const auto& smp : p.sample()) {
      if (smp.value_size() != p.sample_type_size()) bad_values = true;
      for (int v = 0; v < smp.value_size() && v < s->totals_size(); ++v) {
        s->set_totals(v, s->totals(v) + smp.value(v));
      }
      if (smp.label_size() > 100) rec->add_violations("a sample has more than 100 labels");
    }
    if (bad_values) rec->add_violations("a sample's value count differs from sample_type");
    if (p.sample_size() > 16000) {
      rec->add_violations(absl::StrCat(p.sample_size(), " samples (at most 16000)"));
    }
    if (p.ByteSizeLong() >= (2u << 20)) {
      rec->add_violations(
          absl::StrCat("uncompressed profile ", p.ByteSizeLong(), " bytes (under 2 MiB)"));
    }
    absl::Time t = absl::FromUnixNanos(p.time_nanos());
    if (absl::Now() - t > absl::Hours(1)) rec->add_violations("time_nanos older than an hour");
    if (t - absl::Now() > absl::Minutes(10)) rec->add_violations("time_nanos in the future");
  }

  void Log(const PushRecord& rec) {
    std::string json;
    google::protobuf::util::JsonPrintOptions opts;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(rec, &json, opts);
    {
      absl::MutexLock l(&file_mu_);
      if (record_.is_open()) {
        record_ << json << "\n";
        record_.flush();
      }
    }
    if (quiet_) return;
    std::string name = "-", service = "-", id = "-";
    uint64_t samples = 0;
    if (rec.series_size() > 0) {
      const auto& s = rec.series(0);
      if (auto it = s.labels().find("__name__"); it != s.labels().end()) name = it->second;
      if (auto it = s.labels().find("service_name"); it != s.labels().end()) service = it->second;
      if (s.samples_size() > 0) {
        id = s.samples(0).id();
        samples = s.samples(0).profile().samples();
      }
    }
    Emit(absl::StrCat("push seq=", rec.seq(), " protocol=", rec.protocol(),
                      " result=", absl::StrReplaceAll(rec.result(), {{" ", ":"}}),
                      " name=", SanitizeForLine(name), " service_name=", SanitizeForLine(service),
                      " samples=", samples, " id=", SanitizeForLine(id),
                      " violations=", rec.violations_size()));
  }

  const std::string profile_dir_;
  const bool strict_, quiet_;
  absl::Mutex file_mu_;
  std::ofstream record_ ABSL_GUARDED_BY(file_mu_);
  absl::Mutex mu_;
  uint64_t seq_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t requests_ ABSL_GUARDED_BY(mu_) = 0, ok_ ABSL_GUARDED_BY(mu_) = 0,
                     failed_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_remaining_ ABSL_GUARDED_BY(mu_) = 0;
  int fail_http_ ABSL_GUARDED_BY(mu_) = 503, fail_grpc_ ABSL_GUARDED_BY(mu_) = 14;
  int delay_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int delay_remaining_ ABSL_GUARDED_BY(mu_) = 0;  // -1: every request
  uint64_t refuse_generation_ ABSL_GUARDED_BY(mu_) = 0;
};

// gRPC: push.v1.PusherService.
class PusherService final : public push::v1::PusherService::Service {
 public:
  explicit PusherService(Receiver* r) : r_(r) {}
  grpc::Status Push(grpc::ServerContext* ctx, const push::v1::PushRequest* req,
                    push::v1::PushResponse*) override {
    std::map<std::string, std::string> headers;
    for (const auto& [k, v] : ctx->client_metadata()) {
      std::string key = absl::AsciiStrToLower(absl::string_view(k.data(), k.size()));
      if (absl::EndsWith(key, "-bin")) continue;
      headers[key] = std::string(v.data(), v.size());
    }
    Answer a = r_->Handle("grpc", headers, req, "");
    if (a.ok) return grpc::Status::OK;
    return grpc::Status(static_cast<grpc::StatusCode>(a.grpc_code), a.message);
  }

 private:
  Receiver* r_;
};

// "host:port" / "[v6]:port" -> host (without brackets), port.
bool SplitHostPort(const std::string& addr, std::string* host, int* port) {
  size_t colon = addr.rfind(':');
  if (colon == std::string::npos) return false;
  *host = addr.substr(0, colon);
  if (absl::StartsWith(*host, "[") && absl::EndsWith(*host, "]")) {
    *host = host->substr(1, host->size() - 2);
  }
  return absl::SimpleAtoi(addr.substr(colon + 1), port) && *port >= 0 && *port <= 65535;
}

std::string ReadFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
}

// POST /control: either ?action=fail&status=429&count=3 or a body "fail status=429 count=3".
void AddControlRoute(httplib::Server* s, std::function<std::string(absl::string_view)> control) {
  s->Post("/control", [control](const httplib::Request& req, httplib::Response& res) {
    std::string line = std::string(absl::StripAsciiWhitespace(req.body));
    if (req.has_param("action")) {
      line = req.get_param_value("action");
      for (const auto& [k, v] : req.params) {
        if (k != "action") absl::StrAppend(&line, " ", k, "=", v);
      }
    }
    std::string reply = control(line);
    res.status = absl::StartsWith(reply, "ok") ? 200 : 400;
    res.set_content(reply + "\n", "text/plain");
  });
}

// The push listeners (gRPC and Connect), which `refuse` closes and `accept` reopens on the same
// ports.
class Listeners {
 public:
  Listeners(Receiver* r, std::function<std::string(absl::string_view)> control)
      : r_(r), control_(std::move(control)) {}

  // Starts both listeners; on the first call ports 0 become the chosen ones. "" on success.
  std::string Start() {
    absl::MutexLock l(&mu_);
    if (running_) return "";
    std::string grpc_addr = absl::GetFlag(FLAGS_grpc_address);
    if (!grpc_addr.empty()) {
      std::string host;
      int port;
      if (!SplitHostPort(grpc_addr, &host, &port)) return "bad --grpc-address";
      if (grpc_port_ != 0) port = grpc_port_;
      std::string bind = host.find(':') != std::string::npos ? absl::StrCat("[", host, "]:", port)
                                                             : absl::StrCat(host, ":", port);
      grpc_service_ = std::make_unique<PusherService>(r_);
      grpc::ServerBuilder b;
      int selected = 0;
      b.AddListeningPort(bind, GrpcCredentials(), &selected);
      b.RegisterService(grpc_service_.get());
      b.SetMaxReceiveMessageSize(64 << 20);
      grpc_server_ = b.BuildAndStart();
      if (grpc_server_ == nullptr || selected == 0) {
        return absl::StrCat("cannot listen on gRPC ", bind);
      }
      grpc_port_ = selected;
    }
    std::string http_addr = absl::GetFlag(FLAGS_http_address);
    if (!http_addr.empty()) {
      std::string host;
      int port;
      if (!SplitHostPort(http_addr, &host, &port)) return "bad --http-address";
      if (http_port_ != 0) port = http_port_;
      if (!absl::GetFlag(FLAGS_tls_cert).empty()) {
        std::string ca = absl::GetFlag(FLAGS_tls_client_ca);
        http_ = std::make_unique<httplib::SSLServer>(absl::GetFlag(FLAGS_tls_cert).c_str(),
                                                     absl::GetFlag(FLAGS_tls_key).c_str(),
                                                     ca.empty() ? nullptr : ca.c_str());
      } else {
        http_ = std::make_unique<httplib::Server>();
      }
      if (!http_->is_valid()) return "cannot set up the HTTP server (TLS files?)";
      // An idle keep-alive connection holds up stop() (refuse) for this long.
      http_->set_keep_alive_timeout(1);
      Routes(http_.get());
      if (port == 0) {
        port = http_->bind_to_any_port(host);
        if (port <= 0) return absl::StrCat("cannot listen on HTTP ", http_addr);
      } else if (!http_->bind_to_port(host, port)) {
        return absl::StrCat("cannot listen on HTTP ", host, ":", port);
      }
      http_port_ = port;
      // The socket listens once bound: connections queue until the accept loop runs.
      auto done = std::make_shared<std::atomic<bool>>(false);
      http_thread_ = std::thread([s = http_.get(), done] {
        s->listen_after_bind();
        *done = true;
      });
      // httplib's stop() is a no-op until the accept loop runs: wait for it, so a `refuse`
      // right after `accept` cannot miss it.
      while (!http_->is_running() && !*done) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
    }
    running_ = true;
    return "";
  }

  // Closes both listeners: new connections are refused, open ones are closed.
  void Stop() {
    absl::MutexLock l(&mu_);
    if (!running_) return;
    if (grpc_server_) {
      grpc_server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
      grpc_server_->Wait();
      grpc_server_.reset();
      grpc_service_.reset();
    }
    if (http_) {
      http_->stop();
      if (http_thread_.joinable()) http_thread_.join();
      http_.reset();
    }
    running_ = false;
  }

  int grpc_port() const { return grpc_port_; }
  int http_port() const { return http_port_; }

 private:
  std::shared_ptr<grpc::ServerCredentials> GrpcCredentials() {
    std::string cert = absl::GetFlag(FLAGS_tls_cert);
    if (cert.empty()) return grpc::InsecureServerCredentials();
    std::string ca = absl::GetFlag(FLAGS_tls_client_ca);
    grpc::SslServerCredentialsOptions opts(
        ca.empty() ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
                   : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    if (!ca.empty()) opts.pem_root_certs = ReadFile(ca);
    opts.pem_key_cert_pairs.push_back({ReadFile(absl::GetFlag(FLAGS_tls_key)), ReadFile(cert)});
    return grpc::SslServerCredentials(opts);
  }

  void Routes(httplib::Server* s) {
    // Control on the push port itself, except refuse/accept: stopping this server from one of
    // its own handlers would wait for that handler (use stdin or the control port).
    AddControlRoute(s, [this](absl::string_view line) -> std::string {
      absl::string_view cmd = absl::StripAsciiWhitespace(line);
      if (absl::StartsWith(cmd, "refuse") || absl::StartsWith(cmd, "accept")) {
        return "error refuse/accept only through stdin or --control-address";
      }
      return control_(line);
    });
    s->Post(
        "/push.v1.PusherService/Push", [this](const httplib::Request& req, httplib::Response& res) {
          std::map<std::string, std::string> headers;
          for (const auto& [k, v] : req.headers) {
            std::string key = absl::AsciiStrToLower(k);
            if (key == "remote_addr" || key == "remote_port" || key == "local_addr" ||
                key == "local_port") {
              continue;  // httplib's pseudo-headers
            }
            headers[key] = v;
          }
          std::string problem;
          push::v1::PushRequest request;
          bool parsed = false;
          std::string ct = req.get_header_value("Content-Type");
          if (ct != "application/proto") {
            problem = absl::StrCat("Content-Type \"", ct, "\" (want application/proto)");
          } else if (!request.ParseFromString(req.body)) {
            problem = "body is not a push.v1.PushRequest";
          } else {
            parsed = true;
          }
          Answer a = r_->Handle("connect", headers, parsed ? &request : nullptr, problem);
          if (a.ok) {
            res.status = 200;
            res.set_content("", "application/proto");  // an empty PushResponse
            return;
          }
          res.status = a.http_status;
          std::string code = absl::AsciiStrToLower(GrpcCodeName(a.grpc_code));
          res.set_content(absl::StrCat("{\"code\":\"", code, "\",\"message\":\"", a.message, "\"}"),
                          "application/json");
        });
  }

  Receiver* r_;
  std::function<std::string(absl::string_view)> control_;
  absl::Mutex mu_;
  bool running_ = false;
  int grpc_port_ = 0, http_port_ = 0;
  std::unique_ptr<PusherService> grpc_service_;
  std::unique_ptr<grpc::Server> grpc_server_;
  std::unique_ptr<httplib::Server> http_;
  std::thread http_thread_;
};

int Main() {
  signal(SIGPIPE, SIG_IGN);
  std::string dir = absl::GetFlag(FLAGS_profile_dir);
  if (!dir.empty()) mkdir(dir.c_str(), 0755);
  if (absl::GetFlag(FLAGS_tls_cert).empty() != absl::GetFlag(FLAGS_tls_key).empty()) {
    std::cerr << "--tls-cert and --tls-key go together\n";
    return 2;
  }
  Receiver receiver(absl::GetFlag(FLAGS_record), dir, absl::GetFlag(FLAGS_strict),
                    absl::GetFlag(FLAGS_quiet));
  if (!receiver.record_ok()) {
    std::cerr << "cannot open --record " << absl::GetFlag(FLAGS_record) << "\n";
    return 1;
  }
  std::unique_ptr<Listeners> listeners;
  auto listen = [&](bool on) -> std::string {
    if (!on) {
      listeners->Stop();
      return "";
    }
    return listeners->Start();
  };
  auto control = [&](absl::string_view line) { return receiver.Command(line, listen); };
  listeners = std::make_unique<Listeners>(&receiver, control);
  if (std::string err = listeners->Start(); !err.empty()) {
    std::cerr << err << "\n";
    return 1;
  }
  httplib::Server control_server;
  int control_port = 0;
  std::thread control_thread;
  std::string control_addr = absl::GetFlag(FLAGS_control_address);
  if (!control_addr.empty()) {
    std::string host;
    int port;
    if (!SplitHostPort(control_addr, &host, &port)) {
      std::cerr << "bad --control-address\n";
      return 2;
    }
    AddControlRoute(&control_server, control);
    control_server.Get("/stats", [&](const httplib::Request&, httplib::Response& res) {
      res.set_content(receiver.Command("stats", listen) + "\n", "text/plain");
    });
    control_port = port == 0 ? control_server.bind_to_any_port(host)
                             : (control_server.bind_to_port(host, port) ? port : -1);
    if (control_port <= 0) {
      std::cerr << "cannot listen on " << control_addr << "\n";
      return 1;
    }
    control_thread = std::thread([&] { control_server.listen_after_bind(); });
  }
  Emit(absl::StrCat("listening grpc=", listeners->grpc_port(), " http=", listeners->http_port(),
                    " control=", control_port));
  // Commands from stdin; EOF leaves the receiver running until a signal ends it.
  std::string line;
  while (std::getline(std::cin, line)) {
    if (absl::StripAsciiWhitespace(line).empty()) continue;
    Emit(receiver.Command(line, listen));
  }
  for (;;) pause();
}

}  // namespace
}  // namespace parascope::receiver

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "ps_test_receiver [--grpc-address=H:P] [--http-address=H:P] [--control-address=H:P]\n"
      "  [--tls-cert=F --tls-key=F [--tls-client-ca=F]] [--record=FILE] [--profile-dir=DIR]\n"
      "  [--strict] [--quiet]\n"
      "A test Pyroscope push endpoint; see test/receiver/README.md.");
  // Flags are spelled with dashes (--grpc-address) like the agent's; absl wants underscores.
  std::vector<std::string> args(argv, argv + argc);
  std::vector<char*> fixed;
  for (auto& a : args) {
    if (absl::StartsWith(a, "--")) {
      size_t end = std::min(a.find('='), a.size());
      for (size_t i = 2; i < end; ++i) {
        if (a[i] == '-') a[i] = '_';
      }
    }
    fixed.push_back(a.data());
  }
  absl::ParseCommandLine(static_cast<int>(fixed.size()), fixed.data());
  return parascope::receiver::Main();
}
