#include "test/e2e/e2e_util.h"

#include <fcntl.h>
#include <httplib.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <regex>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace parascope::testing {

static int root_tests_skipped = 0;

bool RequireRoot() {
  if (geteuid() == 0) return true;
  const char* ci = std::getenv("CI");
  if (ci != nullptr && std::string(ci) == "true") {
    FAIL("this [root] test needs root (BPF, perf_event_open); CI=true forbids skipping it");
  }
  WARN("skipped: needs root (run `sudo make test`)");
  ++root_tests_skipped;
  return false;
}

int RootTestsSkipped() { return root_tests_skipped; }

Child::Child(const std::vector<std::string>& argv) {
  int in[2], out[2], err[2];
  REQUIRE(pipe2(in, O_CLOEXEC) == 0);
  REQUIRE(pipe2(out, O_CLOEXEC) == 0);
  REQUIRE(pipe2(err, O_CLOEXEC) == 0);
  pid_ = fork();
  REQUIRE(pid_ >= 0);
  if (pid_ == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  in_ = in[1];
  out_ = out[0];
  err_ = err[0];
}

Child::~Child() {
  if (in_ >= 0) close(in_);
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
  if (out_ >= 0) close(out_);
  if (err_ >= 0) close(err_);
}

bool Child::ReadLine(int fd, std::string* buf, std::string* transcript, std::string* line,
                     int timeout_s) {
  for (;;) {
    size_t nl = buf->find('\n');
    if (nl != std::string::npos) {
      *line = buf->substr(0, nl);
      buf->erase(0, nl + 1);
      return true;
    }
    pollfd p{fd, POLLIN, 0};
    int rc = poll(&p, 1, timeout_s * 1000);
    if (rc <= 0) return false;
    char chunk[4096];
    ssize_t n = read(fd, chunk, sizeof(chunk));
    if (n <= 0) return false;
    buf->append(chunk, n);
    transcript->append(chunk, n);
  }
}

bool Child::ReadStdoutLine(std::string* line, int timeout_s) {
  return ReadLine(out_, &out_buf_, &out_text_, line, timeout_s);
}
bool Child::ReadStderrLine(std::string* line, int timeout_s) {
  return ReadLine(err_, &err_buf_, &err_text_, line, timeout_s);
}

bool Child::WaitForStderr(const std::string& needle, std::string* line, int timeout_s) {
  while (ReadStderrLine(line, timeout_s)) {
    if (absl::StrContains(*line, needle)) return true;
  }
  return false;
}

bool Child::Running() const {
  if (pid_ <= 0) return false;
  siginfo_t info{};
  if (waitid(P_PID, pid_, &info, WEXITED | WNOHANG | WNOWAIT) != 0) return false;
  return info.si_pid == 0;  // no state change yet
}

void Child::WriteStdin(const std::string& data) {
  REQUIRE(write(in_, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
}

void Child::CloseStdin() {
  if (in_ >= 0) close(in_);
  in_ = -1;
}

int Child::Wait(int timeout_s) {
  // Drain both pipes until EOF (the child closes them at exit), then reap.
  pollfd fds[2] = {{out_, POLLIN, 0}, {err_, POLLIN, 0}};
  int open_fds = 2;
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  while (open_fds > 0 && std::chrono::steady_clock::now() < deadline) {
    if (poll(fds, 2, 1000) <= 0) continue;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP))) continue;
      char chunk[4096];
      ssize_t n = read(fds[i].fd, chunk, sizeof(chunk));
      if (n <= 0) {
        fds[i].fd = -1;
        --open_fds;
      } else {
        (i == 0 ? out_text_ : err_text_).append(chunk, n);
      }
    }
  }
  int status = 0;
  if (open_fds > 0) kill(pid_, SIGKILL);
  waitpid(pid_, &status, 0);
  pid_ = -1;
  return status;
}

int RunCommand(const std::string& command, std::string* out, std::string* err) {
  std::string errfile = std::filesystem::temp_directory_path() / "ps_cmd_stderr_XXXXXX";
  int efd = mkstemp(errfile.data());
  close(efd);
  FILE* f = popen((command + " 2>" + errfile).c_str(), "r");
  if (f == nullptr) return -1;
  char buf[65536];
  size_t n;
  out->clear();
  while ((n = fread(buf, 1, sizeof(buf), f)) > 0) out->append(buf, n);
  int status = pclose(f);
  if (err != nullptr) {
    FILE* e = fopen(errfile.c_str(), "r");
    while (e && (n = fread(buf, 1, sizeof(buf), e)) > 0) err->append(buf, n);
    if (e) fclose(e);
  }
  unlink(errfile.c_str());
  return status;
}

int RawProfile::ValueIndex(const std::string& type) const {
  for (size_t i = 0; i < sample_types.size(); ++i) {
    if (sample_types[i] == type || absl::StartsWith(sample_types[i], type + "/")) return i;
  }
  return -1;
}

int64_t RawProfile::Total(int value_index) const {
  int64_t t = 0;
  for (const auto& s : samples) t += s.values.at(value_index);
  return t;
}

std::vector<std::string> RawProfile::Frames(const Sample& s) const {
  std::vector<std::string> out;
  for (uint64_t id : s.location_ids) {
    auto it = locations.find(id);
    if (it == locations.end() || it->second.lines.size() <= 1) {
      out.push_back(it == locations.end() ? "" : it->second.function);
      continue;
    }
    for (const Line& l : it->second.lines) out.push_back(l.function);  // inlined ones first
  }
  return out;
}

bool RawProfile::IsKernelFrame(uint64_t location_id) const {
  auto it = locations.find(location_id);
  if (it == locations.end()) return false;
  auto m = mapping_files.find(it->second.mapping_id);
  return m != mapping_files.end() && m->second == "[kernel.kallsyms]";
}

namespace {

// "2026-11-30 18:20:26.259716858 +0000 UTC" (Go's time.Time.String) -> unix ns; 0 on error.
int64_t ParseGoTime(absl::string_view t) {
  int y, mo, d, h, mi, sec;
  int consumed = 0;
  std::string s(t);
  if (sscanf(s.c_str(), "%d-%d-%d %d:%d:%d%n", &y, &mo, &d, &h, &mi, &sec, &consumed) != 6) {
    return 0;
  }
  int64_t frac = 0;
  size_t i = consumed;
  if (i < s.size() && s[i] == '.') {
    int digits = 0;
    for (++i; i < s.size() && isdigit(static_cast<unsigned char>(s[i])); ++i, ++digits) {
      if (digits < 9) frac = frac * 10 + (s[i] - '0');
    }
    for (; digits < 9; ++digits) frac *= 10;
  }
  int64_t offset_s = 0;
  while (i < s.size() && s[i] == ' ') ++i;
  if (i + 5 <= s.size() && (s[i] == '+' || s[i] == '-')) {
    int hh = (s[i + 1] - '0') * 10 + (s[i + 2] - '0');
    int mm = (s[i + 3] - '0') * 10 + (s[i + 4] - '0');
    offset_s = (s[i] == '-' ? -1 : 1) * (hh * 3600 + mm * 60);
  }
  struct tm tm {};
  tm.tm_year = y - 1900;
  tm.tm_mon = mo - 1;
  tm.tm_mday = d;
  tm.tm_hour = h;
  tm.tm_min = mi;
  tm.tm_sec = sec;
  int64_t unix_s = static_cast<int64_t>(timegm(&tm)) - offset_s;
  return unix_s * 1000000000LL + frac;
}

bool IsLabelKeyChar(char c) {
  return isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '.' || c == '-';
}

// A pprof -raw label line: "key:[value] key2:[value2]" (string labels, sorted by key, on one
// line; numeric labels on the next). A value may contain spaces or ']': it ends at a ']' that
// ends the line or is followed by " key:[".
void ParseLabelLine(absl::string_view t, std::map<std::string, std::string>* labels) {
  size_t i = 0;
  while (i < t.size()) {
    size_t open = t.find(":[", i);
    if (open == absl::string_view::npos) return;
    std::string key(t.substr(i, open - i));
    size_t value_start = open + 2, end = absl::string_view::npos;
    for (size_t k = t.find(']', value_start); k != absl::string_view::npos;
         k = t.find(']', k + 1)) {
      if (k + 1 == t.size()) {
        end = k;
        break;
      }
      if (t[k + 1] != ' ') continue;
      size_t j = k + 2;
      while (j < t.size() && IsLabelKeyChar(t[j])) ++j;
      if (j > k + 2 && j + 1 < t.size() && t[j] == ':' && t[j + 1] == '[') {
        end = k;
        break;
      }
    }
    if (end == absl::string_view::npos) end = t.size();
    (*labels)[key] = std::string(t.substr(value_start, end - value_start));
    i = end + 2;
  }
}

// time_nanos (field 9) and duration_nanos (field 10) of a gzipped pprof Profile, read straight
// from the top-level protobuf fields. False if the file cannot be read or parsed.
bool ReadProfileTimes(const std::string& path, int64_t* time_nanos, int64_t* duration_nanos) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) return false;
  std::string data;
  char buf[65536];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) data.append(buf, n);
  gzclose(f);
  if (n < 0) return false;
  size_t i = 0;
  auto varint = [&](uint64_t* v) {
    *v = 0;
    for (int shift = 0; shift < 64 && i < data.size(); shift += 7) {
      uint8_t b = static_cast<uint8_t>(data[i++]);
      *v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) return true;
    }
    return false;
  };
  *time_nanos = *duration_nanos = 0;
  while (i < data.size()) {
    uint64_t tag, v;
    if (!varint(&tag)) return false;
    switch (tag & 7) {
      case 0:
        if (!varint(&v)) return false;
        if (tag >> 3 == 9) *time_nanos = static_cast<int64_t>(v);
        if (tag >> 3 == 10) *duration_nanos = static_cast<int64_t>(v);
        break;
      case 1: i += 8; break;
      case 2:
        if (!varint(&v) || v > data.size() - i) return false;
        i += v;
        break;
      case 5: i += 4; break;
      default: return false;
    }
  }
  return i == data.size();
}

}  // namespace

int64_t ParseGoDuration(const std::string& text) {
  static const std::pair<const char*, double> kUnits[] = {
      {"ns", 1}, {"us", 1e3}, {"\xc2\xb5s", 1e3}, {"\xce\xbcs", 1e3}, {"ms", 1e6},
      {"s", 1e9}, {"m", 60e9}, {"h", 3600e9}};
  absl::string_view s(text);
  if (s.empty() || s.back() != 's') return -1;
  if (s == "0s") return 0;
  double total = 0;
  while (!s.empty()) {
    size_t n = 0;
    while (n < s.size() && (isdigit(static_cast<unsigned char>(s[n])) || s[n] == '.')) ++n;
    if (n == 0) return -1;
    double v;
    if (!absl::SimpleAtod(s.substr(0, n), &v)) return -1;
    s.remove_prefix(n);
    double mult = 0;
    for (const auto& [unit, m] : kUnits) {
      if (absl::StartsWith(s, unit)) {
        // "m" must not take the "m" of "ms".
        if (std::string(unit) == "m" && absl::StartsWith(s, "ms")) continue;
        mult = m;
        s.remove_prefix(strlen(unit));
        break;
      }
    }
    if (mult == 0) return -1;
    total += v * mult;
  }
  return static_cast<int64_t>(total + 0.5);
}

std::map<std::string, std::string> KeyValues(const std::string& line) {
  std::map<std::string, std::string> out;
  for (absl::string_view tok : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    size_t eq = tok.find('=');
    if (eq == absl::string_view::npos || eq == 0) continue;
    out[std::string(tok.substr(0, eq))] = std::string(tok.substr(eq + 1));
  }
  return out;
}

// One Line as pprof -raw prints it: "fn file:line s=start", followed by "(system name)" when that
// differs from fn (file may be empty: "fn :0 s=0"; the function name may contain spaces and
// colons, the file is taken as the last space-free token; a system name, mangled, has no spaces).
static RawProfile::Line ParseLocationLine(absl::string_view body) {
  RawProfile::Line out;
  size_t s_pos = body.rfind(" s=");
  if (s_pos != absl::string_view::npos) {
    absl::string_view tail = body.substr(s_pos + 3);
    size_t open = tail.find('(');
    if (open != absl::string_view::npos && absl::EndsWith(tail, ")")) {
      out.system_name = std::string(tail.substr(open + 1, tail.size() - open - 2));
    }
    body = body.substr(0, s_pos);
  }
  auto finish = [&out](absl::string_view function) {
    out.function = std::string(function);
    if (out.system_name.empty()) out.system_name = out.function;
    return out;
  };
  size_t colon = body.rfind(':');
  if (colon == absl::string_view::npos) return finish(body);
  (void)absl::SimpleAtoi(body.substr(colon + 1), &out.line);
  absl::string_view before = body.substr(0, colon);
  size_t sp = before.rfind(' ');
  if (sp == absl::string_view::npos) return finish(before);
  out.file = std::string(before.substr(sp + 1));
  return finish(before.substr(0, sp));
}

// pprof -raw layout (github.com/google/pprof/profile/profile.go String()): header lines, then
// "Samples:", a line of sample types, per sample "  v1 v2: loc loc ..." followed by label
// lines "key:[value]"; "Locations", lines "  id: 0xaddr M=m fn :line s=start(sysname)" (inlined
// frames continue on indented lines); "Mappings", lines "  id: 0xstart/0xlimit/0xoffset file
// buildid [FN]".
// -symbolize=none: the profile as the agent wrote it. Without it pprof names unsymbolized
// addresses itself from the mapping's file when this (root) test process can read it, which hid
// every frame the agent failed to name (a Pyroscope server never does that).
RawProfile ReadWithPprof(const std::string& path) {
  std::string out, err;
  int rc = RunCommand(std::string(PS_PPROF_BIN) + " -raw -symbolize=none '" + path + "'", &out,
                      &err);
  INFO("pprof -raw " << path << ": " << err);
  REQUIRE(rc == 0);
  RawProfile p;
  uint64_t last_location = 0;
  enum { kHeader, kSampleTypes, kSamples, kLocations, kMappings } section = kHeader;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t.empty()) continue;
    if (t == "Samples:") { section = kSampleTypes; continue; }
    if (t == "Locations") { section = kLocations; continue; }
    if (t == "Mappings") { section = kMappings; continue; }
    switch (section) {
      case kHeader:
        if (absl::ConsumePrefix(&t, "PeriodType: ")) p.period_type = std::string(t);
        if (absl::ConsumePrefix(&t, "Period: ")) (void)absl::SimpleAtoi(t, &p.period);
        if (absl::ConsumePrefix(&t, "Time: ")) p.time_nanos = ParseGoTime(t);
        if (absl::ConsumePrefix(&t, "Duration: ")) {
          p.duration_text = std::string(t);
          p.duration_nanos = std::max<int64_t>(0, ParseGoDuration(p.duration_text));
        }
        break;
      case kSampleTypes:
        for (absl::string_view st : absl::StrSplit(t, ' ', absl::SkipEmpty())) {
          p.sample_types.emplace_back(absl::StripSuffix(st, "[dflt]"));
        }
        section = kSamples;
        break;
      case kSamples: {
        size_t colon = t.find(':');
        if (colon == absl::string_view::npos) break;
        absl::string_view head = t.substr(0, colon);
        int64_t v0;
        std::vector<absl::string_view> vals = absl::StrSplit(head, ' ', absl::SkipEmpty());
        if (!vals.empty() && absl::SimpleAtoi(vals[0], &v0)) {
          RawProfile::Sample s;
          for (auto v : vals) {
            int64_t x = 0;
            REQUIRE(absl::SimpleAtoi(v, &x));
            s.values.push_back(x);
          }
          for (auto id : absl::StrSplit(t.substr(colon + 1), ' ', absl::SkipEmpty())) {
            uint64_t x = 0;
            REQUIRE(absl::SimpleAtoi(id, &x));
            s.location_ids.push_back(x);
          }
          p.samples.push_back(std::move(s));
        } else if (!p.samples.empty()) {  // label line "key:[value] key2:[value2]"
          ParseLabelLine(t, &p.samples.back().labels);
        }
        break;
      }
      case kLocations: {
        size_t colon = t.find(": 0x");
        uint64_t id = 0;
        if (colon == absl::string_view::npos || !absl::SimpleAtoi(t.substr(0, colon), &id)) {
          // An inlined frame's continuation line: "fn file:line s=start".
          if (last_location != 0 && absl::StrContains(t, " s=")) {
            p.locations[last_location].lines.push_back(ParseLocationLine(t));
          }
          break;
        }
        last_location = id;
        absl::string_view rest = t.substr(colon + 2);
        size_t sp = rest.find(' ');
        rest = sp == absl::string_view::npos ? absl::string_view() : rest.substr(sp + 1);
        RawProfile::Location loc;
        if (absl::ConsumePrefix(&rest, "M=")) {
          size_t e = rest.find(' ');
          (void)absl::SimpleAtoi(rest.substr(0, e), &loc.mapping_id);
          rest = e == absl::string_view::npos ? absl::string_view() : rest.substr(e + 1);
        }
        if (absl::StrContains(rest, " s=")) {
          loc.lines.push_back(ParseLocationLine(rest));
          loc.function = loc.lines.back().function;
        }
        p.locations[id] = loc;
        break;
      }
      case kMappings: {
        size_t colon = t.find(": 0x");
        uint64_t id = 0;
        if (colon == absl::string_view::npos || !absl::SimpleAtoi(t.substr(0, colon), &id)) break;
        std::vector<absl::string_view> parts =
            absl::StrSplit(t.substr(colon + 2), ' ', absl::SkipEmpty());
        if (parts.size() >= 2) p.mapping_files[id] = std::string(parts[1]);
        break;
      }
    }
  }
  // pprof cut the duration short: take both times from the file, consistent with pprof's text.
  int64_t time_nanos = 0, duration_nanos = 0;
  REQUIRE(ReadProfileTimes(path, &time_nanos, &duration_nanos));
  INFO("pprof printed Duration: " << p.duration_text << ", the file holds " << duration_nanos
                                  << " ns; Time: " << p.time_nanos << ", the file " << time_nanos);
  CHECK(p.time_nanos == time_nanos);
  if (p.duration_nanos != 0) CHECK(p.duration_nanos == duration_nanos);
  p.time_nanos = time_nanos;
  p.duration_nanos = duration_nanos;
  return p;
}

std::vector<std::string> ProfileFiles(const std::string& dir, int pid, const std::string& prefix) {
  std::vector<std::string> out;
  namespace fs = std::filesystem;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::string name = e.path().filename();
    if (!absl::StartsWith(name, prefix) || !absl::EndsWith(name, ".pb.gz")) continue;
    if (pid != 0 && e.path().parent_path().parent_path().filename() != std::to_string(pid)) continue;
    out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

TempDir::TempDir() {
  std::string tmpl = std::filesystem::temp_directory_path() / "parascope_test_XXXXXX";
  REQUIRE(mkdtemp(tmpl.data()) != nullptr);
  path_ = tmpl;
}

TempDir::~TempDir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string Scrape(int port) {
  // In this process, not by running curl: each scrape would exec sh and curl (two new process
  // images with curl's ~40 libraries), which the agent under test reads and charges to its
  // new-image budget (UnwindService::kExecBurstNs): the overflow test's polling of /metrics
  // every 20 ms took a third of the new-image work of its run. Uncompressed, as curl asked
  // (newer cpp-httplib clients ask for brotli and gzip by default).
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(10);
  client.set_read_timeout(10);
  httplib::Result r = client.Get("/metrics", {{"Accept-Encoding", "identity"}});
  return r && r->status == 200 ? r->body : std::string();
}

namespace {
const std::regex& MetricsPortRe() {
  static const std::regex re("serving /metrics.*\\(port ([0-9]+)\\)");
  return re;
}
}  // namespace

int MetricsPort(const std::string& agent_stderr) {
  std::smatch m;
  return std::regex_search(agent_stderr, m, MetricsPortRe()) ? std::stoi(m[1]) : 0;
}

int AttachedMetricsPort(Child* agent) {
  std::string line;
  int port = 0;
  while (agent->ReadStderrLine(&line, 60)) {
    std::smatch m;
    if (std::regex_search(line, m, MetricsPortRe())) port = std::stoi(m[1]);
    if (absl::StrContains(line, "attached:")) return port;
  }
  return 0;  // exited or timed out before attaching
}

double MetricValue(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = -1;
      (void)absl::SimpleAtod(line.substr(series.size() + 1), &v);
      return v;
    }
  }
  return -1;
}

}  // namespace parascope::testing
