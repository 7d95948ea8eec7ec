// Root end-to-end tests of user-stack unwinding without frame pointers (issue: .eh_frame
// unwinding, acceptance 1-8): the agent binary against ground-truth workloads built with Debian's
// gcc/g++ -O2 and their defaults (test/workloads/, CMakeLists.txt), and against Debian's own
// stripped /usr/bin/python3; every profile is read back through the real pprof tool. Stacks are
// leaf first. Each test prints its measured figures (WARN), passing or not.
#include <elf.h>
#include <sys/wait.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

// The measured figures: shown on failure (INFO) and, so a passing run reports them too, as a
// warning.
#define FIGURES(msg) \
  INFO(msg);         \
  WARN(msg)

double Ratio(int64_t a, int64_t b) { return b == 0 ? 0.0 : double(a) / double(b); }
std::string Ms(int64_t ns) { return absl::StrCat(ns / 1000000.0, "ms"); }

std::string Workload(const std::string& name) { return std::string(PS_WORKLOAD_DIR) + "/" + name; }

// A workload run under the agent: the workload prints "ready <pid>", the agent starts with
// --pid=<pid> --output-dir=<dir> plus agent_args, the workload's phase starts once the agent
// logged "attached:" and must end (its "done ..." line) while the agent still runs.
struct Session {
  std::unique_ptr<Child> work;
  int pid = 0;
  std::map<std::string, std::string> done;
  std::string agent_log;

  int64_t Done(const std::string& key) const {
    auto it = done.find(key);
    INFO("workload done line lacks " << key);
    REQUIRE(it != done.end());
    int64_t v = 0;
    REQUIRE(absl::SimpleAtoi(it->second, &v));
    return v;
  }
  // Closes the workload's stdin (it exits) and checks its exit status.
  void Finish() {
    work->CloseStdin();
    CHECK(work->Wait(10) == 0);
  }
};

// With `metrics`, the agent serves /metrics on a free port, scraped into *metrics once the
// workload's phase is done (the agent still runs).
void RunSession(Session* s, const std::vector<std::string>& workload,
                const std::vector<std::string>& agent_args, const std::string& out_dir,
                int phase_timeout_s = 30, std::string* metrics = nullptr) {
  s->work = std::make_unique<Child>(workload);
  std::string line;
  INFO("workload: " << absl::StrJoin(workload, " "));
  REQUIRE(s->work->ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  s->pid = std::stoi(line.substr(6));

  std::vector<std::string> argv = {PS_AGENT_BIN, absl::StrCat("--pid=", s->pid),
                                   "--output-dir=" + out_dir};
  argv.insert(argv.end(), agent_args.begin(), agent_args.end());
  if (metrics != nullptr) argv.push_back("--http-address=127.0.0.1:0");
  Child agent(argv);
  INFO("agent: " << absl::StrJoin(argv, " "));
  bool attached = agent.WaitForStderr("attached:", &line);
  INFO("agent stderr so far:\n" << agent.stderr_text());
  REQUIRE(attached);
  int port = 0;
  if (metrics != nullptr) {
    port = MetricsPort(agent.stderr_text());
    REQUIRE(port > 0);
  }
  s->work->WriteStdin("go\n");
  bool done = s->work->ReadStdoutLine(&line, phase_timeout_s);
  INFO("workload stdout: " << s->work->stdout_text());
  REQUIRE(done);
  REQUIRE(absl::StartsWith(line, "done "));
  s->done = KeyValues(line);
  if (metrics != nullptr) *metrics = Scrape(port);
  // The ground truth is only comparable if the whole measured phase lay inside the agent's run.
  bool agent_ran_through_phase = agent.Running();
  int status = agent.Wait(120);
  s->agent_log = agent.stderr_text();
  INFO("agent stderr:\n" << s->agent_log);
  REQUIRE(agent_ran_through_phase);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
}

// CPU profiles at 999 Hz: about 5000 samples in a 5 s phase, so a share's sampling error
// (sqrt(p(1-p)/n), 0.006 at p = 0.75) is a fifth of the +-0.03 tolerance.
const std::vector<std::string> kCpuArgs = {"--profiles=cpu", "--sampling-frequency=999",
                                           "--duration=8s"};

// Every "<prefix>*.pb.gz" profile of pid, read with pprof; at least one.
std::vector<RawProfile> LoadProfiles(const std::string& dir, int pid, const std::string& prefix) {
  std::vector<RawProfile> out;
  for (const std::string& f : ProfileFiles(dir, pid, prefix)) out.push_back(ReadWithPprof(f));
  INFO("profiles " << prefix << "* of pid " << pid << " in " << dir);
  REQUIRE(!out.empty());
  return out;
}

// The addresses pprof -raw prints, which RawProfile does not keep: each Location's address and
// each Mapping's start, limit and file offset ("  id: 0xaddr M=m ..." and
// "  id: 0xstart/0xlimit/0xoffset file buildid [FN]"; github.com/google/pprof profile.go String()).
struct Addresses {
  struct Mapping {
    uint64_t start = 0, limit = 0, offset = 0;
    std::string file;
  };
  std::map<uint64_t, uint64_t> location_address;
  std::map<uint64_t, Mapping> mappings;
};

bool ParseHex(absl::string_view t, uint64_t* v) {
  return absl::ConsumePrefix(&t, "0x") && absl::SimpleHexAtoi(t, v);
}

Addresses ReadAddresses(const std::string& path) {
  std::string out, err;
  int rc = RunCommand(std::string(PS_PPROF_BIN) + " -raw -symbolize=none '" + path + "'", &out, &err);
  INFO("pprof -raw " << path << ": " << err);
  REQUIRE(rc == 0);
  Addresses a;
  enum { kOther, kLocations, kMappings } section = kOther;
  for (absl::string_view line : absl::StrSplit(out, '\n')) {
    absl::string_view t = absl::StripAsciiWhitespace(line);
    if (t == "Locations") {
      section = kLocations;
      continue;
    }
    if (t == "Mappings") {
      section = kMappings;
      continue;
    }
    if (section == kOther || t.empty()) continue;
    size_t colon = t.find(": 0x");
    uint64_t id = 0;
    if (colon == absl::string_view::npos || !absl::SimpleAtoi(t.substr(0, colon), &id)) continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(t.substr(colon + 2), ' ', absl::SkipEmpty());
    if (section == kLocations) {
      uint64_t addr = 0;
      if (ParseHex(parts[0], &addr)) a.location_address[id] = addr;
    } else {
      std::vector<absl::string_view> range = absl::StrSplit(parts[0], '/');
      Addresses::Mapping m;
      if (range.size() == 3 && ParseHex(range[0], &m.start) && ParseHex(range[1], &m.limit) &&
          ParseHex(range[2], &m.offset)) {
        if (parts.size() >= 2) m.file = std::string(parts[1]);
        a.mappings[id] = m;
      }
    }
  }
  return a;
}

// One profile with its addresses.
struct Profile {
  RawProfile p;
  Addresses a;
};

std::vector<Profile> LoadWithAddresses(const std::string& dir, int pid, const std::string& prefix) {
  std::vector<Profile> out;
  for (const std::string& f : ProfileFiles(dir, pid, prefix)) {
    out.push_back({ReadWithPprof(f), ReadAddresses(f)});
  }
  INFO("profiles " << prefix << "* of pid " << pid << " in " << dir);
  REQUIRE(!out.empty());
  return out;
}

// A frame of a sample, leaf first.
struct Frame {
  uint64_t location_id = 0;
  std::string function;  // "" if unsymbolized
  std::string file;      // the mapping's file; "" for frames without mapping
  bool kernel = false;
  bool synthetic = false;  // "[truncated]", "[unknown]", ...: no mapping, a bracketed name
};

std::vector<Frame> FramesOf(const RawProfile& p, const RawProfile::Sample& s) {
  std::vector<Frame> out;
  for (uint64_t id : s.location_ids) {
    Frame f;
    f.location_id = id;
    auto it = p.locations.find(id);
    if (it != p.locations.end()) {
      f.function = it->second.function;
      auto m = p.mapping_files.find(it->second.mapping_id);
      if (m != p.mapping_files.end()) f.file = m->second;
      f.synthetic = it->second.mapping_id == 0 && absl::StartsWith(f.function, "[");
    }
    f.kernel = p.IsKernelFrame(id);
    // A Location with inlined functions is one frame per Line (innermost first), as pprof
    // shows it.
    if (it != p.locations.end() && it->second.lines.size() > 1) {
      for (const auto& line : it->second.lines) {
        Frame g = f;
        g.function = line.function;
        out.push_back(g);
      }
      continue;
    }
    out.push_back(f);
  }
  return out;
}

// The user frames of a sample (no kernel frames, no synthetic frames), leaf first.
std::vector<Frame> UserFrames(const RawProfile& p, const RawProfile::Sample& s) {
  std::vector<Frame> out;
  for (Frame& f : FramesOf(p, s)) {
    if (!f.kernel && !f.synthetic) out.push_back(std::move(f));
  }
  return out;
}

bool InLibc(const Frame& f) { return absl::StrContains(f.file, "libc.so"); }
bool NotInLibc(const Frame& f) { return !InLibc(f); }

bool HasFunction(const std::vector<Frame>& frames, const std::string& fn) {
  for (const Frame& f : frames) {
    if (f.function == fn) return true;
  }
  return false;
}

int IndexOf(const std::vector<Frame>& frames, const std::function<bool(const Frame&)>& pred,
            size_t from = 0) {
  for (size_t i = from; i < frames.size(); ++i) {
    if (pred(frames[i])) return static_cast<int>(i);
  }
  return -1;
}

// "f1 <- f2 <- ..." (leaf first; unnamed frames as file basename + address) for diagnostics.
std::string Describe(const RawProfile& p, const RawProfile::Sample& s, size_t max_frames = 12) {
  std::vector<std::string> parts;
  std::vector<Frame> frames = FramesOf(p, s);
  for (size_t i = 0; i < frames.size() && i < max_frames; ++i) {
    const Frame& f = frames[i];
    std::string name = f.function.empty() ? "?" : f.function.substr(0, 60);
    if (f.function.empty() && !f.file.empty()) {
      name = absl::StrCat("?@", std::filesystem::path(f.file).filename().string());
    }
    parts.push_back(name);
  }
  if (frames.size() > max_frames) parts.push_back(absl::StrCat("... (", frames.size(), " frames)"));
  return absl::StrJoin(parts, " <- ");
}

// Counts samples (by a value) that satisfy `good` among those that satisfy `of`, and keeps a
// few examples of the others for the log.
struct Tally {
  int64_t of = 0, good = 0;
  std::map<std::string, int64_t> bad_examples;  // description -> weight

  void Add(const RawProfile& p, const RawProfile::Sample& s, int64_t weight, bool is_good) {
    of += weight;
    if (is_good) {
      good += weight;
    } else if (bad_examples.size() < 8 || bad_examples.count(Describe(p, s))) {
      bad_examples[Describe(p, s)] += weight;
    }
  }
  double share() const { return Ratio(good, of); }
  std::string BadExamples() const {
    std::string out;
    for (const auto& [d, w] : bad_examples) absl::StrAppend(&out, "\n    ", w, "x ", d);
    return out.empty() ? " none" : out;
  }
};

// ---- ELF helpers: file offsets to virtual addresses, and symbols of an unstripped file ----

// The PT_LOAD program headers of an ELF64 file (elf.h); empty if it cannot be read.
std::vector<Elf64_Phdr> LoadSegments(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  Elf64_Ehdr eh{};
  std::vector<Elf64_Phdr> out;
  if (!f.read(reinterpret_cast<char*>(&eh), sizeof(eh))) return out;
  if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64) return out;
  for (int i = 0; i < eh.e_phnum; ++i) {
    Elf64_Phdr ph{};
    f.seekg(eh.e_phoff + uint64_t(i) * eh.e_phentsize);
    if (!f.read(reinterpret_cast<char*>(&ph), sizeof(ph))) break;
    if (ph.p_type == PT_LOAD) out.push_back(ph);
  }
  return out;
}

// The virtual address (as in the ELF file's symbols) of file offset `off`; 0 if no segment
// holds it.
uint64_t FileOffsetToVaddr(const std::vector<Elf64_Phdr>& segments, uint64_t off) {
  for (const Elf64_Phdr& ph : segments) {
    if (off >= ph.p_offset && off < ph.p_offset + ph.p_filesz)
      return off - ph.p_offset + ph.p_vaddr;
  }
  return 0;
}

// A location's offset in its mapping's file; false without a mapping.
bool FileOffset(const Profile& pr, uint64_t location_id, uint64_t* off, std::string* file) {
  auto loc = pr.a.location_address.find(location_id);
  auto l = pr.p.locations.find(location_id);
  if (loc == pr.a.location_address.end() || l == pr.p.locations.end()) return false;
  auto m = pr.a.mappings.find(l->second.mapping_id);
  if (m == pr.a.mappings.end()) return false;
  *off = loc->second - m->second.start + m->second.offset;
  *file = m->second.file;
  return true;
}

// Function symbols of an ELF file with a .symtab, from `nm --defined-only -S` (binutils).
class Symbols {
 public:
  explicit Symbols(const std::string& path) : segments_(LoadSegments(path)) {
    std::string out, err;
    int rc = RunCommand("nm --defined-only -S '" + path + "'", &out, &err);
    INFO("nm " << path << ": " << err);
    REQUIRE(rc == 0);
    for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (f.size() != 4 || (f[2] != "t" && f[2] != "T" && f[2] != "W" && f[2] != "w")) continue;
      uint64_t addr, size;
      if (!absl::SimpleHexAtoi(f[0], &addr) || !absl::SimpleHexAtoi(f[1], &size)) continue;
      syms_[addr] = {addr + size, std::string(f[3])};
    }
    REQUIRE(!segments_.empty());
    REQUIRE(!syms_.empty());
  }
  // The function holding file offset `off` ("" if none).
  std::string At(uint64_t off) const {
    uint64_t va = FileOffsetToVaddr(segments_, off);
    auto it = syms_.upper_bound(va);
    if (it == syms_.begin()) return "";
    --it;
    return va < it->second.first ? it->second.second : "";
  }

 private:
  std::vector<Elf64_Phdr> segments_;
  std::map<uint64_t, std::pair<uint64_t, std::string>> syms_;  // start -> (end, name)
};

// File offset of libc's __restore_rt (x86-64: "mov $0xf,%rax; syscall", rt_sigreturn): the
// return address the kernel gives a signal handler (glibc's sigaction sets SA_RESTORER). It is
// not in libc's .dynsym, so a profile may show it unnamed; 0 if not found.
uint64_t RestoreRtOffset(const std::string& libc_path) {
  static const unsigned char kCode[] = {0x48, 0xc7, 0xc0, 0x0f, 0x00, 0x00, 0x00, 0x0f, 0x05};
  std::ifstream f(libc_path, std::ios::binary);
  std::string data((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  size_t at = data.find(std::string(reinterpret_cast<const char*>(kCode), sizeof(kCode)));
  return at == std::string::npos ? 0 : at;
}

}  // namespace

// Acceptance 1: caller shares of a shared leaf, and every stack reaching main.
TEST_CASE("unwind e2e: callers of a shared leaf get 0.75/0.25 and every stack reaches main",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("unwind_ratio"), "5"}, kCpuArgs, out.path());
  int64_t total = 0, with_a = 0, with_b = 0;
  Tally main_reached, shape;
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "process_cpu-")) {
    int cpu = p.ValueIndex("cpu");
    for (const auto& x : p.samples) {
      std::vector<Frame> u = UserFrames(p, x);
      int64_t v = x.values[cpu];
      total += v;
      if (HasFunction(u, "caller_a")) with_a += v;
      if (HasFunction(u, "caller_b")) with_b += v;
      main_reached.Add(p, x, x.values[0], HasFunction(u, "main"));
      // Diagnostic: the exact shape shared_leaf <- caller_x <- main.
      bool exact = u.size() >= 3 && u[0].function == "shared_leaf" &&
                   (u[1].function == "caller_a" || u[1].function == "caller_b") &&
                   u[2].function == "main";
      shape.Add(p, x, x.values[0], exact);
    }
  }
  FIGURES("unwind_ratio: " << main_reached.of << " samples, cpu " << Ms(total) << " (workload "
                           << Ms(s.Done("cpu_ns")) << "); inclusive caller_a "
                           << Ratio(with_a, total) << " caller_b " << Ratio(with_b, total)
                           << "; reaching main " << main_reached.share()
                           << "; shared_leaf <- caller_x <- main " << shape.share()
                           << "; stacks not reaching main:" << main_reached.BadExamples());
  REQUIRE(main_reached.of > 2000);
  CHECK(Ratio(with_a, total) == Approx(0.75).margin(0.03));
  CHECK(Ratio(with_b, total) == Approx(0.25).margin(0.03));
  CHECK(main_reached.share() >= 0.99);
  s.Finish();
}

// Tables on demand: a process that starts after the agent is unknown to it until its first
// sample asks for its tables (the ring buffer, bpf/unwind.bpf.h ps_unwind_notify); only the
// samples before they are loaded (milliseconds) unwind with frame pointers.
TEST_CASE("unwind e2e: a process started after the agent unwinds fully from its first samples",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Child agent({PS_AGENT_BIN, "--profiles=cpu", "--sampling-frequency=999", "--duration=9s",
               "--output-dir=" + out.path()});
  std::string line;
  REQUIRE(agent.WaitForStderr("attached:", &line));
  Child work({Workload("unwind_ratio"), "4"});
  REQUIRE(work.ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  const int pid = std::stoi(line.substr(6));
  work.WriteStdin("go\n");
  REQUIRE(work.ReadStdoutLine(&line, 30));
  REQUIRE(absl::StartsWith(line, "done "));
  const bool agent_ran_through_phase = agent.Running();
  int status = agent.Wait(120);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(agent_ran_through_phase);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  int64_t total = 0, with_a = 0;
  Tally main_reached;
  for (const RawProfile& p : LoadProfiles(out.path(), pid, "process_cpu-")) {
    int cpu = p.ValueIndex("cpu");
    for (const auto& x : p.samples) {
      std::vector<Frame> u = UserFrames(p, x);
      if (!HasFunction(u, "caller_a") && !HasFunction(u, "caller_b") &&
          !HasFunction(u, "shared_leaf")) {
        continue;  // start-up and idle samples
      }
      total += x.values[cpu];
      if (HasFunction(u, "caller_a")) with_a += x.values[cpu];
      main_reached.Add(p, x, x.values[0], HasFunction(u, "main"));
    }
  }
  FIGURES("unwind_ratio started after the agent: " << main_reached.of << " samples; caller_a "
                                                   << Ratio(with_a, total) << "; reaching main "
                                                   << main_reached.share() << "; not:"
                                                   << main_reached.BadExamples());
  REQUIRE(main_reached.of > 1500);
  CHECK(Ratio(with_a, total) == Approx(0.75).margin(0.03));
  CHECK(main_reached.share() >= 0.99);
  work.CloseStdin();
  CHECK(work.Wait(10) == 0);
}

// Acceptance 2: a comparator called back from libc's bsearch.
TEST_CASE("unwind e2e: a bsearch comparator's stacks run through libc to the caller and main",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("bsearch_loop"), "5"}, kCpuArgs, out.path());
  int64_t all = 0;
  Tally cmp;
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "process_cpu-")) {
    for (const auto& x : p.samples) {
      all += x.values[0];
      std::vector<Frame> u = UserFrames(p, x);
      if (u.empty() || u[0].function != "cmp_keys") continue;
      // cmp_keys <- libc frame(s) <- search_many <- main.
      int k = IndexOf(u, NotInLibc, 1);
      bool good = k >= 2 && u[k].function == "search_many" && size_t(k + 1) < u.size() &&
                  u[k + 1].function == "main";
      cmp.Add(p, x, x.values[0], good);
    }
  }
  FIGURES("bsearch_loop: " << all << " samples, " << cmp.of << " in cmp_keys (share "
                           << Ratio(cmp.of, all) << "); cmp_keys <- libc <- search_many <- main "
                           << cmp.share() << "; others:" << cmp.BadExamples());
  // The premise: most samples are the comparator's (its leaf frame needs no unwinding).
  REQUIRE(Ratio(cmp.of, all) >= 0.5);
  CHECK(cmp.share() >= 0.99);
  s.Finish();
}

// Acceptance 3: off-CPU stacks captured inside libc's poll and pthread_cond_wait.
TEST_CASE("unwind e2e: off-CPU splits 0.80/0.20 between callers of poll and pthread_cond_wait",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("offcpu_libc"), "5"}, {"--profiles=off_cpu,wall", "--duration=8s"},
             out.path());
  const std::string tid = std::to_string(s.Done("tid"));
  const int64_t truth_poll = s.Done("poll_ns"), truth_cond = s.Done("cond_ns");
  struct Split {
    int64_t poll = 0, cond = 0;
    Tally shape;  // sleeping intervals in wait_poll/wait_cond: libc frames <- wait_x <- main
  };
  std::map<std::string, Split> split;  // by profile type
  for (const std::string type : {"off_cpu", "wall"}) {
    Split& sp = split[type];
    for (const RawProfile& p : LoadProfiles(out.path(), s.pid, type + "-")) {
      int vi = p.ValueIndex(type);
      REQUIRE(vi >= 0);
      for (const auto& x : p.samples) {
        if (x.labels.count("tid") == 0 || x.labels.at("tid") != tid) continue;
        std::vector<Frame> u = UserFrames(p, x);
        bool in_poll = HasFunction(u, "wait_poll"), in_cond = HasFunction(u, "wait_cond");
        if (in_poll) sp.poll += x.values[vi];
        if (in_cond) sp.cond += x.values[vi];
        auto state = x.labels.find("state");
        if (!(in_poll || in_cond) || state == x.labels.end() || state->second != "sleeping") {
          continue;
        }
        int k = IndexOf(u, NotInLibc);
        bool good = k >= 1 && (u[k].function == "wait_poll" || u[k].function == "wait_cond") &&
                    size_t(k + 1) < u.size() && u[k + 1].function == "main";
        sp.shape.Add(p, x, x.values[vi], good);
      }
    }
  }
  const Split& off = split["off_cpu"];
  const Split& wall = split["wall"];
  FIGURES("offcpu_libc tid " << tid << " (" << s.Done("rounds") << " rounds; measured wait_poll "
                             << Ms(truth_poll) << " wait_cond " << Ms(truth_cond) << ", share "
                             << Ratio(truth_poll, truth_poll + truth_cond) << "): off_cpu "
                             << "wait_poll " << Ms(off.poll) << " wait_cond " << Ms(off.cond)
                             << " share " << Ratio(off.poll, off.poll + off.cond) << "/"
                             << Ratio(off.cond, off.poll + off.cond) << ", sleeping stacks libc <- "
                             << "wait_x <- main " << off.shape.share() << " of " << Ms(off.shape.of)
                             << "; wall wait_poll " << Ms(wall.poll) << " wait_cond "
                             << Ms(wall.cond) << " share "
                             << Ratio(wall.poll, wall.poll + wall.cond) << "/"
                             << Ratio(wall.cond, wall.poll + wall.cond) << ", shape "
                             << wall.shape.share()
                             << "; off_cpu stacks not matching:" << off.shape.BadExamples());
  REQUIRE(s.Done("rounds") >= 50);
  CHECK(Ratio(off.poll, off.poll + off.cond) == Approx(0.80).margin(0.03));
  CHECK(Ratio(off.cond, off.poll + off.cond) == Approx(0.20).margin(0.03));
  // Every such stack passes through libc and reaches main.
  CHECK(off.shape.of > 0);
  CHECK(off.shape.good == off.shape.of);
  // Nothing lost: the two functions hold the time the workload measured around them.
  CHECK(Ratio(off.poll + off.cond, truth_poll + truth_cond) == Approx(1.0).margin(0.05));
  // The wall profile agrees.
  CHECK(Ratio(wall.poll, wall.poll + wall.cond) == Approx(0.80).margin(0.03));
  CHECK(Ratio(wall.cond, wall.poll + wall.cond) == Approx(0.20).margin(0.03));
  CHECK(wall.shape.good == wall.shape.of);
  CHECK(Ratio(wall.poll + wall.cond, truth_poll + truth_cond) == Approx(1.0).margin(0.05));
  s.Finish();
}

// Issue 14: a thread's switch-outs reuse its last walk (bpf/abi.h ps_user_memo) only while a new
// walk would give the same stack. offcpu_memo blocks from one pc and sp through two callers,
// three times through via_a for each time through via_b: only stack words tell them apart.
TEST_CASE("unwind e2e: off-CPU stacks reused from the thread's last walk keep callers apart",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  std::string metrics;
  RunSession(&s, {Workload("offcpu_memo"), "5"}, {"--profiles=off_cpu", "--duration=8s"},
             out.path(), 30, &metrics);
  const std::string tid = std::to_string(s.Done("tid"));
  const int64_t truth_a = s.Done("a_ns"), truth_b = s.Done("b_ns");
  int64_t a = 0, b = 0;
  Tally shape;  // intervals in block_once: libc <- block_once <- via_a|via_b <- main
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "off_cpu-")) {
    int vi = p.ValueIndex("off_cpu");
    REQUIRE(vi >= 0);
    for (const auto& x : p.samples) {
      if (x.labels.count("tid") == 0 || x.labels.at("tid") != tid) continue;
      std::vector<Frame> u = UserFrames(p, x);
      if (!HasFunction(u, "block_once")) continue;
      const bool in_a = HasFunction(u, "via_a"), in_b = HasFunction(u, "via_b");
      if (in_a) a += x.values[vi];
      if (in_b) b += x.values[vi];
      int k = IndexOf(u, NotInLibc);
      bool good = k >= 1 && u[k].function == "block_once" && size_t(k + 2) < u.size() &&
                  (u[k + 1].function == "via_a") != (u[k + 1].function == "via_b") &&
                  (in_a != in_b) && u[k + 2].function == "main";
      shape.Add(p, x, x.values[vi], good);
    }
  }
  const double hits = MetricValue(metrics, "parascope_unwind_memo_hits_total");
  FIGURES("offcpu_memo tid " << tid << " (" << s.Done("rounds") << " rounds; measured via_a "
                             << Ms(truth_a) << " via_b " << Ms(truth_b) << ", share "
                             << Ratio(truth_a, truth_a + truth_b) << "): off_cpu via_a " << Ms(a)
                             << " via_b " << Ms(b) << " share " << Ratio(a, a + b)
                             << ", stacks libc <- block_once <- via_x <- main " << shape.share()
                             << " of " << Ms(shape.of) << "; memo hits " << hits
                             << "; stacks not matching:" << shape.BadExamples());
  REQUIRE(s.Done("rounds") >= 100);
  // The premise: both paths reach the switch-out from one sp.
  REQUIRE(s.Done("same_sp") == 1);
  CHECK(Ratio(a, a + b) == Approx(Ratio(truth_a, truth_a + truth_b)).margin(0.03));
  CHECK(Ratio(a, a + b) == Approx(0.75).margin(0.03));
  CHECK(shape.of > 0);
  CHECK(shape.good == shape.of);
  CHECK(Ratio(a + b, truth_a + truth_b) == Approx(1.0).margin(0.05));
  // The memo served: the second and third via_a of a round find the first one's walk (two per
  // round; at least half of them, whatever the window flips and the host's other threads did).
  CHECK(hits >= s.Done("rounds"));
  s.Finish();
}

// Acceptance 4: C++ at g++ -O2: a std::sort lambda comparator, and throw/catch.
TEST_CASE("unwind e2e: a std::sort lambda's stacks reach main through libstdc++ frames",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("cxx_sort"), "5"}, kCpuArgs, out.path());
  // libstdc++'s frames above the lambda are its sort algorithm (std::sort, std::__introsort_loop,
  // std::__insertion_sort, std::__adjust_heap): templates from libstdc++'s headers, compiled into
  // the workload, so they are named in its .symtab but mapped from the workload's file. The
  // exception path runs in libstdc++.so.6 (__cxa_throw, the personality routine) and
  // libgcc_s.so.1 (_Unwind_RaiseException): its share of the CPU must match the workload's own
  // measure, which it only does if those stacks unwind to throw_catch.
  auto is_libstdcxx = [](const Frame& f) {
    return absl::StartsWith(f.function, "std::") || absl::StartsWith(f.function, "void std::") ||
           absl::StartsWith(f.function, "__gnu_cxx::") || absl::StrContains(f.file, "libstdc++");
  };
  auto not_libstdcxx = [&](const Frame& f) { return !is_libstdcxx(f); };
  // The lambda itself (libstdc++'s frames name it too, in their template arguments).
  auto is_lambda = [&](const Frame& f) {
    return !is_libstdcxx(f) && absl::StrContains(f.function, "{lambda(");
  };
  auto is_sort_many = [](const Frame& f) { return absl::StartsWith(f.function, "sort_many("); };
  auto is_throw_catch = [](const Frame& f) { return absl::StartsWith(f.function, "throw_catch("); };
  auto in_runtime_so = [](const Frame& f) {
    return absl::StrContains(f.file, "libstdc++") || absl::StrContains(f.file, "libgcc_s");
  };
  int64_t total = 0, in_sort = 0, in_throw = 0, throw_via_so = 0;
  Tally lambda, main_reached;
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "process_cpu-")) {
    int cpu = p.ValueIndex("cpu");
    for (const auto& x : p.samples) {
      std::vector<Frame> u = UserFrames(p, x);
      int64_t v = x.values[cpu];
      total += v;
      bool thr = IndexOf(u, is_throw_catch) >= 0;
      if (IndexOf(u, is_sort_many) >= 0) in_sort += v;
      if (thr) in_throw += v;
      if (thr && IndexOf(u, in_runtime_so) >= 0) throw_via_so += v;
      main_reached.Add(p, x, x.values[0], HasFunction(u, "main"));
      if (u.empty() || !is_lambda(u[0])) continue;
      // lambda <- libstdc++ frame(s) <- sort_many <- main.
      int k = IndexOf(u, not_libstdcxx, 1);
      bool good =
          k >= 2 && is_sort_many(u[k]) && size_t(k + 1) < u.size() && u[k + 1].function == "main";
      lambda.Add(p, x, x.values[0], good);
    }
  }
  const int64_t sort_cpu = s.Done("sort_cpu_ns"), throw_cpu = s.Done("throw_cpu_ns");
  const int64_t cpu = s.Done("cpu_ns");
  FIGURES("cxx_sort: " << main_reached.of << " samples, " << lambda.of << " in the lambda; "
                       << "lambda <- libstdc++ <- sort_many <- main " << lambda.share()
                       << "; all samples reaching main " << main_reached.share()
                       << "; sort_many share " << Ratio(in_sort, total) << " (workload "
                       << Ratio(sort_cpu, cpu) << "), throw_catch share " << Ratio(in_throw, total)
                       << " (workload " << Ratio(throw_cpu, cpu)
                       << "; through libstdc++.so/libgcc_s.so frames "
                       << Ratio(throw_via_so, in_throw)
                       << "); lambda stacks not matching:" << lambda.BadExamples()
                       << "\nstacks not reaching main:" << main_reached.BadExamples());
  REQUIRE(lambda.of > 1000);
  CHECK(lambda.share() >= 0.99);
  CHECK(main_reached.share() >= 0.99);
  CHECK(Ratio(in_sort, total) == Approx(Ratio(sort_cpu, cpu)).margin(0.03));
  CHECK(Ratio(in_throw, total) == Approx(Ratio(throw_cpu, cpu)).margin(0.03));
  s.Finish();
}

// Acceptance 5: recursion 300 deep is cut at the stack-depth limit and says so.
TEST_CASE("unwind e2e: recursion 300 deep shows 127+ user frames ending in [truncated]",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("deep_recursion"), "4"},
             {"--profiles=cpu", "--sampling-frequency=499", "--duration=7s"}, out.path());
  Tally deep;
  std::map<size_t, int64_t> depths;  // user frames -> samples
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "process_cpu-")) {
    for (const auto& x : p.samples) {
      std::vector<Frame> all = FramesOf(p, x);
      std::vector<Frame> u = UserFrames(p, x);
      depths[u.size()] += x.values[0];
      // Everything from the first recurse frame on is recurse (an unbroken recursion), at least
      // 127 user frames, and the root-most frame is the synthetic "[truncated]".
      auto is_recurse = [](const Frame& f) { return f.function == "recurse"; };
      auto not_recurse = [](const Frame& f) { return f.function != "recurse"; };
      int first = IndexOf(u, is_recurse);
      bool unbroken = first >= 0 && IndexOf(u, not_recurse, first) < 0;
      bool good =
          u.size() >= 127 && unbroken && !all.empty() && all.back().function == "[truncated]";
      deep.Add(p, x, x.values[0], good);
    }
  }
  std::string hist;
  for (const auto& [d, n] : depths) absl::StrAppend(&hist, " ", d, ":", n);
  FIGURES("deep_recursion: " << deep.of << " samples; 127+ user frames of recurse ending in "
                             << "[truncated] " << deep.share() << "; user-frame depths (depth:"
                             << "samples)" << hist << "; others:" << deep.BadExamples());
  REQUIRE(deep.of > 500);
  CHECK(deep.share() >= 0.99);
  s.Finish();
}

// Acceptance 6: a CPU-bound signal handler unwinds through the signal frame.
TEST_CASE("unwind e2e: SIGALRM handler stacks reach the interrupted function via __restore_rt",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Session s;
  RunSession(&s, {Workload("sigalrm_spin"), "5"}, kCpuArgs, out.path());
  int64_t all = 0, next_is_restore_rt = 0;
  Tally handler;
  std::string libc_path;
  uint64_t restore_rt = 0;
  for (const Profile& pr : LoadWithAddresses(out.path(), s.pid, "process_cpu-")) {
    const RawProfile& p = pr.p;
    for (const auto& x : p.samples) {
      all += x.values[0];
      std::vector<Frame> u = UserFrames(p, x);
      int h = IndexOf(u, [](const Frame& f) { return f.function == "on_alarm"; });
      if (h < 0) continue;
      // on_alarm <- __restore_rt (named, or libc's code at its address) <- interrupted_work
      // <- main.
      auto is_restore_rt = [&](const Frame& f) {
        if (f.function == "__restore_rt") return true;
        uint64_t off = 0;
        std::string file;
        if (!InLibc(f) || !FileOffset(pr, f.location_id, &off, &file)) return false;
        if (libc_path != file) {
          libc_path = file;
          restore_rt = RestoreRtOffset(file);
        }
        // The handler's return address is __restore_rt itself; an unwinder may report it minus
        // one (inside the nop that glibc puts before it for that reason).
        return restore_rt != 0 && off + 1 >= restore_rt && off < restore_rt + 9;
      };
      bool via_restore_rt = size_t(h + 1) < u.size() && is_restore_rt(u[h + 1]);
      if (via_restore_rt) next_is_restore_rt += x.values[0];
      bool good = via_restore_rt && size_t(h + 3) < u.size() &&
                  u[h + 2].function == "interrupted_work" && u[h + 3].function == "main";
      handler.Add(p, x, x.values[0], good);
    }
  }
  FIGURES("sigalrm_spin: " << all << " samples, " << handler.of << " in on_alarm (share "
                           << Ratio(handler.of, all) << "; workload: " << s.Done("alarms")
                           << " alarms, " << Ms(s.Done("handler_ns")) << " in the handler of "
                           << Ms(s.Done("cpu_ns")) << " CPU); on_alarm <- __restore_rt "
                           << Ratio(next_is_restore_rt, handler.of)
                           << "; on_alarm <- __restore_rt <- "
                           << "interrupted_work <- main " << handler.share() << " (libc "
                           << libc_path << " __restore_rt at file offset 0x" << std::hex
                           << restore_rt << std::dec << "); others:" << handler.BadExamples());
  // The premise: the handler ran and took its share of the CPU (its leaf frame needs no
  // unwinding).
  REQUIRE(handler.of > 500);
  CHECK(handler.share() >= 0.99);
  s.Finish();
}

// Acceptance 7: the same code stripped of .symtab, debug info and .eh_frame_hdr unwinds alike.
TEST_CASE("unwind e2e: a binary stripped to .eh_frame unwinds like the unstripped one",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  const std::string plain = Workload("unwind_ratio");
  const std::string stripped = Workload("unwind_ratio-stripped");
  {
    // The premise: the stripped copy has no symbols or debug info beyond .dynsym, and keeps
    // .eh_frame.
    std::string sections;
    REQUIRE(RunCommand("readelf -SW '" + stripped + "'", &sections) == 0);
    INFO(sections);
    REQUIRE(absl::StrContains(sections, ".eh_frame"));
    REQUIRE(!absl::StrContains(sections, ".symtab"));
    REQUIRE(!absl::StrContains(sections, ".debug"));
  }
  // Both profiles' frames in the workload's file are named offline from the unstripped file's
  // .symtab (the code is byte for byte the same); other frames by file and offset, so stacks of
  // the two runs compare position by position.
  Symbols symbols(plain);
  struct Result {
    int64_t samples = 0, total = 0, with_a = 0, with_b = 0, reach_main = 0;
    int64_t agent_named = 0;                // frames in the workload's file that the agent named
    std::map<std::string, int64_t> shapes;  // stack (offline names) -> samples
    std::map<size_t, int64_t> depths;       // user frames -> samples
  };
  auto run = [&](const std::string& binary) {
    TempDir out;
    Session s;
    RunSession(&s, {binary, "5"}, kCpuArgs, out.path());
    Result r;
    for (const Profile& pr : LoadWithAddresses(out.path(), s.pid, "process_cpu-")) {
      const RawProfile& p = pr.p;
      int cpu = p.ValueIndex("cpu");
      for (const auto& x : p.samples) {
        std::vector<Frame> u = UserFrames(p, x);
        std::vector<std::string> names;
        for (size_t i = 0; i < u.size(); ++i) {
          uint64_t off = 0;
          std::string file;
          if (!FileOffset(pr, u[i].location_id, &off, &file)) {
            names.push_back("?");
          } else if (file == binary) {
            // A return address: the call is the byte before it.
            names.push_back(symbols.At(i == 0 ? off : off - 1));
            if (!u[i].function.empty()) r.agent_named += x.values[0];
          } else {
            names.push_back(absl::StrCat(std::filesystem::path(file).filename().string(), "+0x",
                                         absl::Hex(off)));
          }
        }
        int64_t v = x.values[cpu];
        r.samples += x.values[0];
        r.total += v;
        if (std::count(names.begin(), names.end(), "caller_a")) r.with_a += v;
        if (std::count(names.begin(), names.end(), "caller_b")) r.with_b += v;
        if (std::count(names.begin(), names.end(), "main")) r.reach_main += x.values[0];
        r.shapes[absl::StrJoin(names, " <- ")] += x.values[0];
        r.depths[u.size()] += x.values[0];
      }
    }
    s.Finish();
    return r;
  };
  Result a = run(plain);
  Result b = run(stripped);
  // Distributions compared by share of samples, key by key.
  auto max_gap = [](const std::map<std::string, int64_t>& x, int64_t nx,
                    const std::map<std::string, int64_t>& y, int64_t ny, std::string* worst) {
    std::set<std::string> keys;
    for (const auto& [k, v] : x) keys.insert(k);
    for (const auto& [k, v] : y) keys.insert(k);
    double gap = 0;
    for (const std::string& k : keys) {
      double sx = x.count(k) ? Ratio(x.at(k), nx) : 0, sy = y.count(k) ? Ratio(y.at(k), ny) : 0;
      if (std::abs(sx - sy) > gap) {
        gap = std::abs(sx - sy);
        *worst = absl::StrCat(k, " (", sx, " vs ", sy, ")");
      }
    }
    return gap;
  };
  auto by_string = [](const std::map<size_t, int64_t>& d) {
    std::map<std::string, int64_t> out;
    for (const auto& [k, v] : d) out[absl::StrCat(k)] = v;
    return out;
  };
  auto top = [](const Result& r) {
    std::vector<std::pair<int64_t, std::string>> v;
    for (const auto& [k, n] : r.shapes) v.push_back({n, k});
    std::sort(v.rbegin(), v.rend());
    std::string out;
    for (size_t i = 0; i < v.size() && i < 4; ++i) {
      absl::StrAppend(&out, "\n    ", Ratio(v[i].first, r.samples), " ", v[i].second);
    }
    return out;
  };
  std::string worst_shape, worst_depth;
  double shape_gap = max_gap(a.shapes, a.samples, b.shapes, b.samples, &worst_shape);
  double depth_gap =
      max_gap(by_string(a.depths), a.samples, by_string(b.depths), b.samples, &worst_depth);
  FIGURES("unstripped: " << a.samples << " samples, caller_a " << Ratio(a.with_a, a.total)
                         << " caller_b " << Ratio(a.with_b, a.total) << " reach main "
                         << Ratio(a.reach_main, a.samples) << ", top stacks:" << top(a)
                         << "\nstripped: " << b.samples << " samples, caller_a "
                         << Ratio(b.with_a, b.total) << " caller_b " << Ratio(b.with_b, b.total)
                         << " reach main " << Ratio(b.reach_main, b.samples)
                         << ", frames the agent named in the stripped file " << b.agent_named
                         << ", top stacks:" << top(b) << "\nlargest share gap: stacks " << shape_gap
                         << " (" << worst_shape << "), depths " << depth_gap << " (" << worst_depth
                         << ")");
  REQUIRE(a.samples > 2000);
  REQUIRE(b.samples > 2000);
  // The stripped file's own frames show as addresses (it has no defined .dynsym functions).
  CHECK(b.agent_named == 0);
  for (const Result* r : {&a, &b}) {
    CHECK(Ratio(r->with_a, r->total) == Approx(0.75).margin(0.03));
    CHECK(Ratio(r->with_b, r->total) == Approx(0.25).margin(0.03));
    CHECK(Ratio(r->reach_main, r->samples) >= 0.99);
  }
  // Same callers in the same positions, same depths.
  CHECK(shape_gap <= 0.03);
  CHECK(depth_gap <= 0.03);
}

// Acceptance 8: Debian's python3 (stripped) running Python code.
//
// Debian's /usr/bin/python3.11 has no .symtab; its .dynsym names the exported C API
// (_PyEval_EvalFrameDefault, Py_RunMain, Py_BytesMain, ...) but not main, and main is
// `jmp Py_BytesMain` (a sibling call), so main is never on the stack: Py_BytesMain's caller is
// libc's __libc_start_call_main (not in libc's .dynsym: unnamed) called by __libc_start_main
// (named). So "the native stack reaches the interpreter's main" is: Py_BytesMain, then directly
// a libc frame, then __libc_start_main.
TEST_CASE("unwind e2e: Debian's stripped python3 native stacks reach the interpreter's entry",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  const std::string python = "/usr/bin/python3";
  if (!std::filesystem::exists(python)) {
    FAIL("needs Debian's python3 (" << python << ")");
  }
  TempDir out;
  Session s;
  RunSession(&s, {python, Workload("python_loop.py"), "5"}, kCpuArgs, out.path());
  Tally entry;
  int64_t eval = 0;
  for (const RawProfile& p : LoadProfiles(out.path(), s.pid, "process_cpu-")) {
    for (const auto& x : p.samples) {
      std::vector<Frame> u = UserFrames(p, x);
      if (HasFunction(u, "_PyEval_EvalFrameDefault")) eval += x.values[0];
      int m = IndexOf(u, [](const Frame& f) { return f.function == "Py_BytesMain"; });
      bool good =
          m >= 0 && size_t(m + 1) < u.size() && InLibc(u[m + 1]) &&
          IndexOf(
              u, [](const Frame& f) { return f.function == "__libc_start_main" && InLibc(f); },
              m + 1) > m;
      entry.Add(p, x, x.values[0], good);
    }
  }
  FIGURES("python3: " << entry.of << " samples; Py_BytesMain <- libc <- __libc_start_main "
                      << entry.share() << "; with _PyEval_EvalFrameDefault "
                      << Ratio(eval, entry.of) << "; others:" << entry.BadExamples());
  REQUIRE(entry.of > 2000);
  CHECK(entry.share() >= 0.99);
  s.Finish();
}

}  // namespace parascope::testing
