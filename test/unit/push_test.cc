// Unit tests of the Pyroscope push exporter's pure parts (trimming to the server's limits, UUIDs,
// URL and header handling, retry classification, backoff) and of its queue and retry loop with a
// fake transport and clock. No network.
#include <catch2/catch.hpp>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <regex>
#include <set>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "agent/export/push_protocol.h"
#include "agent/export/pyroscope_exporter.h"
#include "agent/export/server_limits.h"
#include "agent/profile/pprof_builder.h"

namespace parascope {
namespace {

using perftools::profiles::Profile;

// A profile of `n` samples, each with its own stack of two frames (a shared "main" and a leaf
// "f<i>" with a `name_len`-character name), values {1, i + 1} (samples/count, cpu/nanoseconds),
// and optional label `state` cycling through `states` values.
Profile MakeProfile(int n, size_t name_len = 8, int states = 0, bool tid_labels = false) {
  PprofBuilder b({{"samples", "count"}, {"cpu", "nanoseconds"}}, {"cpu", "nanoseconds"}, 1000);
  uint64_t main_fn = b.AddFunction({"main", "main", "main.c"});
  uint64_t main_loc = b.AddLocation(0, 0x1000, {main_fn});
  for (int i = 0; i < n; ++i) {
    std::string name = absl::StrCat("f", i);
    if (name.size() < name_len) name.append(name_len - name.size(), 'x');
    uint64_t fn = b.AddFunction({name, name, "lib.c"});
    uint64_t loc = b.AddLocation(0, 0x2000 + i, {fn});
    std::vector<LabelSpec> labels;
    if (states > 0) labels.push_back(LabelSpec::Str("state", absl::StrCat("s", i % states)));
    if (tid_labels) labels.push_back(LabelSpec::Str("tid", absl::StrCat(i)));
    std::vector<uint64_t> locs = {loc, main_loc};
    std::vector<int64_t> values = {1, i + 1};
    b.AddSample(locs, values, labels);
  }
  return *std::move(b).Build(1700000000000000000, 15000000000);
}

int64_t Total(const Profile& p, int column) {
  int64_t t = 0;
  for (const auto& s : p.sample()) t += s.value(column);
  return t;
}

const std::string& Str(const Profile& p, int64_t i) { return p.string_table(i); }

// The [other] samples of a trimmed profile.
std::vector<const perftools::profiles::Sample*> OtherSamples(const Profile& p) {
  std::set<uint64_t> other_locs;
  for (const auto& loc : p.location()) {
    for (const auto& line : loc.line()) {
      for (const auto& fn : p.function()) {
        if (fn.id() == line.function_id() && Str(p, fn.name()) == "[other]") {
          other_locs.insert(loc.id());
        }
      }
    }
  }
  std::vector<const perftools::profiles::Sample*> out;
  for (const auto& s : p.sample()) {
    if (s.location_id_size() == 1 && other_locs.count(s.location_id(0))) out.push_back(&s);
  }
  return out;
}

// Every id and string index refers to something, and nothing is unreferenced.
void CheckConsistent(const Profile& p) {
  REQUIRE(p.string_table_size() > 0);
  CHECK(p.string_table(0).empty());
  std::set<uint64_t> locs, fns, maps;
  for (const auto& l : p.location()) locs.insert(l.id());
  for (const auto& f : p.function()) fns.insert(f.id());
  for (const auto& m : p.mapping()) maps.insert(m.id());
  std::set<uint64_t> used_locs, used_fns;
  for (const auto& s : p.sample()) {
    CHECK(s.value_size() == p.sample_type_size());
    for (uint64_t id : s.location_id()) {
      CHECK(locs.count(id) == 1);
      used_locs.insert(id);
    }
    for (const auto& l : s.label()) {
      CHECK(l.key() < p.string_table_size());
      CHECK(l.str() < p.string_table_size());
    }
  }
  for (const auto& l : p.location()) {
    if (l.mapping_id() != 0) CHECK(maps.count(l.mapping_id()) == 1);
    for (const auto& line : l.line()) {
      CHECK(fns.count(line.function_id()) == 1);
      used_fns.insert(line.function_id());
    }
  }
  for (const auto& f : p.function()) {
    CHECK(f.name() < p.string_table_size());
    CHECK(f.system_name() < p.string_table_size());
  }
  CHECK(used_locs == locs);
  CHECK(used_fns == fns);
  // Still a valid gzip pprof round trip.
  auto gz = SerializeGzip(p);
  REQUIRE(gz.ok());
  auto back = ParseMaybeGzip(*gz);
  REQUIRE(back.ok());
  CHECK(back->sample_size() == p.sample_size());
}

}  // namespace

TEST_CASE("trim: a profile within the limits is left untouched") {
  Profile p = MakeProfile(100);
  std::string before = p.SerializeAsString();
  CHECK(TrimForServerLimits(&p, kServerMaxSamples, kServerMaxProfileBytes) == 0);
  CHECK(p.SerializeAsString() == before);
}

TEST_CASE("trim: over 16000 samples folds the smallest into [other], keeping totals") {
  Profile p = MakeProfile(20000);
  int64_t count = Total(p, 0), cpu = Total(p, 1);
  size_t folded = TrimForServerLimits(&p, kServerMaxSamples, kServerMaxProfileBytes);
  CHECK(folded == 20000 - (kServerMaxSamples - 1));
  REQUIRE(p.sample_size() == static_cast<int>(kServerMaxSamples));
  CHECK(Total(p, 0) == count);
  CHECK(Total(p, 1) == cpu);
  auto other = OtherSamples(p);
  REQUIRE(other.size() == 1);
  // The folded ones were the smallest: cpu values 1..folded.
  CHECK(other[0]->value(0) == static_cast<int64_t>(folded));
  CHECK(other[0]->value(1) == static_cast<int64_t>(folded * (folded + 1) / 2));
  for (const auto& s : p.sample()) {
    if (&s != other[0]) CHECK(s.value(1) > static_cast<int64_t>(folded));
  }
  // Functions of folded samples are gone, "main" stays, a comment says what happened.
  std::set<std::string> names;
  for (const auto& f : p.function()) names.insert(Str(p, f.name()));
  CHECK(names.count("main") == 1);
  CHECK(names.count("f0xxxxxx") == 0);
  CHECK(names.count("f19999xx") == 1);
  CHECK(names.size() == kServerMaxSamples - 1 + 2);  // kept leaves + main + [other]
  bool comment = false;
  for (int64_t c : p.comment()) comment |= Str(p, c).find("folded 4001") != std::string::npos;
  CHECK(comment);
  CheckConsistent(p);
}

TEST_CASE("trim: over the byte limit folds as few samples as needed") {
  // 1000 samples with 3000-byte function names (name and system_name share one string): ~3 MB.
  Profile p = MakeProfile(1000, 3000);
  REQUIRE(p.ByteSizeLong() > 3000000);
  int64_t cpu = Total(p, 1);
  size_t folded = TrimForServerLimits(&p, kServerMaxSamples, kServerMaxProfileBytes);
  INFO("folded " << folded << " bytes " << p.ByteSizeLong());
  CHECK(p.ByteSizeLong() <= kServerMaxProfileBytes);
  // Minimal: each sample costs ~3 kB, so the result is within two samples of the limit.
  CHECK(p.ByteSizeLong() > kServerMaxProfileBytes - 2 * 3100);
  CHECK(folded > 300);
  CHECK(folded < 400);
  CHECK(Total(p, 1) == cpu);
  CheckConsistent(p);
}

TEST_CASE("trim: folded samples keep their low-cardinality labels, per label set") {
  Profile p = MakeProfile(300, 8, /*states=*/3);
  std::map<std::string, int64_t> by_state;
  auto per_state = [](const Profile& q) {
    std::map<std::string, int64_t> m;
    for (const auto& s : q.sample()) {
      for (const auto& l : s.label()) {
        if (q.string_table(l.key()) == "state") m[q.string_table(l.str())] += s.value(1);
      }
    }
    return m;
  };
  by_state = per_state(p);
  size_t folded = TrimForServerLimits(&p, 100, kServerMaxProfileBytes);
  CHECK(p.sample_size() <= 100);
  CHECK(folded == 300 - 97);  // 97 kept + 3 [other] samples (one per state)
  CHECK(OtherSamples(p).size() == 3);
  CHECK(per_state(p) == by_state);
  CheckConsistent(p);
}

TEST_CASE("trim: high-cardinality labels fold into one unlabeled [other] sample") {
  Profile p = MakeProfile(500, 8, 0, /*tid_labels=*/true);
  int64_t cpu = Total(p, 1);
  size_t folded = TrimForServerLimits(&p, 100, kServerMaxProfileBytes);
  CHECK(folded == 401);
  CHECK(p.sample_size() == 100);
  auto other = OtherSamples(p);
  REQUIRE(other.size() == 1);
  CHECK(other[0]->label_size() == 0);
  CHECK(Total(p, 1) == cpu);
  CheckConsistent(p);
}

TEST_CASE("trim: a tiny sample budget still fits (labels give way)") {
  Profile p = MakeProfile(50, 8, /*states=*/5);
  int64_t cpu = Total(p, 1);
  TrimForServerLimits(&p, 2, kServerMaxProfileBytes);
  CHECK(p.sample_size() <= 2);
  CHECK(Total(p, 1) == cpu);
  CheckConsistent(p);
}

TEST_CASE("sample labels: only low-cardinality keys stay, samples merge, totals kept") {
  // 40 threads x 5 stacks x 2 states, with thread_name (string) and tid (numeric) labels.
  PprofBuilder b({{"wall", "nanoseconds"}}, {"wall", "nanoseconds"}, 1000);
  std::vector<uint64_t> locs;
  for (int i = 0; i < 5; ++i) {
    uint64_t fn = b.AddFunction({absl::StrCat("fn", i), absl::StrCat("fn", i), ""});
    locs.push_back(b.AddLocation(0, 0x1000 + i, {fn}));
  }
  for (int tid = 1; tid <= 40; ++tid) {
    for (int i = 0; i < 5; ++i) {
      for (const char* state : {"running", "sleeping"}) {
        std::vector<LabelSpec> labels = {LabelSpec::Str("thread_name", absl::StrCat("t", tid)),
                                         LabelSpec::Num("tid", tid),
                                         LabelSpec::Str("state", state)};
        std::vector<uint64_t> stack = {locs[i]};
        std::vector<int64_t> values = {tid * 10 + i};
        b.AddSample(stack, values, labels);
      }
    }
  }
  Profile p = *std::move(b).Build(1, 1);
  int64_t total = Total(p, 0);
  REQUIRE(p.sample_size() == 400);
  CHECK(KeepSampleLabels(&p, {"state", "parallelism"}) == 400 * 2);
  CHECK(p.sample_size() == 10);  // 5 stacks x 2 states
  CHECK(Total(p, 0) == total);
  for (const auto& s : p.sample()) {
    REQUIRE(s.label_size() == 1);
    CHECK(Str(p, s.label(0).key()) == "state");
  }
  for (const auto& str : p.string_table()) {
    CHECK(str != "thread_name");
    CHECK(str != "tid");
    CHECK(str != "t7");
  }
  CheckConsistent(p);
  std::string before = p.SerializeAsString();
  CHECK(KeepSampleLabels(&p, {"state"}) == 0);  // nothing left to remove: untouched
  CHECK(p.SerializeAsString() == before);
}

TEST_CASE("uuid: v4 text, version and variant bits, unique") {
  std::regex re("^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$");
  std::set<std::string> seen;
  for (int i = 0; i < 2000; ++i) {
    std::string id = NewUuidV4();
    REQUIRE(std::regex_match(id, re));
    CHECK(IsUuidV4(id));
    seen.insert(id);
  }
  CHECK(seen.size() == 2000);
  std::array<uint8_t, 16> zero{}, ones;
  ones.fill(0xff);
  CHECK(UuidV4FromBytes(zero) == "00000000-0000-4000-8000-000000000000");
  CHECK(UuidV4FromBytes(ones) == "ffffffff-ffff-4fff-bfff-ffffffffffff");
  CHECK_FALSE(IsUuidV4("00000000-0000-1000-8000-000000000000"));  // version 1
  CHECK_FALSE(IsUuidV4("00000000-0000-4000-c000-000000000000"));  // variant 110x
  CHECK_FALSE(IsUuidV4("00000000-0000-4000-8000-00000000000"));
  CHECK_FALSE(IsUuidV4("0000000000000-4000-8000-000000000000-"));
}

TEST_CASE("retry classification follows SPEC section 6") {
  for (int s : {408, 429, 500, 502, 503, 504, 599}) {
    INFO(s);
    CHECK(IsRetryableHttpStatus(s));
  }
  for (int s : {200, 400, 401, 403, 404, 409, 413, 415, 499}) {
    INFO(s);
    CHECK_FALSE(IsRetryableHttpStatus(s));
  }
  std::set<std::string> retry = {"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED",
                                 "INTERNAL",    "UNKNOWN",           "ABORTED",
                                 "DATA_LOSS"};
  for (int code = 0; code <= 16; ++code) {
    std::string name = GrpcCodeName(code);
    INFO(name);
    CHECK(GrpcCodeFromName(name) == code);
    CHECK(IsRetryableGrpcCode(code) == (retry.count(name) == 1));
  }
  CHECK_FALSE(IsRetryableGrpcCode(3));                 // INVALID_ARGUMENT
  CHECK_FALSE(IsRetryableGrpcCode(16));                // UNAUTHENTICATED
  CHECK_FALSE(IsRetryableGrpcCode(7));                 // PERMISSION_DENIED
  CHECK(GrpcCodeFromName("resource_exhausted") == 8);  // Connect's spelling
  CHECK(GrpcCodeFromName("canceled") == 1);
  CHECK(GrpcCodeFromName("nope") == -1);
  CHECK(GrpcCodeName(42) == "CODE_42");
  CHECK(ConnectHttpStatus(8) == 429);
  CHECK(ConnectHttpStatus(3) == 400);
  CHECK(ConnectHttpStatus(14) == 503);
  CHECK(ConnectHttpStatus(16) == 401);
  CHECK(ConnectHttpStatus(7) == 403);
}

TEST_CASE("backoff: exponential ceiling, capped, full jitter") {
  absl::Duration i = absl::Milliseconds(500), m = absl::Seconds(30);
  CHECK(BackoffCeiling(0, i, m) == absl::Milliseconds(500));
  CHECK(BackoffCeiling(1, i, m) == absl::Seconds(1));
  CHECK(BackoffCeiling(5, i, m) == absl::Seconds(16));
  CHECK(BackoffCeiling(6, i, m) == absl::Seconds(30));
  CHECK(BackoffCeiling(1000000, i, m) == absl::Seconds(30));
  CHECK(BackoffDelay(3, i, m, 0.0) == absl::ZeroDuration());
  CHECK(BackoffDelay(3, i, m, 0.5) == absl::Seconds(2));
  CHECK(BackoffDelay(10, i, m, 0.999) < absl::Seconds(30));
  CHECK(BackoffDelay(10, i, m, 0.999) > absl::Seconds(29));
}

TEST_CASE("remote URL parsing") {
  auto u = ParseRemoteUrl("http://127.0.0.1:4040");
  REQUIRE(u.ok());
  CHECK(u->Authority() == "127.0.0.1:4040");
  CHECK_FALSE(u->tls());
  u = ParseRemoteUrl("https://profiles.example.com/");
  REQUIRE(u.ok());
  CHECK(u->port == 443);
  CHECK(u->tls());
  CHECK(u->path.empty());
  CHECK(u->Base() == "https://profiles.example.com:443");
  u = ParseRemoteUrl("http://[::1]:9/prefix/");
  REQUIRE(u.ok());
  CHECK(u->host == "::1");
  CHECK(u->Authority() == "[::1]:9");
  CHECK(u->Base() == "http://[::1]:9/prefix");
  for (const char* bad : {"ftp://x", "127.0.0.1:4040", "http://", "http://h:0", "http://h:99999",
                          "http://h:x", "http://h/?q=1", "http://user:secret@h:1", "http://[::1"}) {
    INFO(bad);
    auto r = ParseRemoteUrl(bad);
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  }
  // The password is not echoed back.
  CHECK(ParseRemoteUrl("http://user:secret@h:1").status().message().find("secret") ==
        absl::string_view::npos);
}

TEST_CASE("push headers: tenant, basic or bearer auth, extra headers") {
  PyroscopeOptions o;
  o.tenant_id = "team-a";
  o.basic_auth_user = "user";
  o.basic_auth_password = "p@ss";
  o.headers = {{"X-Extra", "1"}};
  auto h = PushHeaders(o);
  REQUIRE(h.ok());
  REQUIRE(h->size() == 3);
  CHECK((*h)[0] == std::make_pair(std::string("X-Scope-OrgID"), std::string("team-a")));
  CHECK((*h)[1].second == "Basic " + absl::Base64Escape("user:p@ss"));
  CHECK((*h)[2].first == "X-Extra");
  o.bearer_token = "tok";
  CHECK(PushHeaders(o).status().code() == absl::StatusCode::kInvalidArgument);
  o.basic_auth_user.clear();
  o.basic_auth_password.clear();
  h = PushHeaders(o);
  REQUIRE(h.ok());
  CHECK((*h)[1].second == "Bearer tok");
  for (auto bad : std::vector<std::pair<std::string, std::string>>{{"Bad Name", "1"},
                                                                   {"X-A", "a\r\nb"},
                                                                   {"Content-Type", "x"},
                                                                   {"grpc-timeout", "1"},
                                                                   {"", "1"}}) {
    PyroscopeOptions b;
    b.headers = {bad};
    INFO(bad.first);
    CHECK(PushHeaders(b).status().code() == absl::StatusCode::kInvalidArgument);
  }
}

TEST_CASE("exporter: Create validates URL, protocol and TLS files") {
  auto make = [](PyroscopeOptions o) { return PyroscopeExporter::Create(o, nullptr).status(); };
  PyroscopeOptions o;
  o.url = "ftp://x";
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);
  o.url = "http://127.0.0.1:1";
  o.protocol = "http3";
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);
  o.protocol = "connect";
  o.tls_ca_file = "/nonexistent/ca.pem";
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);  // TLS file with http://
  o.url = "https://127.0.0.1:1";
  for (const char* proto : {"grpc", "connect"}) {
    o.protocol = proto;
    absl::Status s = make(o);
    INFO(proto << ": " << s);
    CHECK(s.code() == absl::StatusCode::kNotFound);
    CHECK(s.message().find("/nonexistent/ca.pem") != absl::string_view::npos);
  }
  o.tls_ca_file.clear();
  o.tls_cert_file = "/etc/hostname";
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);  // cert without key
  o.tls_cert_file.clear();
  o.url = "http://127.0.0.1:1/prefix";
  o.protocol = "grpc";
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);
  o.protocol = "connect";
  CHECK(make(o).ok());
  o.queue_max_bytes = 0;
  CHECK(make(o).code() == absl::StatusCode::kInvalidArgument);
}

// ---- the exporter's queue and retries with a fake transport ----

namespace {

// Answers requests from a script (then `fallback`), records them, and can hold a request on the
// wire until released. Waits are on condition variables: tests synchronize on calls.
class FakeTransport : public PushTransport {
 public:
  PushResult Push(const push::v1::PushRequest& request, absl::Duration) override {
    std::unique_lock<std::mutex> l(mu_);
    requests_.push_back(request);
    cv_.notify_all();
    cv_.wait(l, [&] { return !hold_ || cancelled_; });
    if (cancelled_) return PushResult{false, false, "CANCELLED", "cancelled"};
    if (!script_.empty()) {
      PushResult r = script_.front();
      script_.pop_front();
      return r;
    }
    return fallback_;
  }
  void Cancel() override {
    std::lock_guard<std::mutex> l(mu_);
    cancelled_ = true;
    cv_.notify_all();
  }

  void Script(std::vector<PushResult> results) {
    std::lock_guard<std::mutex> l(mu_);
    script_.insert(script_.end(), results.begin(), results.end());
  }
  void SetFallback(PushResult r) {
    std::lock_guard<std::mutex> l(mu_);
    fallback_ = r;
  }
  void Hold(bool on) {
    std::lock_guard<std::mutex> l(mu_);
    hold_ = on;
    cv_.notify_all();
  }
  // Waits until at least n requests arrived (at most 30 s). False on timeout.
  bool WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> l(mu_);
    return cv_.wait_for(l, std::chrono::seconds(30), [&] { return requests_.size() >= n; });
  }
  std::vector<push::v1::PushRequest> requests() {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> l(mu_);
    return cancelled_;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PushResult> script_;
  PushResult fallback_{true, false, "", ""};
  std::vector<push::v1::PushRequest> requests_;
  bool hold_ = false;
  bool cancelled_ = false;
};

PushResult Fail(const std::string& code, bool retryable) {
  return PushResult{false, retryable, code, "injected " + code};
}

ProcessProfile MakeProcessProfile(int samples = 10, const std::string& type = "process_cpu") {
  ProcessProfile p;
  p.process.tgid = 42;
  p.process_name = "worker";
  p.type = type;
  *p.profile = MakeProfile(samples);
  p.profile->set_time_nanos(absl::ToUnixNanos(absl::Now()));
  return p;
}

struct Fixture {
  explicit Fixture(PyroscopeOptions o = {}, std::function<absl::Time()> now = absl::Now) {
    if (o.url.empty()) o.url = "http://127.0.0.1:4040";
    o.backoff_initial = absl::Milliseconds(1);
    o.backoff_max = absl::Milliseconds(5);
    auto t = std::make_unique<FakeTransport>();
    fake = t.get();
    auto e = PyroscopeExporter::CreateWithTransport(
        o,
        [](const ProcessProfile& p) {
          return std::vector<std::pair<std::string, std::string>>{
              {"service_name", p.process_name}, {"__name__", "ignored"}, {"hostname", "h1"}};
        },
        std::move(t), std::move(now));
    REQUIRE(e.ok());
    exporter = std::move(*e);
  }
  FakeTransport* fake;
  std::unique_ptr<PyroscopeExporter> exporter;
};

// Polls GetStats until `cond` holds (at most 30 s): the sender's bookkeeping after the fake's
// last call has no event of its own.
template <typename F>
bool StatsEventually(PyroscopeExporter* e, F cond) {
  auto deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    if (cond(e->GetStats())) return true;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return cond(e->GetStats());
}

}  // namespace

TEST_CASE("exporter: one series, one sample, __name__ plus labels, gzip pprof, a UUID") {
  Fixture f;
  ProcessProfile p = MakeProcessProfile();
  REQUIRE(f.exporter->Export(p).ok());
  REQUIRE(f.fake->WaitForCalls(1));
  f.exporter->Shutdown();
  auto reqs = f.fake->requests();
  REQUIRE(reqs.size() == 1);
  REQUIRE(reqs[0].series_size() == 1);
  const auto& s = reqs[0].series(0);
  std::vector<std::pair<std::string, std::string>> labels;
  for (const auto& l : s.labels()) labels.emplace_back(l.name(), l.value());
  CHECK(labels == std::vector<std::pair<std::string, std::string>>{
                      {"__name__", "process_cpu"}, {"service_name", "worker"}, {"hostname", "h1"}});
  REQUIRE(s.samples_size() == 1);
  CHECK(IsUuidV4(s.samples(0).id()));
  CHECK(s.samples(0).raw_profile().substr(0, 2) == "\x1f\x8b");
  auto back = ParseMaybeGzip(s.samples(0).raw_profile());
  REQUIRE(back.ok());
  CHECK(back->SerializeAsString() == p.profile->SerializeAsString());
  auto st = f.exporter->GetStats();
  CHECK(st.sent == 1);
  CHECK(st.enqueued == 1);
  CHECK(st.queue_bytes == 0);
  CHECK(st.bytes_sent == reqs[0].ByteSizeLong());
  CHECK(f.exporter->Export(p).code() == absl::StatusCode::kFailedPrecondition);
}

TEST_CASE("exporter: retryable failures are retried with the same ID until delivered") {
  Fixture f;
  f.fake->Script({Fail("429", true), Fail("UNAVAILABLE", true), Fail("connect", true)});
  REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  REQUIRE(f.fake->WaitForCalls(4));
  REQUIRE(StatsEventually(f.exporter.get(), [](const auto& s) { return s.sent == 1; }));
  auto st = f.exporter->GetStats();
  CHECK(st.retries == 3);
  CHECK(st.failures ==
        std::map<std::string, uint64_t>{{"429", 1}, {"UNAVAILABLE", 1}, {"connect", 1}});
  CHECK(st.dropped.empty());
  CHECK(st.endpoint_up);
  auto reqs = f.fake->requests();
  REQUIRE(reqs.size() == 4);
  for (const auto& r : reqs)
    CHECK(r.series(0).samples(0).id() == reqs[0].series(0).samples(0).id());
}

TEST_CASE("exporter: non-retryable responses are dropped and counted, never retried") {
  Fixture f;
  f.fake->Script({Fail("400", false), Fail("INVALID_ARGUMENT", false), Fail("401", false)});
  for (int i = 0; i < 4; ++i) REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  REQUIRE(f.fake->WaitForCalls(4));
  REQUIRE(StatsEventually(f.exporter.get(), [](const auto& s) { return s.sent == 1; }));
  auto st = f.exporter->GetStats();
  CHECK(st.retries == 0);
  CHECK(st.dropped == std::map<std::string, uint64_t>{{"rejected", 3}});
  CHECK(st.failures ==
        std::map<std::string, uint64_t>{{"400", 1}, {"INVALID_ARGUMENT", 1}, {"401", 1}});
  // Four distinct requests, one attempt each.
  std::set<std::string> ids;
  for (const auto& r : f.fake->requests()) ids.insert(r.series(0).samples(0).id());
  CHECK(ids.size() == 4);
}

TEST_CASE("exporter: the queue is bounded in bytes and drops the oldest") {
  // Measure one request's size with an unbounded exporter.
  // The same profile each time, so every request has the same size.
  ProcessProfile profile = MakeProcessProfile();
  size_t item_bytes;
  {
    Fixture probe;
    REQUIRE(probe.exporter->Export(profile).ok());
    REQUIRE(probe.fake->WaitForCalls(1));
    item_bytes = probe.fake->requests()[0].ByteSizeLong();
  }
  PyroscopeOptions o;
  o.queue_max_bytes = 3 * item_bytes + item_bytes / 2;  // room for three requests
  Fixture f(o);
  f.fake->Hold(true);
  REQUIRE(f.exporter->Export(profile).ok());
  REQUIRE(f.fake->WaitForCalls(1));  // request 1 is on the wire
  for (int i = 2; i <= 10; ++i) {
    REQUIRE(f.exporter->Export(profile).ok());
    auto st = f.exporter->GetStats();
    CHECK(st.queue_bytes <= o.queue_max_bytes);
    CHECK(st.queue_length <= 3);
  }
  auto st = f.exporter->GetStats();
  CHECK(st.queue_length == 3);
  CHECK(st.queue_bytes == 3 * item_bytes);
  // 2..7 dropped; request 1 left the queue while on the wire and counts by its outcome.
  CHECK(st.dropped == std::map<std::string, uint64_t>{{"queue_full", 6}});
  SECTION("the request on the wire is delivered: counted sent, not dropped") {
    f.fake->Hold(false);
    REQUIRE(f.fake->WaitForCalls(4));
    REQUIRE(StatsEventually(f.exporter.get(), [](const auto& s) { return s.sent == 4; }));
    st = f.exporter->GetStats();
    CHECK(st.dropped.at("queue_full") == 6);
    CHECK(st.sent + st.dropped.at("queue_full") == st.enqueued);
    CHECK(st.queue_bytes == 0);
  }
  SECTION("the request on the wire fails: counted dropped, not retried") {
    f.fake->Script({Fail("UNAVAILABLE", true)});
    f.fake->Hold(false);
    REQUIRE(f.fake->WaitForCalls(4));
    REQUIRE(StatsEventually(f.exporter.get(), [](const auto& s) { return s.sent == 3; }));
    st = f.exporter->GetStats();
    CHECK(st.dropped.at("queue_full") == 7);
    CHECK(st.retries == 0);
    CHECK(st.sent + st.dropped.at("queue_full") == st.enqueued);
  }
  // Delivered in order: the newest three after the one on the wire.
  auto reqs = f.fake->requests();
  REQUIRE(reqs.size() == 4);
}

TEST_CASE("exporter: a request larger than the whole queue is dropped at once") {
  PyroscopeOptions o;
  o.queue_max_bytes = 100;
  Fixture f(o);
  REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  auto st = f.exporter->GetStats();
  CHECK(st.dropped == std::map<std::string, uint64_t>{{"queue_full", 1}});
  CHECK(st.queue_bytes == 0);
}

TEST_CASE("exporter: readiness turns false after two windows unreachable, back on delivery") {
  absl::Mutex mu;
  absl::Time now = absl::Now();
  auto clock = [&] {
    absl::MutexLock l(&mu);
    return now;
  };
  auto advance = [&](absl::Duration d) {
    absl::MutexLock l(&mu);
    now += d;
  };
  PyroscopeOptions o;
  o.window = absl::Seconds(15);
  Fixture f(o, clock);
  f.fake->SetFallback(Fail("UNAVAILABLE", true));
  CHECK(f.exporter->Ready());
  REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  REQUIRE(f.fake->WaitForCalls(2));  // failed at least once, retrying
  CHECK(f.exporter->Ready());        // down, but not for long
  CHECK_FALSE(f.exporter->GetStats().endpoint_up);
  advance(absl::Seconds(29));
  CHECK(f.exporter->Ready());
  advance(absl::Seconds(2));
  CHECK_FALSE(f.exporter->Ready());
  CHECK_FALSE(f.exporter->GetStats().ready);
  f.fake->SetFallback(PushResult{true, false, "", ""});
  REQUIRE(StatsEventually(f.exporter.get(), [](const auto& s) { return s.sent == 1; }));
  CHECK(f.exporter->Ready());
  CHECK(f.exporter->GetStats().endpoint_up);
  CHECK(f.exporter->GetStats().retries >= 1);
}

TEST_CASE("exporter: profiles older than the server accepts are dropped as expired") {
  absl::Time fake_now = absl::Now() + absl::Hours(2);
  Fixture f({}, [&] { return fake_now; });
  REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  REQUIRE(StatsEventually(f.exporter.get(),
                          [](const auto& s) { return s.dropped.count("expired") == 1; }));
  CHECK(f.fake->requests().empty());
}

TEST_CASE("exporter: Shutdown flushes the queue") {
  Fixture f;
  f.fake->Script({Fail("503", true)});
  for (int i = 0; i < 5; ++i) REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  f.exporter->Shutdown();
  auto st = f.exporter->GetStats();
  CHECK(st.sent == 5);
  CHECK(st.queue_bytes == 0);
  CHECK(st.dropped.empty());
}

TEST_CASE("exporter: Shutdown cuts a long backoff short and retries at once") {
  PyroscopeOptions o;
  o.url = "http://127.0.0.1:4040";
  o.backoff_initial = absl::Seconds(20);  // the first retry would come 0..20 s later
  o.backoff_max = absl::Seconds(30);
  auto t = std::make_unique<FakeTransport>();
  FakeTransport* fake = t.get();
  fake->Script(
      {Fail("UNAVAILABLE", true), PushResult{false, true, "UNAVAILABLE", "x", absl::Seconds(20)}});
  auto e = PyroscopeExporter::CreateWithTransport(o, nullptr, std::move(t));
  REQUIRE(e.ok());
  REQUIRE((*e)->Export(MakeProcessProfile()).ok());
  REQUIRE(fake->WaitForCalls(2));  // the second failure asks for a 20 s wait (Retry-After)
  absl::Time start = absl::Now();
  (*e)->Shutdown();
  CHECK(absl::Now() - start < absl::Seconds(3));
  CHECK(fake->requests().size() == 3);
  CHECK((*e)->GetStats().sent == 1);
}

TEST_CASE("exporter: Shutdown gives up after shutdown_timeout, cancelling the request") {
  PyroscopeOptions o;
  o.shutdown_timeout = absl::Milliseconds(300);
  o.request_timeout = absl::Seconds(60);
  Fixture f(o);
  f.fake->Hold(true);  // the server never answers
  for (int i = 0; i < 3; ++i) REQUIRE(f.exporter->Export(MakeProcessProfile()).ok());
  REQUIRE(f.fake->WaitForCalls(1));
  absl::Time start = absl::Now();
  f.exporter->Shutdown();
  absl::Duration took = absl::Now() - start;
  CHECK(took >= absl::Milliseconds(290));
  CHECK(took < absl::Seconds(5));
  CHECK(f.fake->cancelled());
  auto st = f.exporter->GetStats();
  CHECK(st.sent == 0);
  CHECK(st.dropped == std::map<std::string, uint64_t>{{"shutdown", 3}});
  CHECK(st.queue_bytes == 0);
}

TEST_CASE("exporter: pushed profiles keep only the low-cardinality sample labels") {
  Fixture f;
  ProcessProfile p = MakeProcessProfile();
  *p.profile = MakeProfile(20, 8, /*states=*/2, /*tid_labels=*/true);
  p.profile->set_time_nanos(absl::ToUnixNanos(absl::Now()));
  REQUIRE(f.exporter->Export(p).ok());
  REQUIRE(f.fake->WaitForCalls(1));
  auto back = ParseMaybeGzip(f.fake->requests()[0].series(0).samples(0).raw_profile());
  REQUIRE(back.ok());
  std::set<std::string> keys;
  for (const auto& s : back->sample()) {
    for (const auto& l : s.label()) keys.insert(back->string_table(l.key()));
  }
  CHECK(keys == std::set<std::string>{"state"});
  CHECK(Total(*back, 1) == Total(*p.profile, 1));
}

TEST_CASE("exporter: oversized profiles are trimmed before they are queued") {
  Fixture f;
  REQUIRE(f.exporter->Export(MakeProcessProfile(17000)).ok());
  REQUIRE(f.fake->WaitForCalls(1));
  auto req = f.fake->requests()[0];
  auto back = ParseMaybeGzip(req.series(0).samples(0).raw_profile());
  REQUIRE(back.ok());
  CHECK(back->sample_size() == static_cast<int>(kServerMaxSamples));
  auto st = f.exporter->GetStats();
  CHECK(st.profiles_trimmed == 1);
  CHECK(st.samples_folded == 17000 - kServerMaxSamples + 1);
}

}  // namespace parascope
