// Root end-to-end tests of process lifecycles: the agent runs system-wide while the lifecycle
// workload (test/workloads/lifecycle.c) starts short-lived children, execs into a second image,
// or two programs run one after the other under one forced pid. Profiles land in
// DIR/<pid>/<start ticks>.<exec id>/ (one directory per process image) and are read back through
// the real pprof tool. Each test prints its measured figures on stdout, passing or not.
#include <bpf/libbpf.h>
#include <signal.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "bpf/abi.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

// The measured figures: shown on failure (INFO) and printed on stdout, so a passing run reports
// them too.
#define FIGURES(msg) \
  INFO(msg);         \
  std::cout << msg << std::endl

constexpr int kHz = 499;

double Ratio(int64_t a, int64_t b) { return b == 0 ? 0.0 : double(a) / double(b); }

std::string Lifecycle() { return std::string(PS_WORKLOAD_DIR) + "/lifecycle"; }

// The agent, system-wide, CPU profiles only, without an HTTP server (no port to clash over);
// --duration is a safety net: Stop() ends it with SIGINT, which flushes the open window.
// These tests find each process in its own directory, so the window's budget of new process
// directories is lifted: at its default (256) the short-lived test's 100 children, their
// pre-exec images and the host's other sampled processes came to 244 directories in a 30 s
// window here, and with two more busy processes on the host 43 exited children went to the
// shared overflow files instead (that budget has its own test below).
class Agent {
 public:
  Agent(const std::string& out_dir, const std::string& collect_interval) {
    argv_ = {PS_AGENT_BIN,
             "--profiles=cpu",
             absl::StrCat("--sampling-frequency=", kHz),
             "--collect-interval=" + collect_interval,
             "--duration=300s",
             "--http-address=",
             "--output-max-new-processes=1000000",
             "--output-dir=" + out_dir};
    // PS_TEST_AGENT_STDERR=FILE: the agent logs at debug level and Stop() writes its stderr
    // there, appended (for chasing a rare failure; without it the agent logs at its default
    // level).
    if (const char* f = getenv("PS_TEST_AGENT_STDERR"); f != nullptr && *f != 0) {
      stderr_file_ = f;
      argv_.push_back("--log-level=debug");
    }
    child_ = std::make_unique<Child>(argv_);
    std::string line;
    bool attached = child_->WaitForStderr("attached:", &line);
    INFO("agent: " << absl::StrJoin(argv_, " ") << "\nagent stderr so far:\n"
                   << child_->stderr_text());
    REQUIRE(attached);
  }
  // SIGINT, then the exit status must be 0 with the final "stopped:" line.
  void Stop() {
    REQUIRE(child_->Running());
    kill(child_->pid(), SIGINT);
    int status = child_->Wait(120);
    if (!stderr_file_.empty()) {
      std::ofstream(stderr_file_, std::ios::app)
          << "==== " << Catch::getResultCapture().getCurrentTestName() << "\n"
          << child_->stderr_text();
    }
    INFO("agent stderr:\n" << child_->stderr_text());
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    REQUIRE(absl::StrContains(child_->stderr_text(), "stopped:"));
  }
  // The agent's final "stopped: ..." line (its counters), "" before Stop().
  std::string StoppedLine() const {
    const std::string& log = child_->stderr_text();
    size_t at = log.rfind("stopped:");
    if (at == std::string::npos) return "";
    size_t end = log.find('\n', at);
    return log.substr(at, end == std::string::npos ? std::string::npos : end - at);
  }

 private:
  std::vector<std::string> argv_;
  std::string stderr_file_;
  std::unique_ptr<Child> child_;
};

// A frame is a user frame if it is neither a kernel frame nor a synthetic one ("[unknown]",
// "[incomplete: ...]": no mapping and a bracketed name). Unsymbolized user frames count.
bool IsUserFrame(const RawProfile& p, uint64_t id) {
  if (p.IsKernelFrame(id)) return false;
  auto it = p.locations.find(id);
  if (it == p.locations.end()) return true;
  return !(it->second.mapping_id == 0 && absl::StartsWith(it->second.function, "["));
}

// The user frames of a sample, leaf first, as "f1 <- f2 <- ..." ("?" for unnamed frames, with
// the mapping's file name when there is one), then the synthetic root if any.
std::string DescribeUser(const RawProfile& p, const RawProfile::Sample& s) {
  std::vector<std::string> parts;
  for (uint64_t id : s.location_ids) {
    if (p.IsKernelFrame(id)) continue;
    auto it = p.locations.find(id);
    std::string name = it == p.locations.end() ? "" : it->second.function.substr(0, 50);
    if (name.empty()) {
      name = "?";
      if (it != p.locations.end()) {
        auto m = p.mapping_files.find(it->second.mapping_id);
        if (m != p.mapping_files.end()) {
          absl::StrAppend(&name, "@", std::filesystem::path(m->second).filename().string());
        }
      }
    }
    parts.push_back(name);
  }
  return absl::StrJoin(parts, " <- ");
}

// The `n` heaviest entries of `m`, one a line.
std::string Top(const std::map<std::string, int64_t>& m, size_t n = 12) {
  std::vector<std::pair<int64_t, std::string>> v;
  for (const auto& [d, w] : m) v.push_back({-w, d});
  std::sort(v.begin(), v.end());
  std::string out;
  for (size_t i = 0; i < v.size() && i < n; ++i) {
    absl::StrAppend(&out, "\n    ", -v[i].first, "x ", v[i].second);
  }
  if (v.size() > n) absl::StrAppend(&out, "\n    ... (", v.size() - n, " more)");
  return out.empty() ? " none" : out;
}

// One process image: the profiles in one DIR/<pid>/<start ticks>.<exec id>/ directory. Only
// samples with at least one user frame are classified.
struct Image {
  std::string dir;  // "<start ticks>.<exec id>"
  int64_t samples = 0;
  int64_t user_samples = 0;             // samples with at least one user frame
  std::map<std::string, int64_t> fn;    // function -> user samples with it among their frames
                                        // (inlined ones included)
  std::set<std::string> mapping_files;  // every Mapping's file
  int64_t to_start = 0;                 // user samples whose stack reaches _start
  // Samples that are not the program's own work by construction: the dynamic loader starting
  // the image (its outermost user frame in ld-linux*, i.e. before ld.so jumps to _start), or
  // the kernel inside execve (a kernel frame named *execve*: until execve returns, the user
  // registers are the replaced image's, whatever the exec id already says), or the kernel
  // tearing the process down in exit_group (a kernel frame named *exit_group* or do_exit: the
  // program's code has ended; its user stack is exit's).
  int64_t startup = 0;
  int64_t in_execve = 0;
  int64_t in_exit = 0;
  // The C runtime around main: __libc_start_main setting up before main, exit()'s handlers
  // after main returned. Not the program's code, like ld.so's start-up. Counted here only for a
  // complete stack (its _start in the program's own file) with no main frame, whose every other
  // frame is in libc or ld.so, or is one of the program's crt functions (IsCrtFunction), and
  // none in the vDSO or a clock read (which only the burn's clock checks call). A stack the
  // walker cut short is never counted here; one it completed wrongly through a frame-pointer
  // guess could be, only from inside libc or ld.so.
  int64_t runtime = 0;
  std::map<std::string, int64_t> runtime_stacks;  // those samples, by DescribeUser
  // Of the user samples with `focus` among their frames: those whose every user frame lies in
  // a Mapping (the image snapshot knew the address), and those whose stack reaches _start.
  int64_t focus_mapped = 0;
  int64_t focus_to_start = 0;
  // The rest (not `focus`, start-up, execve, the C runtime or exit_group), by DescribeUser.
  std::map<std::string, int64_t> others;
  // Samples with `focus` and a user frame outside every Mapping, by DescribeUser.
  std::map<std::string, int64_t> focus_unmapped;
  std::map<std::string, int64_t> focus_cut;  // focus samples not reaching _start, by stack

  int64_t With(const std::string& f) const {
    auto it = fn.find(f);
    return it == fn.end() ? 0 : it->second;
  }
  bool Has(const std::string& f) const { return With(f) > 0; }
  // User samples that the program's own code ran: all but start-up, execve, the C runtime
  // around main and teardown.
  int64_t program_samples() const { return user_samples - startup - in_execve - in_exit - runtime; }
};

bool IsLoader(const std::string& file) {
  return absl::StartsWith(std::filesystem::path(file).filename().string(), "ld-linux");
}

// Functions the C runtime links into every gcc-built program (crt1.o, crti.o, crtbegin.o):
// the entry point, and what runs constructors and destructors around main.
bool IsCrtFunction(const std::string& fn) {
  static const std::set<std::string> kCrt = {"_start",
                                             "_init",
                                             "_fini",
                                             "__do_global_dtors_aux",
                                             "frame_dummy",
                                             "register_tm_clones",
                                             "deregister_tm_clones"};
  return kCrt.count(fn) > 0;
}

// Every image of pid (its process_cpu-* profiles, grouped by directory), classified against
// `focus` (a function name; "" leaves the focus fields empty).
std::vector<Image> Images(const std::string& out_dir, int pid, const std::string& focus = "") {
  std::map<std::string, Image> by_dir;
  for (const std::string& f : ProfileFiles(out_dir, pid, "process_cpu-")) {
    std::string dir = std::filesystem::path(f).parent_path().filename();
    Image& im = by_dir[dir];
    im.dir = dir;
    RawProfile p = ReadWithPprof(f);
    int n = p.ValueIndex("samples");
    REQUIRE(n >= 0);
    for (const auto& [id, file] : p.mapping_files) im.mapping_files.insert(file);
    for (const auto& s : p.samples) {
      int64_t v = s.values[n];
      im.samples += v;
      std::set<std::string> names;
      bool user = false, all_mapped = true, execve = false, exiting = false;
      // Every user frame in the C runtime (libc's, ld.so's, or the program's crt code), and
      // _start in the program's own file (so a file name that fails to match fails closed).
      bool crt_only = true, start_in_program = false;
      std::string outermost_file;
      for (uint64_t id : s.location_ids) {
        auto it = p.locations.find(id);
        const std::string fn = it == p.locations.end() ? "" : it->second.function;
        if (p.IsKernelFrame(id)) {
          if (absl::StrContains(fn, "execve")) execve = true;
          if (absl::StrContains(fn, "exit_group") || fn == "do_exit") exiting = true;
          continue;
        }
        if (!IsUserFrame(p, id)) continue;
        user = true;
        if (!fn.empty()) names.insert(fn);
        if (it != p.locations.end()) {
          for (const RawProfile::Line& l : it->second.lines) {
            if (!l.function.empty()) names.insert(l.function);  // inlined ones too
          }
        }
        auto m = it == p.locations.end() ? p.mapping_files.end()
                                         : p.mapping_files.find(it->second.mapping_id);
        if (m == p.mapping_files.end()) all_mapped = false;
        outermost_file = m == p.mapping_files.end() ? "" : m->second;
        const std::string file =
            m == p.mapping_files.end() ? "" : std::filesystem::path(m->second).filename().string();
        const bool own_file =
            !file.empty() && file == std::filesystem::path(Lifecycle()).filename().string();
        if (own_file && fn == "_start") start_in_program = true;
        const bool runtime_file = absl::StartsWith(file, "libc.so") || IsLoader(file);
        if (own_file ? !IsCrtFunction(fn)
                     : !runtime_file || absl::StrContains(fn, "clock_gettime")) {
          crt_only = false;
        }
      }
      if (!user) continue;
      im.user_samples += v;
      if (names.count("_start")) im.to_start += v;
      for (const std::string& name : names) im.fn[name] += v;
      if (focus.empty()) continue;
      if (names.count(focus)) {
        if (all_mapped) {
          im.focus_mapped += v;
        } else {
          im.focus_unmapped[DescribeUser(p, s)] += v;
        }
        if (names.count("_start")) {
          im.focus_to_start += v;
        } else {
          im.focus_cut[DescribeUser(p, s)] += v;
        }
      } else if (execve) {
        im.in_execve += v;
      } else if (exiting) {
        im.in_exit += v;
      } else if (IsLoader(outermost_file)) {
        im.startup += v;
      } else if (crt_only && start_in_program && !names.count("main")) {
        im.runtime += v;
        im.runtime_stacks[DescribeUser(p, s)] += v;
      } else {
        im.others[DescribeUser(p, s)] += v;
      }
    }
  }
  std::vector<Image> out;
  for (auto& [d, im] : by_dir) out.push_back(std::move(im));
  return out;
}

std::string Summary(const Image& im) {
  std::vector<std::string> fns;
  for (const auto& [f, v] : im.fn) {
    if (absl::StrContains(f, "burn")) fns.push_back(absl::StrCat(f, "=", v));
  }
  return absl::StrCat(im.dir, ": ", im.samples, " samples, ", im.user_samples,
                      " with user frames (", im.to_start, " reaching _start)",
                      fns.empty() ? "" : ", ", absl::StrJoin(fns, " "));
}

// The integer a /proc file starts with, 0 if unreadable.
int ReadInt(const std::string& path) {
  std::ifstream f(path);
  int v = 0;
  f >> v;
  return v;
}

// fork + execv(argv) with the child's pid forced to `pid` through ns_last_pid
// (Documentation/admin-guide/sysctl/kernel.rst: the last pid allocated in the current pid
// namespace; the next fork takes the next free one). Another process forking in between takes
// the pid first: then our child exits at once, unexec'd, and once the other one is gone the
// attempt is repeated. Returns once the child with `pid` exited with status 0.
void RunWithPid(int pid, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string proc = "/proc/" + std::to_string(pid);
  const std::string last = std::to_string(pid - 1);
  INFO(absl::StrJoin(argv, " ") << " as pid " << pid);
  for (int attempt = 0; attempt < 20; ++attempt) {
    for (int i = 0; i < 200 && std::filesystem::exists(proc); ++i) usleep(10000);
    REQUIRE(!std::filesystem::exists(proc));
    {
      std::ofstream f("/proc/sys/kernel/ns_last_pid");
      f << last;
      f.flush();
      REQUIRE(f.good());
    }
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (getpid() != pid) _exit(99);  // not the pid wanted: leave before exec
      execv(args[0], args.data());
      _exit(127);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    if (child != pid) {
      REQUIRE((WIFEXITED(status) && WEXITSTATUS(status) == 99));
      continue;
    }
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    return;
  }
  FAIL("could not fork with pid " << pid << " in 20 attempts");
}

// Like RunWithPid, but returns as soon as the child with `pid` runs (the caller reaps it).
void SpawnWithPid(int pid, const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  const std::string proc = "/proc/" + std::to_string(pid);
  INFO(absl::StrJoin(argv, " ") << " as pid " << pid);
  for (int attempt = 0; attempt < 20; ++attempt) {
    for (int i = 0; i < 200 && std::filesystem::exists(proc); ++i) usleep(10000);
    REQUIRE(!std::filesystem::exists(proc));
    {
      std::ofstream f("/proc/sys/kernel/ns_last_pid");
      f << pid - 1;
      f.flush();
      REQUIRE(f.good());
    }
    pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      if (getpid() != pid) _exit(99);
      execv(args[0], args.data());
      _exit(127);
    }
    if (child == pid) return;
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
  }
  FAIL("could not fork with pid " << pid << " in 20 attempts");
}

// A pid nobody uses now and the system will not reach on its own for a while.
int FreePid() {
  const int pid_max = ReadInt("/proc/sys/kernel/pid_max");
  REQUIRE(pid_max > 2000);
  int pid = ReadInt("/proc/sys/kernel/ns_last_pid") + 1000;
  if (pid >= pid_max) pid = 1000;
  while (std::filesystem::exists("/proc/" + std::to_string(pid))) ++pid;
  return pid;
}

}  // namespace

// A child that lives ~20 ms: its mappings must be known when the agent symbolizes its samples
// at the end of the window, long after it exited (the agent snapshots them at its first
// sample). 100 children, 20 ms of CPU each at 499 Hz: ~998 samples in short_lived_burn. Each
// child's burning image is one directory; >= 99% of its own run's samples carry
// short_lived_burn; >= 99% of those have every user frame inside a Mapping (libc's included).
TEST_CASE("lifecycle e2e: short-lived processes are symbolized", "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Agent agent(out.path(), "30s");
  constexpr int kChildren = 100, kMs = 20;
  Child work({Lifecycle(), "spawn", std::to_string(kChildren), std::to_string(kMs)});
  std::vector<int> pids;
  std::string line;
  while (work.ReadStdoutLine(&line, 60) && line != "done") {
    int pid = 0;
    REQUIRE(absl::SimpleAtoi(line, &pid));
    pids.push_back(pid);
  }
  INFO("workload stdout:\n" << work.stdout_text() << "\nstderr:\n" << work.stderr_text());
  REQUIRE(line == "done");
  REQUIRE(work.Wait(30) == 0);
  REQUIRE(pids.size() == size_t(kChildren));
  agent.Stop();

  // Per child: the image that burned (the one with short_lived_burn) must be exactly one
  // directory. A forked child runs the spawning image for a moment before its exec (the fork's
  // return, binding execv lazily, execve itself): that image's directory, if sampled at all,
  // is another one, with other work than short_lived_burn by construction.
  int64_t burn = 0;           // user samples with short_lived_burn, all children
  int64_t burn_mapped = 0;    // ... whose every user frame lies in a Mapping
  int64_t burn_to_start = 0;  // ... whose stack reaches _start
  int64_t program = 0;        // user samples of the burning images: their program_samples()
  // User samples of the burning images: ld.so start-up, execve, exit_group teardown.
  int64_t startup = 0, in_execve = 0, in_exit = 0;
  int64_t runtime = 0;                 // ... the C runtime before main and after it returned
  int64_t all_user = 0;                // user samples of every image of the children
  int64_t other_user = 0;              // user samples of the other images (pre-exec ones)
  int without_dir = 0, extra_dirs = 0;
  std::vector<std::string> problems;  // children without exactly one burning image
  std::map<std::string, int64_t> others, unmapped, other_images, cut, runtime_stacks;
  for (int pid : pids) {
    std::vector<Image> images = Images(out.path(), pid, "short_lived_burn");
    int burning = 0;
    for (const Image& im : images) {
      all_user += im.user_samples;
      if (!im.Has("short_lived_burn")) {
        other_user += im.user_samples;
        for (const auto& [d, v] : im.others) other_images[absl::StrCat(im.dir, ": ", d)] += v;
        continue;
      }
      ++burning;
      burn += im.With("short_lived_burn");
      burn_mapped += im.focus_mapped;
      burn_to_start += im.focus_to_start;
      program += im.program_samples();
      startup += im.startup;
      in_execve += im.in_execve;
      in_exit += im.in_exit;
      runtime += im.runtime;
      for (const auto& [d, v] : im.runtime_stacks) runtime_stacks[d] += v;
      for (const auto& [d, v] : im.others) others[d] += v;
      for (const auto& [d, v] : im.focus_unmapped) unmapped[d] += v;
      for (const auto& [d, v] : im.focus_cut) cut[d] += v;
    }
    if (images.empty()) ++without_dir;
    if (images.size() > 1) ++extra_dirs;
    if (burning != 1) {
      std::vector<std::string> s;
      for (const Image& im : images) s.push_back(Summary(im));
      problems.push_back(absl::StrCat("pid ", pid, ": ", burning, " burning images [",
                                      absl::StrJoin(s, "; "), "]"));
    }
  }
  const int64_t expected = int64_t(kChildren) * kMs * kHz / 1000;
  FIGURES("short-lived: "
          << pids.size() << " children (" << without_dir << " without a profile, " << extra_dirs
          << " with a pre-exec image directory too)"
          << "\n  short_lived_burn in " << burn << " of " << program
          << " user samples of the burning images = " << Ratio(burn, program) << " (expected ~"
          << expected << " samples; not counted: " << startup << " in ld.so start-up, " << in_execve
          << " inside execve, " << runtime << " in the C runtime around main, " << in_exit
          << " inside exit_group)"
          << "\n  over every user sample of the children: " << burn << "/" << all_user << " = "
          << Ratio(burn, all_user) << " (" << other_user << " in images without it)"
          << "\n  short_lived_burn samples with every user frame in a Mapping: " << burn_mapped
          << "/" << burn << " = " << Ratio(burn_mapped, burn) << "; reaching _start: "
          << burn_to_start << "/" << burn << " = " << Ratio(burn_to_start, burn)
          << "\n  program samples without short_lived_burn:" << Top(others)
          << "\n  samples in the C runtime around main (not counted):" << Top(runtime_stacks, 6)
          << "\n  short_lived_burn samples with unmapped frames:" << Top(unmapped, 4)
          << "\n  short_lived_burn samples not reaching _start:" << Top(cut, 4)
          << "\n  samples of the other images (start-up, execve, the C runtime and "
             "exit_group left out):"
          << Top(other_images, 8) << "\n  children without exactly one burning image: "
          << (problems.empty() ? "none" : absl::StrJoin(problems, "\n    "))
          << "\n  agent: " << agent.StoppedLine());
  CHECK(problems.empty());
  REQUIRE(burn >= expected / 2);
  // Not over every user sample of the children: ld.so starting a 20 ms process, execve, the
  // C runtime around main, the kernel tearing it down in exit_group and the pre-exec image take
  // 3-5% of them here (measured), and none of that is short_lived_burn.
  // What remains is the program's own run: main, which makes no libc call before the burn
  // (test/workloads/lifecycle.c), and what it calls. The issue asks 0.99. The C runtime was
  // counted in it until the clean-clone CI of ce5b676: with 200 other processes waking 2000
  // times a second on the host, __libc_start_main's set-up (__cxa_atexit, _start) and exit()'s
  // handlers took 13 of 1003 samples (0.987), every stack complete and every frame named; 3-5
  // on a quiet host. Samples in libc or the vDSO need libc's unwind table to reach
  // short_lived_burn, and libc is mapped by ld.so after the exec event: the exec snapshot is
  // taken again 1-4 ms later (UnwindService's follow-ups) so that libc's table is in place
  // before most first samples (0.986-0.996 without them, 0.999 with).
  CHECK(Ratio(burn, program) >= 0.99);
  // The C runtime class holds complete stacks outside main, through libc and ld.so only: a burn
  // sample unwound right has main and short_lived_burn, and one whose walk a frame-pointer
  // guess completed wrongly is there only if the guess began inside libc or ld.so outside a
  // clock read (Image::runtime). The class stays small: 0.2-0.4% of the burn on a quiet host,
  // 1.3% with the 200 processes above (measured); its stacks are printed above.
  CHECK(Ratio(runtime, burn) <= 0.02);
  // Symbolized means placed: the image snapshot holds every mapping the stacks went through
  // (libc's included, which ld.so maps after the exec).
  CHECK(Ratio(burn_mapped, burn) >= 0.99);
  // Whole stacks: a child's first samples come before the daemon has loaded its mapping list
  // (the exec hook deletes the old one) or libc's place in it; the walker then finds the
  // tables through the pcs' vmas (bpf_find_vma, Linux 5.17+). One lookup per sample, so the
  // program's text is found at exec and each vma found is kept per process (ps_vma_cache):
  // without that cache 0.999 here alone but 0.88-0.965 in 3 of 32 runs right after the python3
  // test, and 0.984 on a fresh machine (a walk through a second unlisted file stopped there);
  // with it 0.989-1.0 in 17 runs, 0.999-1.0 once a vma gets a free slot first (measured).
  // 0.95-0.96 without bpf_find_vma (stacks stop in libc).
  if (libbpf_probe_bpf_helper(BPF_PROG_TYPE_PERF_EVENT, BPF_FUNC_find_vma, nullptr) == 1) {
    CHECK(Ratio(burn_to_start, burn) >= 0.98);
  }
}

// Process churn past --output-max-new-processes (export/file_exporter.h, "Process churn"): a
// window makes at most that many process directories; the children that had exited when their
// window was written share DIR/overflow/ files instead, each sample labelled with its pid, and
// no child loses its samples on the way: each is found in exactly one place.
TEST_CASE("lifecycle e2e: exited processes past the new-process budget share overflow files",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  constexpr int kBudget = 10;
  Child agent({PS_AGENT_BIN, "--profiles=cpu", absl::StrCat("--sampling-frequency=", kHz),
               "--collect-interval=1s", "--http-address=127.0.0.1:0", "--output-dir=" + out.path(),
               absl::StrCat("--output-max-new-processes=", kBudget)});
  std::string line;
  REQUIRE(agent.WaitForStderr("attached:", &line));
  INFO("agent stderr:\n" << agent.stderr_text());
  const int port = MetricsPort(agent.stderr_text());
  REQUIRE(port > 0);
  auto windows = [&] { return MetricValue(Scrape(port), "parascope_windows_total"); };
  const double windows_before = windows();
  constexpr int kChildren = 100, kMs = 20;
  Child work({Lifecycle(), "spawn", std::to_string(kChildren), std::to_string(kMs)});
  std::vector<int> pids;
  while (work.ReadStdoutLine(&line, 60) && line != "done") {
    int pid = 0;
    REQUIRE(absl::SimpleAtoi(line, &pid));
    pids.push_back(pid);
  }
  REQUIRE(line == "done");
  REQUIRE(work.Wait(30) == 0);
  REQUIRE(pids.size() == size_t(kChildren));
  // Every child's windows are written once two more windows have closed.
  const double windows_done = windows();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (windows() < windows_done + 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const std::string metrics = Scrape(port);
  INFO(metrics);
  REQUIRE(MetricValue(metrics, "parascope_windows_total") >= windows_done + 2);
  const double merged = MetricValue(metrics, "parascope_output_merged_processes_total");
  const double merged_profiles = MetricValue(metrics, "parascope_output_merged_profiles_total");
  const double shed = MetricValue(metrics, "parascope_process_snapshots_shed_total");
  const double snapshots = MetricValue(metrics, "parascope_process_snapshots_total");
  const double snapshot_work =
      MetricValue(metrics, "parascope_process_snapshot_work_seconds_total");
  const double gone =
      MetricValue(metrics, "parascope_unwind_table_failures_total{reason=\"process_gone\"}");
  const double capped =
      MetricValue(metrics, "parascope_process_snapshot_work_capped_seconds_total");
  REQUIRE(kill(agent.pid(), SIGINT) == 0);
  const int status = agent.Wait(60);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  // short_lived_burn samples of each child: in its own directory, and in the overflow files.
  const std::set<int> children(pids.begin(), pids.end());
  std::map<int, int64_t> own, shared;
  for (int pid : pids) {
    for (const Image& im : Images(out.path(), pid, "short_lived_burn")) {
      own[pid] += im.With("short_lived_burn");
    }
  }
  // Every other sample of a child in the overflow files, by stack (the failure's evidence).
  std::map<int, std::map<std::string, int64_t>> shared_other;
  int overflow_files = 0;
  for (const std::string& f : ProfileFiles(out.path(), 0, "process_cpu-")) {
    if (!absl::StrContains(f, "/overflow/")) continue;
    ++overflow_files;
    RawProfile p = ReadWithPprof(f);
    const int n = p.ValueIndex("samples");
    REQUIRE(n >= 0);
    for (const auto& s : p.samples) {
      REQUIRE(s.labels.count("pid") == 1);
      CHECK(s.labels.count("process") == 1);
      int pid = 0;
      REQUIRE(absl::SimpleAtoi(s.labels.at("pid"), &pid));
      const std::vector<std::string> frames = p.Frames(s);
      if (children.count(pid) == 0) continue;
      if (std::find(frames.begin(), frames.end(), "short_lived_burn") != frames.end()) {
        shared[pid] += s.values[n];
      } else {
        shared_other[pid][absl::StrJoin(frames, ";")] += s.values[n];
      }
    }
  }
  int in_own = 0, in_shared = 0, in_both = 0, in_neither = 0, lost = 0;
  int64_t burn = 0, unnamed = 0;     // unnamed: the samples of the children in neither
  std::vector<std::string> neither;  // what was found of each child in neither
  for (int pid : pids) {
    const bool o = own[pid] > 0, sh = shared[pid] > 0;
    in_own += o;
    in_shared += sh;
    in_both += o && sh;
    in_neither += !o && !sh;
    burn += own[pid] + shared[pid];
    if (o || sh) continue;
    std::vector<std::string> images;
    int64_t samples = 0;
    for (const Image& im : Images(out.path(), pid)) {
      images.push_back(Summary(im));
      samples += im.samples;
    }
    for (const auto& [stack, v] : shared_other[pid]) samples += v;
    lost += samples == 0;
    unnamed += samples;
    neither.push_back(absl::StrCat("pid ", pid, ": own images [", absl::StrJoin(images, "; "),
                                   "], other overflow samples:", Top(shared_other[pid], 8)));
  }
  const int64_t expected = int64_t(kChildren) * kMs * kHz / 1000;
  const double spanned = windows_done - windows_before + 1;
  FIGURES("over budget: " << kChildren << " children in " << spanned << " windows of 1 s, "
                          << kBudget << " new directories a window: " << in_own
                          << " with their own directory, " << in_shared << " in " << overflow_files
                          << " overflow files, " << in_both << " in both, " << in_neither
                          << " in neither; short_lived_burn samples " << burn << " (expected ~"
                          << expected << "); metric: " << merged << " images merged, "
                          << merged_profiles << " profiles; " << snapshots << " snapshots, " << shed
                          << " shed, " << gone << " gone before they were read, "
                          << "new-image work " << snapshot_work << " s (" << capped
                          << " s of it capped)");
  INFO("children in neither:\n  " << absl::StrJoin(neither, "\n  "));
  // Every child's samples are somewhere: its own directory or an overflow file.
  CHECK(lost == 0);
  // A child whose short_lived_burn is in neither place has its samples there unsymbolized,
  // and the agent counted why: its image was not read while it ran, for the new-image budget
  // (shed) or because it had exited first (gone). Both happen on this kind of VM when the host
  // stops a vCPU: with both CPUs busy, perf shows each vCPU's samples stopping for ~100 ms
  // several times a minute (the host's CPU bandwidth period), and the guest's thread clock
  // counts the stall as CPU time of whichever agent thread was on that vCPU. Once (measured)
  // a stall of 200 ms inside one snapshot let the next child exit before its read (gone) and
  // charged 100 ms to the new-image budget, whose debt then shed ~80 children for 2.5 s. Not
  // seen on a quiet host.
  CHECK(in_neither <= shed + gone);
  // And they stay few: shed and gone are counts over every new image of the host, so the check
  // above would pass if every child were shed. A stall costs a few children (a 20 ms child
  // exits during a 100-200 ms stall); the budget's debt after one is capped (kChargeCapNs).
  CHECK(in_neither <= kChildren / 5);
  CHECK(in_both == 0);
  // Within the budget: the windows the children ran in made at most kBudget directories each
  // (the agent's other new processes take their share too).
  CHECK(in_own <= kBudget * (spanned + 1));
  CHECK(in_shared + in_neither >= kChildren - kBudget * (spanned + 1));
  // The children read while they ran have their burn named; the others' samples are there too.
  CHECK(burn >= (kChildren - in_neither) * expected / kChildren / 2);
  REQUIRE(burn + unnamed >= expected / 2);
  // Counted: every merged child at least (other exited processes of the host too); with
  // --profiles=cpu one profile per image and window (an image that ran across a boundary is
  // merged in both windows and counted once as an image).
  CHECK(merged >= in_shared);
  CHECK(merged_profiles >= merged);
  CHECK(merged_profiles <= 2 * merged);
}

// exec replaces the image under one pid: each image gets its own directory (a new exec id)
// and a Mapping for the file it ran, symbolized against its own image.
TEST_CASE("lifecycle e2e: exec puts each image under its own identity and Mapping", "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Agent agent(out.path(), "30s");
  constexpr int kMs = 300;
  Child work({Lifecycle(), "exec", std::to_string(kMs)});
  std::string line;
  REQUIRE(work.ReadStdoutLine(&line, 30));
  int pid = 0;
  REQUIRE(absl::SimpleAtoi(line, &pid));
  INFO("workload stderr:\n" << work.stderr_text());
  REQUIRE(work.Wait(30) == 0);
  agent.Stop();

  const std::string binary = std::filesystem::canonical(Lifecycle());
  std::vector<Image> images = Images(out.path(), pid);
  std::vector<std::string> summary;
  for (const Image& im : images) {
    summary.push_back(absl::StrCat(
        Summary(im), ", maps the binary: ", im.mapping_files.count(binary) ? "yes" : "no"));
  }
  const int64_t expected = int64_t(kMs) * kHz / 1000;
  FIGURES("exec: pid " << pid << ", " << images.size() << " image directories (expected ~"
                       << expected << " samples per burn):\n    "
                       << absl::StrJoin(summary, "\n    "));
  const Image* first = nullptr;
  const Image* second = nullptr;
  for (const Image& im : images) {
    INFO("image " << im.dir);
    CHECK(!(im.Has("first_image_burn") && im.Has("second_image_burn")));
    if (im.Has("first_image_burn")) {
      CHECK(first == nullptr);
      first = &im;
    }
    if (im.Has("second_image_burn")) {
      CHECK(second == nullptr);
      second = &im;
    }
  }
  REQUIRE(first != nullptr);
  REQUIRE(second != nullptr);
  CHECK(first->dir != second->dir);
  CHECK(!first->Has("second_image_burn"));
  CHECK(!second->Has("first_image_burn"));
  CHECK(first->mapping_files.count(binary) == 1);
  CHECK(second->mapping_files.count(binary) == 1);
  CHECK(first->With("first_image_burn") >= expected / 2);
  CHECK(second->With("second_image_burn") >= expected / 2);
}

// A pid reused by another program inside one window: the two processes differ by start time
// (and exec id), so each keeps its own directory and is symbolized as itself.
TEST_CASE("lifecycle e2e: pid reuse keeps two programs with one pid in separate files",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  Agent agent(out.path(), "60s");
  // A pid the system will not reach on its own for a while: 1000 past the last one allocated
  // (wrapping below pid_max), not in use.
  const int pid_max = ReadInt("/proc/sys/kernel/pid_max");
  REQUIRE(pid_max > 2000);
  int pid = ReadInt("/proc/sys/kernel/ns_last_pid") + 1000;
  if (pid >= pid_max) pid = 1000;
  while (std::filesystem::exists("/proc/" + std::to_string(pid))) ++pid;
  constexpr int kMs = 300;
  RunWithPid(pid, {Lifecycle(), "burn_a", std::to_string(kMs)});
  RunWithPid(pid, {Lifecycle(), "burn_b", std::to_string(kMs)});
  agent.Stop();

  std::vector<Image> images = Images(out.path(), pid);
  std::vector<std::string> summary;
  for (const Image& im : images) summary.push_back(Summary(im));
  const int64_t expected = int64_t(kMs) * kHz / 1000;
  FIGURES("pid reuse: pid " << pid << ", " << images.size() << " image directories (expected ~"
                            << expected << " samples per burn):\n    "
                            << absl::StrJoin(summary, "\n    "));
  const Image* a = nullptr;
  const Image* b = nullptr;
  for (const Image& im : images) {
    INFO("image " << im.dir);
    CHECK(!(im.Has("program_a_burn") && im.Has("program_b_burn")));
    if (im.Has("program_a_burn")) {
      CHECK(a == nullptr);
      a = &im;
    }
    if (im.Has("program_b_burn")) {
      CHECK(b == nullptr);
      b = &im;
    }
  }
  REQUIRE(a != nullptr);
  REQUIRE(b != nullptr);
  CHECK(a->dir != b->dir);
  // Different processes, not just different images: the start ticks differ.
  CHECK(a->dir.substr(0, a->dir.find('.')) != b->dir.substr(0, b->dir.find('.')));
  CHECK(a->With("program_a_burn") >= expected / 2);
  CHECK(b->With("program_b_burn") >= expected / 2);
}

// --pid pins the target's identity at start: when it exits the agent flushes and exits 0, and
// the program that gets the pid next is never profiled, even though it starts before the agent
// has finished.
TEST_CASE("lifecycle e2e: --pid follows its target, not its pid", "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  const int pid = FreePid();
  SpawnWithPid(pid, {Lifecycle(), "burn_a", "5000"});
  Child agent({PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--profiles=cpu",
               absl::StrCat("--sampling-frequency=", kHz), "--collect-interval=60s",
               "--duration=120s", "--http-address=", "--output-dir=" + out.path()});
  std::string line;
  REQUIRE(agent.WaitForStderr("attached:", &line));
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);  // burn_a done: the pid is free again
  REQUIRE(WIFEXITED(status));
  // The impostor: another program with the same pid, while the agent may still be running.
  RunWithPid(pid, {Lifecycle(), "burn_b", "1000"});
  status = agent.Wait(60);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  CHECK(absl::StrContains(agent.stderr_text(), absl::StrCat("target ", pid, " exited")));
  CHECK(absl::StrContains(agent.stderr_text(), "every target exited"));
  std::vector<Image> images = Images(out.path(), pid);
  std::vector<std::string> summary;
  for (const Image& im : images) summary.push_back(Summary(im));
  FIGURES("--pid " << pid << ": " << images.size() << " image directories:\n    "
                   << absl::StrJoin(summary, "\n    "));
  REQUIRE(!images.empty());
  std::set<std::string> starts;
  for (const Image& im : images) {
    starts.insert(im.dir.substr(0, im.dir.find('.')));
    CHECK_FALSE(im.Has("program_b_burn"));
  }
  CHECK(starts.size() == 1);  // one process: the target
  bool burned = false;
  for (const Image& im : images) burned |= im.With("program_a_burn") > 0;
  CHECK(burned);
}

TEST_CASE("lifecycle e2e: --pid of a process that does not exist exits 1 naming it",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  const int pid = FreePid();
  Child agent({PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--duration=10s", "--http-address="});
  int status = agent.Wait(60);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 1);
  CHECK(absl::StrContains(agent.stderr_text(), absl::StrCat("--pid ", pid, ": no such process")));
}

// Issue 14: the work of reading new processes (their mappings at exec or first sample, their
// unwind tables) is bounded whatever the exec rate: 50 ms of CPU at start, refilled at 20 ms
// per second (UnwindService::kExecBurstNs). 6000 processes exec'd and reaped back to back
// spend it; what is left unread is counted, and the windows go on every 2 s meanwhile.
TEST_CASE("lifecycle e2e: process churn past the new-process budget is shed and counted",
          "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  const auto start = std::chrono::steady_clock::now();
  Child agent({PS_AGENT_BIN, "--collect-interval=2s", "--http-address=127.0.0.1:0",
               "--output-dir=" + out.path()});
  std::string line;
  REQUIRE(agent.WaitForStderr("attached:", &line));
  INFO("agent stderr:\n" << agent.stderr_text());
  const int port = MetricsPort(agent.stderr_text());
  REQUIRE(port > 0);
  const std::string before = Scrape(port);
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kProcesses = 6000;
  Child churn({"/bin/sh", "-c",
               absl::StrCat("i=0; while [ $i -lt ", kProcesses,
                            " ]; do /bin/true; i=$((i+1)); done; echo done")});
  REQUIRE(churn.ReadStdoutLine(&line, 600));
  REQUIRE(line == "done");
  CHECK(churn.Wait(30) == 0);
  const auto t1 = std::chrono::steady_clock::now();
  const std::string after = Scrape(port);
  const double churn_s = std::chrono::duration<double>(t1 - t0).count();
  const double uptime_s = std::chrono::duration<double>(t1 - start).count();
  auto delta = [&](const std::string& series) {
    return MetricValue(after, series) - MetricValue(before, series);
  };
  const double work_s = MetricValue(after, "parascope_process_snapshot_work_seconds_total");
  // Included in work_s: what the bucket's debt floor did not charge.
  const double forgiven_s =
      MetricValue(after, "parascope_process_snapshot_work_forgiven_seconds_total");
  // Included in work_s too: what single charges measured beyond their cap (20 ms; vCPU stalls
  // the thread clock counts; UnwindService::kChargeCapNs, ChargeCapNs), not work the budget let
  // through.
  const double capped_s =
      MetricValue(after, "parascope_process_snapshot_work_capped_seconds_total");
  const double shed = delta("parascope_process_snapshots_shed_total");
  const double read = delta("parascope_process_snapshots_total");
  // Exited before their snapshot and table load could read them (neither read nor shed).
  const double gone = delta("parascope_unwind_table_failures_total{reason=\"process_gone\"}");
  const double windows = delta("parascope_windows_total");
  INFO(after);
  FIGURES(kProcesses << " processes in " << churn_s << " s: " << read << " images read, " << shed
                     << " shed, " << gone << " gone first; new-process work " << work_s
                     << " s of CPU (" << forgiven_s << " s of it forgiven, " << capped_s
                     << " s capped) in the agent's " << uptime_s << " s; " << windows
                     << " windows");
  CHECK(shed > 0);
  // Every exec'd image was read, shed, or gone before its turn (a few may go unseen: superseded
  // by a quicker exec).
  CHECK(read + shed + gone >= 0.9 * kProcesses);
  // The budget held: the burst and the refill for the agent's lifetime, plus what the budget
  // owes: work is charged when it ends, so the reads under way and the table loads queued when
  // it ran out are charged after (measured: 0.03 s here). work_s counts what the debt floor
  // forgave too: a forgiving budget fails here.
  CHECK(forgiven_s >= 0);  // exported (MetricValue: -1 when missing)
  CHECK(capped_s >= 0);
  // The capped time is left out: single charges measured beyond their cap, vCPU stalls here (real
  // work that long would be exempt from this bound too; none is expected of a /bin/true).
  CHECK(work_s - capped_s <= 0.05 + 0.02 * uptime_s + 0.1);
  // No window was missed meanwhile.
  CHECK(windows >= std::floor(churn_s / 2) - 1);
  REQUIRE(kill(agent.pid(), SIGINT) == 0);
  const int status = agent.Wait(60);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

TEST_CASE(
    "lifecycle e2e: 24000 process images in one window lose no exact CPU time or off-CPU "
    "interval",
    "[root][e2e]") {
  if (!RequireRoot()) return;
  TempDir out;
  // One 60 s window for the whole churn (about 25 s here): each `/bin/true` the loop runs is two
  // process images (the shell's fork child, then the exec), so 12000 of them put about 24000
  // keys in a buffer of ps_runtime<N> and 16000-20000 in one of ps_offcpu<N>: past the 8192 and
  // 16384 preallocated buffers hold (the binary before allocation on use dropped 2700-3500 off-CPU
  // intervals and about 19000 runtime inserts here).
  Child agent({PS_AGENT_BIN, "--collect-interval=60s", "--http-address=127.0.0.1:0",
               "--output-dir=" + out.path()});
  std::string line;
  REQUIRE(agent.WaitForStderr("attached:", &line));
  INFO("agent stderr:\n" << agent.stderr_text());
  const int port = MetricsPort(agent.stderr_text());
  REQUIRE(port > 0);
  const std::string before = Scrape(port);
  const double runtime_entries =
      MetricValue(before, "parascope_bpf_map_max_entries{map=\"runtime\"}");
  const double offcpu_entries =
      MetricValue(before, "parascope_bpf_map_max_entries{map=\"offcpu\"}");
  const bool on_use = runtime_entries == PS_RUNTIME_MAP_ENTRIES_ON_USE;
  CHECK(offcpu_entries == (on_use ? PS_OFFCPU_MAP_ENTRIES_ON_USE : PS_OFFCPU_MAP_ENTRIES));
  // The agent decides by the kernel's BTF (bpf_mem_alloc: agent/bpf/programs.cc LoadSched): every
  // 6.1+ kernel allocates on use; an older one may too if a vendor backported the allocator.
  struct utsname u {};
  REQUIRE(uname(&u) == 0);
  int major = 0, minor = 0;
  REQUIRE(std::sscanf(u.release, "%d.%d", &major, &minor) == 2);
  INFO("kernel " << u.release);
  if (major > 6 || (major == 6 && minor >= 1)) {
    CHECK(on_use);
  } else {
    CHECK((on_use || runtime_entries == PS_RUNTIME_MAP_ENTRIES));
  }
  const auto t0 = std::chrono::steady_clock::now();
  constexpr int kProcesses = 12000;
  Child churn({"/bin/sh", "-c",
               absl::StrCat("i=0; while [ $i -lt ", kProcesses,
                            " ]; do /bin/true; i=$((i+1)); done; echo done")});
  REQUIRE(churn.ReadStdoutLine(&line, 600));
  REQUIRE(line == "done");
  CHECK(churn.Wait(30) == 0);
  const double churn_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const std::string after = Scrape(port);
  INFO(after);
  auto delta = [&](const std::string& series) {
    return MetricValue(after, series) - MetricValue(before, series);
  };
  const double runtime_dropped = delta("parascope_bpf_events_dropped_total{map=\"runtime\"}");
  const double offcpu_dropped = delta("parascope_bpf_events_dropped_total{map=\"offcpu\"}");
  FIGURES(kProcesses << " processes in " << churn_s << " s, " << delta("parascope_windows_total")
                     << " windows closed meanwhile; dropped: " << runtime_dropped
                     << " runtime inserts (" << runtime_entries << " keys a buffer), "
                     << offcpu_dropped << " off-CPU intervals (" << offcpu_entries << ")");
  // At most one window boundary in the churn: a window then holds half of its 24000 runtime
  // keys or more, past the 8192 a preallocated buffer holds (on a kernel that preallocates, the
  // drops below show it).
  CHECK(delta("parascope_windows_total") <= 1);
  if (on_use) {
    CHECK(runtime_dropped == 0);
    CHECK(offcpu_dropped == 0);
  } else {
    CHECK(runtime_dropped > 0);
  }
  REQUIRE(kill(agent.pid(), SIGINT) == 0);
  const int status = agent.Wait(60);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace parascope::testing
