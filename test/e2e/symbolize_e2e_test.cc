// Root end-to-end tests of symbolization (issue: every process's frames named, acceptance 5-8):
// debug info from the binary, from separate debug files (.gnu_debuglink, build-id directory) and
// MiniDebugInfo, and a debuginfod server (--debuginfod-urls); JIT frames from Node's perf map;
// demangled C++; --symbolize=server against addr2line. Workloads are built with gcc -O2 -g (CMakeLists.txt); stripped copies are made here
// with binutils and xz, as distributions make them. Every profile is read through the real pprof.
#include <httplib.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "test/e2e/e2e_util.h"

namespace parascope::testing {
namespace {

#define FIGURES(msg) \
  INFO(msg);         \
  WARN(msg)

namespace fs = std::filesystem;

std::string Workload(const std::string& name) { return std::string(PS_WORKLOAD_DIR) + "/" + name; }

void Run(const std::string& cmd) {
  std::string out, err;
  int rc = RunCommand(cmd, &out, &err);
  INFO(cmd << "\n" << out << err);
  REQUIRE(rc == 0);
}

std::string Output(const std::string& cmd) {
  std::string out, err;
  int rc = RunCommand(cmd, &out, &err);
  INFO(cmd << "\n" << err);
  REQUIRE(rc == 0);
  return std::string(absl::StripTrailingAsciiWhitespace(out));
}

// The 1-based line of test/workloads/debuginfo.c that carries "LINE: <tag> */".
int64_t MarkedLine(const std::string& tag) {
  std::ifstream in(std::string(PS_FIXTURE_DIR) + "/../workloads/debuginfo.c");
  std::string line;
  for (int64_t n = 1; std::getline(in, line); ++n) {
    if (absl::StrContains(line, absl::StrCat("LINE: ", tag, " */"))) return n;
  }
  FAIL("no LINE: " << tag << " marker");
  return 0;
}

// Several workloads (ready/go/done protocol) profiled by one agent run with --pid for all of
// them; the agent is stopped by the workloads' exit (every target exited).
struct MultiRun {
  std::vector<std::unique_ptr<Child>> work;
  std::vector<int> pids;
  std::vector<std::string> done;  // each workload's "done ..." line
  std::string agent_log;
};

void RunAll(MultiRun* r, const std::vector<std::vector<std::string>>& workloads,
            const std::vector<std::string>& agent_args, const std::string& out_dir) {
  for (const auto& argv : workloads) {
    r->work.push_back(std::make_unique<Child>(argv));
    std::string line;
    INFO("workload: " << absl::StrJoin(argv, " "));
    REQUIRE(r->work.back()->ReadStdoutLine(&line));
    REQUIRE(absl::StartsWith(line, "ready "));
    r->pids.push_back(std::stoi(line.substr(6)));
  }
  std::vector<std::string> argv = {PS_AGENT_BIN, "--pid=" + absl::StrJoin(r->pids, ","),
                                   "--output-dir=" + out_dir, "--http-address=",
                                   "--profiles=cpu", "--sampling-frequency=499",
                                   "--duration=60s"};
  argv.insert(argv.end(), agent_args.begin(), agent_args.end());
  Child agent(argv);
  std::string line;
  INFO("agent: " << absl::StrJoin(argv, " "));
  bool attached = agent.WaitForStderr("attached:", &line);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(attached);
  for (auto& w : r->work) w->WriteStdin("go\n");
  for (auto& w : r->work) {
    REQUIRE(w->ReadStdoutLine(&line, 30));
    REQUIRE(absl::StartsWith(line, "done "));
    r->done.push_back(line);
  }
  for (auto& w : r->work) {
    w->CloseStdin();
    CHECK(w->Wait(10) == 0);
  }
  int status = agent.Wait(60);
  r->agent_log = agent.stderr_text();
  INFO("agent stderr:\n" << r->agent_log);
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  CHECK(absl::StrContains(r->agent_log, "every target exited"));
}

// Samples of a pid's process_cpu profiles whose frames satisfy `pred`, and all of them.
struct Count {
  int64_t matching = 0, total = 0;
  double share() const { return total == 0 ? 0 : double(matching) / double(total); }
};

// For each location of `p` that names `function` (any of its Lines): the Lines.
std::vector<std::vector<RawProfile::Line>> LinesNaming(const RawProfile& p,
                                                       const std::string& function) {
  std::vector<std::vector<RawProfile::Line>> out;
  for (const auto& [id, loc] : p.locations) {
    for (const auto& l : loc.lines) {
      if (l.function == function) {
        out.push_back(loc.lines);
        break;
      }
    }
  }
  return out;
}

bool SampleHas(const RawProfile& p, const RawProfile::Sample& s, const std::string& function) {
  for (uint64_t id : s.location_ids) {
    auto it = p.locations.find(id);
    if (it == p.locations.end()) continue;
    for (const auto& l : it->second.lines) {
      if (l.function == function) return true;
    }
  }
  return false;
}

TEST_CASE("debug info: separate debug files by debuglink and build id, MiniDebugInfo, inlined "
          "lines",
          "[root][symbolize]") {
  if (!RequireRoot()) return;
  TempDir tmp;
  const std::string bin = tmp.path() + "/bin", dbg = tmp.path() + "/debug";
  fs::create_directories(bin);
  // 0: as built (-O2 -g). 1: stripped, debug file beside it named by .gnu_debuglink.
  // 2: stripped, debug file only in <debug dir>/.build-id/. 3: stripped with MiniDebugInfo (the
  // Fedora recipe: the function symbols .dynsym lacks, in an xz-compressed ELF in .gnu_debugdata).
  const std::string plain = bin + "/plain", linked = bin + "/linked", by_id = bin + "/by_id",
                    mini = bin + "/mini";
  fs::copy_file(Workload("debuginfo_0"), plain);
  fs::copy_file(Workload("debuginfo_1"), linked);
  Run(absl::StrCat("objcopy --only-keep-debug ", linked, " ", linked, ".debug && strip ",
                   "--strip-all ", linked, " && objcopy --add-gnu-debuglink=", linked, ".debug ",
                   linked));
  fs::copy_file(Workload("debuginfo_2"), by_id);
  std::string id = Output("readelf -n " + by_id + " | sed -n 's/.*Build ID: //p'");
  REQUIRE(id.size() == 40);
  fs::create_directories(dbg + "/.build-id/" + id.substr(0, 2));
  Run(absl::StrCat("objcopy --only-keep-debug ", by_id, " ", dbg, "/.build-id/", id.substr(0, 2),
                   "/", id.substr(2), ".debug && strip --strip-all ", by_id));
  fs::copy_file(Workload("debuginfo_3"), mini);
  Run(absl::StrCat(
      "cd ", tmp.path(), " && nm -D ", mini, " --format=posix --defined-only | awk '{print $1}' ",
      "| sort > dynsyms && nm ", mini, " --format=posix --defined-only | awk '$2 ~ /^[Tt]$/ ",
      "{print $1}' | sort > funcsyms && comm -13 dynsyms funcsyms > keep && objcopy ",
      "--only-keep-debug ", mini, " full.dbg && objcopy -S --remove-section .gdb_index ",
      "--remove-section .comment --keep-symbols=keep full.dbg mini.dbg && strip --strip-all ",
      "-R .comment ", mini, " && xz -f mini.dbg && objcopy --add-section ",
      ".gnu_debugdata=mini.dbg.xz ", mini));
  // The stripped copies really lack the names: nm finds nothing.
  for (const std::string& f : {linked, by_id, mini}) {
    std::string out, err;
    RunCommand("nm " + f, &out, &err);
    INFO(f << ": " << out << err);
    CHECK_FALSE(absl::StrContains(out, "debuginfo_burn"));
  }

  TempDir out;
  MultiRun r;
  RunAll(&r, {{plain, "3"}, {linked, "3"}, {by_id, "3"}, {mini, "3"}},
         {"--debug-dirs=" + dbg + ",/usr/lib/debug"}, out.path());
  const int64_t mix_line = MarkedLine("mix_step"), call_line = MarkedLine("call mix_step");
  const char* names[] = {"plain", "debuglink", "build-id dir", "MiniDebugInfo"};
  for (size_t i = 0; i < r.pids.size(); ++i) {
    Count named;
    std::vector<std::vector<RawProfile::Line>> burn_lines;
    for (const std::string& f : ProfileFiles(out.path(), r.pids[i], "process_cpu-")) {
      RawProfile p = ReadWithPprof(f);
      for (const auto& s : p.samples) {
        named.total += s.values[0];
        if (SampleHas(p, s, "debuginfo_burn")) named.matching += s.values[0];
      }
      for (auto& l : LinesNaming(p, "debuginfo_burn")) burn_lines.push_back(l);
    }
    FIGURES(names[i] << ": " << named.matching << " of " << named.total
                     << " samples name debuginfo_burn (" << named.share() << ")");
    // 3 s at 499 Hz is ~1500 with a CPU to itself; four share two CPUs (and whatever else runs).
    CHECK(named.total >= 200);
    CHECK(named.share() >= 0.95);
    REQUIRE_FALSE(burn_lines.empty());
    // With DWARF (0-2): the hot loop's pcs are mix_step inlined into debuginfo_burn: one Location
    // with two Lines, mix_step at its statement, debuginfo_burn at the inlined call's line.
    // MiniDebugInfo (3) has symbols only: one Line, no line number.
    bool inlined_seen = false;
    for (const auto& lines : burn_lines) {
      INFO(names[i] << " location: " << lines.front().function << " " << lines.front().file << ":"
                    << lines.front().line << " (" << lines.size() << " lines)");
      if (i == 3) {
        CHECK(lines.size() == 1);
        CHECK(lines[0].line == 0);
        continue;
      }
      if (lines.size() == 2 && lines[0].function == "mix_step") {
        inlined_seen = true;
        CHECK(lines[0].line == mix_line);
        CHECK(absl::EndsWith(lines[0].file, "debuginfo.c"));
        CHECK(lines[1].function == "debuginfo_burn");
        CHECK(lines[1].line == call_line);
      }
    }
    if (i < 3) CHECK(inlined_seen);
  }
}

// Template-heavy C++ (test/workloads/cxx_templates.cc, g++ -O2 -g): every hot function is named
// by its demangled name, with the mangled symbol as the Function's system_name; two instances of
// one member function template are two functions, sharing the CPU as the workload split it.
TEST_CASE("demangled C++ templates: each instance its own function, lambdas and operators named",
          "[root][symbolize]") {
  if (!RequireRoot()) return;
  const std::string bin = Workload("cxx_templates");
  // Demangled name -> mangled symbol. The names are c++filt's (binutils), checked against the
  // binary's symbol table below, not the agent's demangler's.
  const std::string kBoxInt = "long ps::Box<int>::Accumulate<long>(long) const";
  const std::string kBoxDouble = "double ps::Box<double>::Accumulate<double>(double) const";
  const std::string kStr =
      "std::__cxx11::basic_string<char, std::char_traits<char>, std::allocator<char> >";
  const std::string kMap =
      absl::StrCat("std::map<", kStr, ", std::vector<int, std::allocator<int> >, std::less<", kStr,
                   " >, std::allocator<std::pair<", kStr,
                   " const, std::vector<int, std::allocator<int> > > > >");
  const std::string kForEachLambda =
      "(anonymous namespace)::RunLambda(std::vector<unsigned long, std::allocator<unsigned long> > "
      "const&)::{lambda(unsigned long)#1}::operator()(unsigned long) const";
  const std::string kFunctionLambda =
      "main::{lambda(unsigned long)#1}::operator()(unsigned long) const";
  const std::string kOperator = "ps::operator*(ps::Mat4 const&, ps::Mat4 const&)";
  const std::string kSumValues =
      absl::StrCat("long ps::SumValues<", kMap, " >(", kMap, " const&, int)");
  const std::string kMix =
      "unsigned long ps::Mix<int, long, unsigned int>(long, int, long, unsigned int)";
  // Each with the workload's "done" key of its CPU time.
  struct Want {
    std::string name, mangled, cpu_key;
  };
  const std::vector<Want> want = {
      {kBoxInt, "_ZNK2ps3BoxIiE10AccumulateIlEET_S3_", "box_int_ns"},
      {kBoxDouble, "_ZNK2ps3BoxIdE10AccumulateIdEET_S3_", "box_double_ns"},
      {kSumValues,
       "_ZN2ps9SumValuesISt3mapINSt7__cxx1112basic_stringIcSt11char_traitsIcESaIcEEESt6vectorIiSaI"
       "iEESt4lessIS7_ESaISt4pairIKS7_SA_EEEEElRKT_i",
       "map_ns"},
      {kForEachLambda, "_ZZN12_GLOBAL__N_19RunLambdaERKSt6vectorImSaImEEENKUlmE_clEm", "lambda_ns"},
      {kOperator, "_ZN2psmlERKNS_4Mat4ES2_", "op_ns"},
      {kMix, "_ZN2ps3MixIJiljEEEmlDpT_", "variadic_ns"},
      // Called from std::_Function_handler<...>::_M_invoke, which tail-calls it (a jmp), so
      // _M_invoke itself is not on the stack.
      {kFunctionLambda, "_ZZ4mainENKUlmE_clEm", "function_ns"},
  };
  {
    std::string syms = Output("nm --defined-only " + bin);
    for (const Want& w : want) {
      INFO(w.mangled);
      CHECK(absl::StrContains(syms, " " + w.mangled + "\n"));
      CHECK(Output("echo " + w.mangled + " | c++filt") == w.name);
    }
  }

  TempDir out;
  MultiRun r;
  // 8 s: ~1500 samples of the two instances on a CPU of its own, so the sampling error of
  // their split (~0.012) stays well inside its tolerance on a busy machine too.
  RunAll(&r, {{bin, "8"}}, {}, out.path());
  std::map<std::string, std::string> done = KeyValues(r.done[0]);
  auto cpu = [&](const std::string& key) {
    int64_t v = 0;
    INFO(r.done[0]);
    REQUIRE(absl::SimpleAtoi(done[key], &v));
    return v;
  };

  std::map<std::string, int64_t> samples;               // demangled name -> samples naming it
  std::map<std::string, std::set<std::string>> system;  // demangled name -> system names
  std::map<std::string, std::set<std::string>> where;   // demangled name -> "<file>#<location>"
  std::set<std::string> mangled_left;                   // workload function names still "_Z..."
  int64_t total = 0, in_bin = 0, unnamed_in_bin = 0;
  const auto files = ProfileFiles(out.path(), r.pids[0], "process_cpu-");
  REQUIRE_FALSE(files.empty());
  for (const std::string& f : files) {
    RawProfile p = ReadWithPprof(f);
    for (const auto& [id, loc] : p.locations) {
      if (p.mapping_files[loc.mapping_id] != bin) continue;
      for (const auto& l : loc.lines) {
        if (absl::StartsWith(l.function, "_Z")) mangled_left.insert(l.function);
        system[l.function].insert(l.system_name);
        where[l.function].insert(absl::StrCat(f, "#", id));
      }
    }
    for (const auto& s : p.samples) {
      total += s.values[0];
      const auto& leaf = p.locations[s.location_ids.front()];
      if (p.mapping_files[leaf.mapping_id] == bin) {
        in_bin += s.values[0];
        if (leaf.lines.empty()) unnamed_in_bin += s.values[0];
      }
      for (const Want& w : want) {
        if (SampleHas(p, s, w.name)) samples[w.name] += s.values[0];
      }
    }
  }
  const int64_t cpu_total = cpu("cpu_ns");
  std::ostringstream figures;
  for (const Want& w : want) {
    figures << "\n  " << double(samples[w.name]) / std::max<int64_t>(total, 1) << " (cpu "
            << double(cpu(w.cpu_key)) / cpu_total << ") " << w.name;
  }
  FIGURES("cxx_templates: " << total << " samples, " << in_bin << " with a leaf in the binary ("
                            << unnamed_in_bin
                            << " unnamed); share of samples naming each:" << figures.str());
  CHECK(total >= 1200);  // 8 s at 499 Hz is ~4000 with a CPU to itself
  {
    INFO("still mangled: " << absl::StrJoin(mangled_left, "\n"));
    CHECK(mangled_left.empty());
  }
  CHECK(unnamed_in_bin == 0);
  for (const Want& w : want) {
    INFO(w.name);
    // Named exactly, with the mangled symbol as the system name, in a good part of the samples the
    // workload's own clock gives it (each part has ~1/10 of the CPU or more).
    CHECK(system[w.name] == std::set<std::string>{w.mangled});
    CHECK(double(samples[w.name]) / total >= 0.5 * double(cpu(w.cpu_key)) / cpu_total);
  }
  // The two instances: two functions at their own locations.
  REQUIRE_FALSE(where[kBoxInt].empty());
  REQUIRE_FALSE(where[kBoxDouble].empty());
  for (const std::string& loc : where[kBoxInt]) CHECK(where[kBoxDouble].count(loc) == 0);
  // Their CPU: Box<double>'s loop runs twice the iterations of the same code (1:2), and the
  // workload's thread clock around each call measures what it took.
  const double measured =
      double(cpu("box_int_ns")) / double(cpu("box_int_ns") + cpu("box_double_ns"));
  const double sampled = double(samples[kBoxInt]) /
                         double(std::max<int64_t>(samples[kBoxInt] + samples[kBoxDouble], 1));
  FIGURES("Box<int> : Box<double>: sampled share " << sampled << " (" << samples[kBoxInt] << " and "
                                                   << samples[kBoxDouble] << " samples), measured "
                                                   << measured << ", by iterations 1/3");
  CHECK(samples[kBoxInt] + samples[kBoxDouble] >= 500);
  CHECK(std::abs(measured - 1.0 / 3) <= 0.07);
  CHECK(std::abs(sampled - measured) <= 0.07);
  CHECK(std::abs(sampled - 1.0 / 3) <= 0.07);
}

// A stripped binary (no .symtab, no DWARF, no .gnu_debuglink) whose debug file only a local
// debuginfod server has: the agent asks for it in the background after the first window that
// needs it, and names the binary's functions from a later window on. Nothing else can name them:
// --debug-dirs is an empty directory.
TEST_CASE("debuginfod: a stripped binary's debug file fetched in the background names it from a "
          "later window",
          "[root][symbolize]") {
  if (!RequireRoot()) return;
  // Bad values are usage errors naming the flag (exit 2).
  for (const char* bad : {"--debuginfod-cache-max-bytes=12x", "--debuginfod-cache-max-bytes=1000",
                          "--debuginfod-urls=ftp://x", "--debuginfod-cache-dir=relative"}) {
    std::string out, err;
    // --duration: a value wrongly accepted ends the run in a second (and fails), never hangs.
    int rc = RunCommand(absl::StrCat(PS_AGENT_BIN,
                                     " --duration=1s --http-address= --debuginfod-urls=http://"
                                     "127.0.0.1:1 ",
                                     bad),
                        &out, &err);
    const std::string flag(absl::string_view(bad).substr(0, absl::string_view(bad).find('=')));
    INFO(bad << ": " << err);
    CHECK(WIFEXITED(rc));
    CHECK(WEXITSTATUS(rc) == 2);
    CHECK(absl::StrContains(err, flag + ":"));
  }
  TempDir tmp;
  const std::string bin = tmp.path() + "/bin/fetched", served = tmp.path() + "/served.debug",
                    no_debug = tmp.path() + "/no-debug", cache = tmp.path() + "/cache";
  fs::create_directories(tmp.path() + "/bin");
  fs::create_directories(no_debug);
  fs::copy_file(Workload("debuginfo_2"), bin);
  Run(absl::StrCat("objcopy --only-keep-debug ", bin, " ", served, " && strip --strip-all ", bin));
  const std::string id = Output("readelf -n " + bin + " | sed -n 's/.*Build ID: //p'");
  REQUIRE(id.size() == 40);
  {
    std::string out, err;
    RunCommand("nm " + bin + "; readelf -S " + bin, &out, &err);
    INFO(out << err);
    CHECK_FALSE(absl::StrContains(out, "debuginfo_burn"));
    CHECK_FALSE(absl::StrContains(out, ".debug_info"));
    CHECK_FALSE(absl::StrContains(out, ".gnu_debuglink"));
  }
  std::string served_bytes;
  {
    std::ifstream in(served, std::ios::binary);
    served_bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  REQUIRE(!served_bytes.empty());

  // debuginfod's protocol, as much as the client uses: GET /buildid/<hex>/debuginfo, 404 for
  // what the server does not have (the workload's libc and ld.so).
  httplib::Server server;
  std::mutex mu;
  std::map<std::string, int> requests;  // path -> count
  server.Get(R"(/buildid/([0-9a-f]+)/debuginfo)",
             [&](const httplib::Request& req, httplib::Response& res) {
               {
                 std::lock_guard<std::mutex> l(mu);
                 ++requests[req.path];
               }
               if (req.matches[1] == id) {
                 res.set_content(served_bytes, "application/octet-stream");
               } else {
                 res.status = 404;
               }
             });
  const int server_port = server.bind_to_any_port("127.0.0.1");
  REQUIRE(server_port > 0);
  std::thread serving([&] { server.listen_after_bind(); });
  struct StopServer {
    httplib::Server& s;
    std::thread& t;
    ~StopServer() {
      s.stop();
      t.join();
    }
  } stop_server{server, serving};

  std::unique_ptr<Child> work = std::make_unique<Child>(std::vector<std::string>{bin, "60"});
  std::string line;
  REQUIRE(work->ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  const int pid = std::stoi(line.substr(6));
  // libdebuginfod is loaded for --debuginfod-urls only (dlopen(3): its closure of libcurl,
  // GnuTLS, Kerberos and LDAP held 3.7 MiB of RSS when linked).
  auto maps_of = [](int agent_pid) {
    std::ifstream in("/proc/" + std::to_string(agent_pid) + "/maps");
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  };
  {
    TempDir plain_out;
    Child plain({PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--output-dir=" + plain_out.path(),
                 "--http-address=127.0.0.1:0", "--profiles=cpu", "--duration=60s"});
    REQUIRE(AttachedMetricsPort(&plain) > 0);
    const std::string maps = maps_of(plain.pid());
    REQUIRE(absl::StrContains(maps, "libdw"));  // the maps were read
    CHECK_FALSE(absl::StrContains(maps, "libdebuginfod"));
    CHECK_FALSE(absl::StrContains(maps, "libcurl"));
    kill(plain.pid(), SIGTERM);
    CHECK(plain.Wait(30) == 0);
  }
  TempDir out;
  std::vector<std::string> argv = {
      PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--output-dir=" + out.path(),
      "--http-address=127.0.0.1:0", "--profiles=cpu", "--sampling-frequency=199",
      "--collect-interval=1s", "--duration=90s", "--debug-dirs=" + no_debug,
      absl::StrCat("--debuginfod-urls=http://127.0.0.1:", server_port),
      "--debuginfod-cache-dir=" + cache};
  Child agent(argv);
  const int http_port = AttachedMetricsPort(&agent);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(http_port > 0);
  CHECK(absl::StrContains(maps_of(agent.pid()), "/libdebuginfod"));
  work->WriteStdin("go\n");

  // Each window's profile in window order, until one names the workload's function and one more
  // window follows it.
  struct Window {
    std::string file;
    Count burn;  // samples naming debuginfo_burn, of all
  };
  std::vector<Window> windows;
  std::set<std::string> seen;
  size_t first_named = SIZE_MAX;
  const absl::Time deadline = absl::Now() + absl::Seconds(45);
  while (absl::Now() < deadline) {
    for (const std::string& f : ProfileFiles(out.path(), pid, "process_cpu-")) {
      if (!seen.insert(f).second) continue;
      RawProfile p = ReadWithPprof(f);
      Window w{f, {}};
      for (const auto& s : p.samples) {
        w.burn.total += s.values[0];
        if (SampleHas(p, s, "debuginfo_burn")) w.burn.matching += s.values[0];
      }
      if (w.burn.total == 0) continue;
      if (w.burn.matching > 0 && first_named == SIZE_MAX) first_named = windows.size();
      windows.push_back(w);
    }
    if (first_named != SIZE_MAX && windows.size() > first_named + 1) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // poll interval
  }
  const std::string metrics = Output(
      absl::StrCat("curl -sS -m 10 http://127.0.0.1:", http_port, "/metrics"));
  kill(agent.pid(), SIGTERM);
  const int status = agent.Wait(60);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);

  std::ostringstream figures;
  for (const Window& w : windows) figures << " " << w.burn.matching << "/" << w.burn.total;
  FIGURES("debuginfod: samples naming debuginfo_burn per window:" << figures.str()
                                                                  << "; first named window "
                                                                  << first_named);
  REQUIRE(first_named != SIZE_MAX);
  // The first window that needed the file could not have it (it is asked for then); a later one
  // names the function, and the window after that names every sample.
  CHECK(first_named >= 1);
  REQUIRE(windows.size() > first_named + 1);
  CHECK(windows.back().burn.share() >= 0.95);
  // Asked for once; the file sits in the cache, the binary's build id in it.
  {
    std::lock_guard<std::mutex> l(mu);
    std::string all;
    for (const auto& [path, n] : requests) absl::StrAppend(&all, path, "=", n, " ");
    INFO("server requests: " << all);
    CHECK(requests[absl::StrCat("/buildid/", id, "/debuginfo")] == 1);
  }
  const std::string cached = cache + "/" + id + "/debuginfo";
  REQUIRE(fs::exists(cached));
  CHECK(fs::file_size(cached) == served_bytes.size());
  CHECK(Output("readelf -n " + cached + " | sed -n 's/.*Build ID: //p'") == id);
  INFO("metrics:\n" << metrics);
  CHECK(MetricValue(metrics, "parascope_debuginfod_requests_total{result=\"fetched\"}") == 1);
  CHECK(MetricValue(metrics, "parascope_debuginfod_requests_total{result=\"error\"}") == 0);
  CHECK(MetricValue(metrics, "parascope_debuginfod_cache_bytes") >= served_bytes.size());
  CHECK(absl::StrContains(agent.stderr_text(), "debuginfod: fetched=1 "));
}

// A process in a chroot and one in its own mount namespace whose binary exists only there: both
// named, their Mappings under the paths the processes see.
TEST_CASE("files as the process sees them: chroot and a private mount namespace",
          "[root][symbolize]") {
  if (!RequireRoot()) return;
  TempDir jail, ns_dir;
  // The jail: the binary and the libraries ldd lists, at the same paths inside.
  fs::create_directories(jail.path() + "/bin");
  fs::copy_file(Workload("debuginfo_1"), jail.path() + "/bin/jailed");
  std::string libs = Output("ldd " + Workload("debuginfo_1") + " | grep -o '/[^ ]*'");
  for (absl::string_view lib : absl::StrSplit(libs, '\n', absl::SkipEmpty())) {
    fs::path dst = jail.path() + std::string(lib);
    fs::create_directories(dst.parent_path());
    fs::copy_file(std::string(lib), dst, fs::copy_options::overwrite_existing);
  }
  // The namespace: a tmpfs mounted over an (empty, on the host) directory, the binary copied in
  // there, so its path names nothing on the host.
  const std::string ns_bin = ns_dir.path() + "/nsonly";
  TempDir out;
  MultiRun r;
  std::vector<std::vector<std::string>> workloads = {
      {"/usr/sbin/chroot", jail.path(), "/bin/jailed", "3"}};
  // Inside a chroot (the fresh-machine check runs the suite in one) a private mount namespace
  // cannot be made: its root is no mount point, so unshare cannot change its propagation
  // (EINVAL), and the kernel refuses new user namespaces to chrooted processes (EPERM,
  // user_namespaces(7)); a shared mount there would leak the tmpfs to the host. On a machine
  // (CI), both halves run.
  const bool in_chroot =
      absl::StrContains(Output("/usr/bin/unshare -m --propagation private /bin/true 2>&1; true"),
                        "cannot change root filesystem propagation");
  if (in_chroot) {
    WARN("mount namespace half skipped: `unshare -m --propagation private` fails here (a chroot)");
  } else {
    workloads.push_back(
        {"/usr/bin/unshare", "-m", "--propagation", "private", "/bin/sh", "-c",
         absl::StrCat("mount -t tmpfs none ", ns_dir.path(), " && cp ", Workload("debuginfo_2"),
                      " ", ns_bin, " && exec ", ns_bin, " 3")});
  }
  RunAll(&r, workloads, {}, out.path());
  REQUIRE(r.pids.size() == workloads.size());
  CHECK_FALSE(fs::exists(ns_bin));  // not on the host
  const std::string want[] = {"/bin/jailed", ns_bin};
  const char* names[] = {"chroot", "mount namespace"};
  for (size_t i = 0; i < r.pids.size(); ++i) {
    Count named;
    std::set<std::string> files;
    for (const std::string& f : ProfileFiles(out.path(), r.pids[i], "process_cpu-")) {
      RawProfile p = ReadWithPprof(f);
      for (const auto& s : p.samples) {
        named.total += s.values[0];
        if (SampleHas(p, s, "debuginfo_burn")) named.matching += s.values[0];
      }
      for (const auto& [id, loc] : p.locations) {
        if (loc.function == "debuginfo_burn") files.insert(p.mapping_files[loc.mapping_id]);
      }
    }
    FIGURES(names[i] << ": " << named.matching << " of " << named.total
                     << " samples name debuginfo_burn (" << named.share() << "), Mapping "
                     << absl::StrJoin(files, ","));
    CHECK(named.total >= 300);
    CHECK(named.share() >= 0.95);
    CHECK(files == std::set<std::string>{want[i]});
  }
}

TEST_CASE("JIT: Node's perf map names its hot JavaScript function", "[root][symbolize]") {
  if (!RequireRoot()) return;
  std::string node = Output("command -v node || command -v nodejs");
  TempDir tmp;  // node writes isolate logs into its working directory
  // --no-turbo-inlining: TurboFan may inline hotLoopFunction into the stdin callback (OSR), and
  // those samples then rightly name the callback (Node 20 here: 0.78-0.84 of samples named
  // hotLoopFunction, the rest "JS:* hot.js:5:28"); the test is about the perf map, not V8's
  // inlining.
  const std::string script = tmp.path() + "/hot.js";
  std::ofstream(script) << "function hotLoopFunction(n) { let s = 0;\n"
                           "  for (let i = 0; i < n; i++) s = (s * 31 + i) % 1000003;\n"
                           "  return s; }\n"
                           "process.stdout.write('ready ' + process.pid + '\\n');\n"
                           "process.stdin.once('data', () => {\n"
                           "  const end = Date.now() + 4000; let acc = 0;\n"
                           "  while (Date.now() < end) acc += hotLoopFunction(100000);\n"
                           "  process.stdout.write('done acc=' + acc + '\\n');\n"
                           "  process.exit(0); });\n";
  TempDir out;
  std::unique_ptr<Child> work = std::make_unique<Child>(std::vector<std::string>{
      "/bin/sh", "-c", absl::StrCat("cd ", tmp.path(), " && exec ", node,
                                    " --perf-basic-prof --no-turbo-inlining ", script)});
  std::string line;
  REQUIRE(work->ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  int pid = std::stoi(line.substr(6));
  Child agent({PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--output-dir=" + out.path(),
               "--http-address=", "--profiles=cpu", "--sampling-frequency=499",
               "--duration=60s"});
  REQUIRE(agent.WaitForStderr("attached:", &line));
  work->WriteStdin("go\n");
  REQUIRE(work->ReadStdoutLine(&line, 30));
  CHECK(work->Wait(10) == 0);
  int status = agent.Wait(60);
  INFO("agent stderr:\n" << agent.stderr_text());
  REQUIRE(WIFEXITED(status));
  REQUIRE(WEXITSTATUS(status) == 0);
  Count named;
  std::set<std::string> jit_mappings;
  for (const std::string& f : ProfileFiles(out.path(), pid, "process_cpu-")) {
    RawProfile p = ReadWithPprof(f);
    for (const auto& s : p.samples) {
      named.total += s.values[0];
      for (uint64_t id : s.location_ids) {
        const auto& loc = p.locations[id];
        if (absl::StrContains(loc.function, "hotLoopFunction")) {
          named.matching += s.values[0];
          jit_mappings.insert(p.mapping_files[loc.mapping_id]);
          break;
        }
      }
    }
  }
  FIGURES("node: " << named.matching << " of " << named.total
                   << " samples name hotLoopFunction (" << named.share() << ")");
  CHECK(named.total >= 1000);  // 4 s at 499 Hz is ~2000
  CHECK(named.share() >= 0.90);
  CHECK(jit_mappings == std::set<std::string>{absl::StrCat("/tmp/perf-", pid, ".map")});
}

// Two agents at once on one workload: agent-side names against addr2line of the server-side
// profile's addresses. Both see the same CPU; their per-function shares must agree.
TEST_CASE("server-side symbolization: ELF addresses that addr2line resolves like the agent does",
          "[root][symbolize]") {
  if (!RequireRoot()) return;
  const std::string bin = Workload("unwind_ratio");
  std::unique_ptr<Child> work = std::make_unique<Child>(std::vector<std::string>{bin, "3"});
  std::string line;
  REQUIRE(work->ReadStdoutLine(&line));
  REQUIRE(absl::StartsWith(line, "ready "));
  int pid = std::stoi(line.substr(6));
  TempDir agent_out, server_out;
  auto start = [&](const std::string& dir, const std::string& mode) {
    return std::make_unique<Child>(std::vector<std::string>{
        PS_AGENT_BIN, absl::StrCat("--pid=", pid), "--output-dir=" + dir, "--http-address=",
        "--profiles=cpu", "--sampling-frequency=499", "--duration=60s", "--symbolize=" + mode});
  };
  std::unique_ptr<Child> a = start(agent_out.path(), "agent");
  std::unique_ptr<Child> b = start(server_out.path(), "server");
  REQUIRE(a->WaitForStderr("attached:", &line));
  REQUIRE(b->WaitForStderr("attached:", &line));
  work->WriteStdin("go\n");
  REQUIRE(work->ReadStdoutLine(&line, 30));
  work->CloseStdin();
  CHECK(work->Wait(10) == 0);
  REQUIRE(a->Wait(60) == 0);
  REQUIRE(b->Wait(60) == 0);

  // Agent mode: leaf function shares within the workload's own binary.
  std::map<std::string, int64_t> by_agent, by_addr2line;
  int64_t agent_total = 0, server_total = 0;
  for (const std::string& f : ProfileFiles(agent_out.path(), pid, "process_cpu-")) {
    RawProfile p = ReadWithPprof(f);
    for (const auto& s : p.samples) {
      const auto& leaf = p.locations[s.location_ids.front()];
      if (p.mapping_files[leaf.mapping_id] != bin) continue;
      by_agent[leaf.function] += s.values[0];
      agent_total += s.values[0];
    }
  }
  // Server mode: the same leaves' addresses, named by addr2line. Mappings of the binary carry
  // its build id and no functions; pprof accepts the profile (ReadWithPprof).
  std::map<uint64_t, int64_t> leaf_addresses;
  for (const std::string& f : ProfileFiles(server_out.path(), pid, "process_cpu-")) {
    std::string raw = Output(absl::StrCat(PS_PPROF_BIN, " -raw -symbolize=none '", f, "'"));
    RawProfile p = ReadWithPprof(f);
    std::map<uint64_t, uint64_t> address_of;  // location id -> address
    std::string build_id_line;
    bool in_locations = false, in_mappings = false;
    for (absl::string_view l : absl::StrSplit(raw, '\n')) {
      absl::string_view t = absl::StripAsciiWhitespace(l);
      if (t == "Locations") in_locations = true;
      if (t == "Mappings") in_mappings = true, in_locations = false;
      size_t colon = t.find(": 0x");
      uint64_t id = 0;
      if (colon == absl::string_view::npos || !absl::SimpleAtoi(t.substr(0, colon), &id)) continue;
      absl::string_view rest = t.substr(colon + 2);
      if (in_locations) {
        uint64_t addr = 0;
        absl::string_view hex = rest.substr(2, rest.find(' ') - 2);
        REQUIRE(absl::SimpleHexAtoi(hex, &addr));
        address_of[id] = addr;
      } else if (in_mappings && absl::StrContains(rest, bin)) {
        build_id_line = std::string(rest);
      }
    }
    INFO("mapping: " << build_id_line);
    CHECK_FALSE(absl::StrContains(build_id_line, "[FN]"));  // has_functions = false
    CHECK(absl::StrContains(build_id_line,
                            Output("readelf -n " + bin + " | sed -n 's/.*Build ID: //p'")));
    for (const auto& s : p.samples) {
      uint64_t leaf = s.location_ids.front();
      if (p.mapping_files[p.locations[leaf].mapping_id] != bin) continue;
      leaf_addresses[address_of[leaf]] += s.values[0];
      server_total += s.values[0];
    }
  }
  REQUIRE_FALSE(leaf_addresses.empty());
  std::string addrs;
  for (const auto& [addr, n] : leaf_addresses) absl::StrAppend(&addrs, " 0x", absl::Hex(addr));
  std::vector<std::string> names = absl::StrSplit(Output("addr2line -f -e " + bin + addrs), '\n');
  REQUIRE(names.size() == 2 * leaf_addresses.size());  // function, then file:line
  size_t i = 0;
  for (const auto& [addr, n] : leaf_addresses) {
    by_addr2line[names[2 * i]] += n;
    ++i;
  }
  std::ostringstream figures;
  for (const auto& [fn, n] : by_agent) {
    figures << fn << " agent " << double(n) / agent_total << " addr2line "
            << double(by_addr2line[fn]) / std::max<int64_t>(server_total, 1) << "; ";
  }
  FIGURES("leaf shares in " << bin << ": " << figures.str() << "samples agent=" << agent_total
                            << " server=" << server_total);
  CHECK(agent_total >= 500);
  CHECK(server_total >= 500);
  // The same set of functions, with the same shares within sampling noise.
  std::set<std::string> a_names, s_names;
  for (const auto& [fn, n] : by_agent) if (double(n) / agent_total > 0.02) a_names.insert(fn);
  for (const auto& [fn, n] : by_addr2line) {
    if (double(n) / server_total > 0.02) s_names.insert(fn);
  }
  CHECK(a_names == s_names);
  for (const std::string& fn : a_names) {
    CHECK(std::abs(double(by_agent[fn]) / agent_total - double(by_addr2line[fn]) / server_total) <
          0.05);
  }
}

}  // namespace
}  // namespace parascope::testing
