#include "agent/profile/profile_set.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <map>
#include <set>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
#include "agent/profile/profile_merge.h"
#include "bpf/abi.h"

// Functions of this test binary (a PIE) that the symbolizer must name through /proc/self.
extern "C" __attribute__((noinline)) int ps_cpu_profiles_leaf(int x) {
  asm volatile("" ::: "memory");
  return x + 1;
}
namespace ps_test {
__attribute__((noinline)) int Caller(int x) { return ps_cpu_profiles_leaf(x) * 2; }
}  // namespace ps_test

namespace parascope {
namespace {

using perftools::profiles::Profile;

struct Resolved {
  std::vector<std::string> functions;  // innermost function per location, leaf first
  std::vector<std::string> mappings;
  std::vector<uint64_t> addresses;
};

Resolved Resolve(const Profile& p, int sample) {
  Resolved r;
  for (uint64_t id : p.sample(sample).location_id()) {
    const auto& loc = p.location(id - 1);
    r.addresses.push_back(loc.address());
    r.functions.push_back(
        loc.line_size() ? p.string_table(p.function(loc.line(0).function_id() - 1).name()) : "");
    r.mappings.push_back(loc.mapping_id() ? p.string_table(p.mapping(loc.mapping_id() - 1).filename())
                                          : "");
  }
  return r;
}

proc::ProcessKey KeyOf(const std::string& pid) {
  auto text = proc::ReadFileToString("/proc/" + pid + "/stat");
  REQUIRE(text.ok());
  auto st = proc::ParseStat(*text);
  REQUIRE(st.ok());
  return {static_cast<uint32_t>(st->pid), proc::TicksToNs(st->start_time_ticks)};
}

proc::ProcessKey SelfKey() { return KeyOf("self"); }

// What pprof shows of a profile's samples, by label set and stack: the labels as key=value
// (sorted), then each frame as its mapping's file and file offset (address - memory_start +
// file_offset, what pprof symbolizes by) and its functions, leaf first; values summed.
std::map<std::string, std::vector<int64_t>> Canonical(const Profile& p) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& s : p.sample()) {
    std::vector<std::string> labels;
    for (const auto& l : s.label()) {
      labels.push_back(
          absl::StrCat(p.string_table(l.key()), "=",
                       l.str() != 0 ? p.string_table(l.str()) : absl::StrCat(l.num())));
    }
    std::sort(labels.begin(), labels.end());
    std::string key = absl::StrJoin(labels, ",");
    for (uint64_t id : s.location_id()) {
      const auto& loc = p.location(static_cast<int>(id - 1));
      absl::StrAppend(&key, " |");
      if (loc.mapping_id() != 0) {
        const auto& m = p.mapping(static_cast<int>(loc.mapping_id() - 1));
        absl::StrAppend(&key, p.string_table(m.filename()), "+0x",
                        absl::Hex(loc.address() - m.memory_start() + m.file_offset()));
      }
      for (const auto& line : loc.line()) {
        absl::StrAppend(&key, " ", p.string_table(p.function(line.function_id() - 1).name()), ":",
                        line.line());
      }
    }
    std::vector<int64_t>& v = out[key];
    v.resize(s.value_size());
    for (int i = 0; i < s.value_size(); ++i) v[i] += s.value(i);
  }
  return out;
}

}  // namespace

TEST_CASE("ProfileSet symbolizes this binary's functions and kernel frames", "[profile]") {
  proc::ProcessTable processes;  // the real /proc
  symbolize::ElfCache elfs;
  auto kallsyms = symbolize::Kallsyms::Load(std::string(PS_FIXTURE_DIR) + "/kallsyms.txt");
  REQUIRE(kallsyms.ok());
  StackSymbolizer symbolizer(&processes, &elfs, &*kallsyms);
  ProfileOptions opts;
  opts.period_ns = 52631579;
  opts.period_is_ns = true;
  opts.description = "test";
  opts.types = *ParseProfileTypes("cpu");
  ProfileSet set(opts, &symbolizer, &processes);
  REQUIRE(ps_test::Caller(1) == 4);

  OnCpuRecord r;
  r.process = SelfKey();
  r.tid = r.process.tgid;
  r.thread_name = "unit_tests";
  r.stacks.kernel_ips = {0xffffffff81001010, 0xffffffffc0a01804};  // do_one_initcall, nvme_submit_cmd
  // Leaf: inside ps_cpu_profiles_leaf; caller frame: a return address just past a call in
  // Caller (+1 so that the ip - 1 lookup still lands inside Caller).
  r.stacks.user_ips = {reinterpret_cast<uint64_t>(&ps_cpu_profiles_leaf) + 1,
                reinterpret_cast<uint64_t>(&ps_test::Caller) + 1};
  r.count = 3;
  r.period_sum = 3 * 52631578;
  set.AddOnCpu(r);

  auto out = set.Finish(1000, 2000);
  REQUIRE(out.size() == 1);
  const Profile& p = *out[0].profile;
  CHECK(out[0].type == "process_cpu");
  CHECK(out[0].process == r.process);
  CHECK(out[0].process_name == "unit_tests");
  REQUIRE(p.sample_size() == 1);
  CHECK(p.sample(0).value(0) == 3);
  CHECK(p.sample(0).value(1) == 3 * 52631578);  // cpu-clock: the actual periods, in ns
  Resolved res = Resolve(p, 0);
  REQUIRE(res.functions.size() == 4);
  CHECK(res.functions[0] == "do_one_initcall");
  CHECK(res.functions[1] == "nvme_submit_cmd");
  CHECK(res.mappings[0] == "[kernel.kallsyms]");
  CHECK(res.mappings[1] == "[kernel.kallsyms]");
  CHECK(res.functions[2] == "ps_cpu_profiles_leaf");
  CHECK(res.functions[3] == "ps_test::Caller(int)");
  CHECK(res.addresses[2] == r.stacks.user_ips[0]);  // raw addresses are kept
  CHECK(res.mappings[2] == res.mappings[3]);
  CHECK(res.mappings[2].find("unit_tests") != std::string::npos);
  // Labels for local files.
  REQUIRE(p.sample(0).label_size() == 2);
  CHECK(p.string_table(p.sample(0).label(0).str()) == "unit_tests");
  CHECK(p.sample(0).label(1).num() == r.tid);
  // Build id of the user mapping is present (the test binary is linked with one by default).
  const auto& m = p.mapping(p.location(2).mapping_id() - 1);
  CHECK(p.string_table(m.build_id()).size() == 40);
  CHECK(set.Finish(3000, 1).empty());  // reset after Finish
}

TEST_CASE("ProfileSet marks lost and truncated stacks and keeps unsymbolized frames",
          "[profile]") {
  proc::ProcessTable processes(std::string(PS_FIXTURE_DIR) + "/proc/root");
  symbolize::ElfCache elfs;
  StackSymbolizer symbolizer(&processes, &elfs, nullptr);
  ProfileOptions opts;
  opts.period_ns = 1000;
  opts.period_is_ns = false;
  opts.thread_labels = false;
  opts.types = *ParseProfileTypes("cpu");
  ProfileSet set(opts, &symbolizer, &processes);
  proc::ProcessKey key{4242, proc::TicksToNs(123456)};

  OnCpuRecord lost;
  lost.process = key;
  lost.tid = 4243;
  lost.stacks.user_stack_err = -14;
  lost.stacks.kernel_ips = {0xffffffff81001010};
  lost.count = 2;
  lost.period_sum = 123;  // cycles: ignored, cpu = count * period_ns
  set.AddOnCpu(lost);

  OnCpuRecord deep;
  deep.process = key;
  deep.tid = 4242;
  deep.stacks.user_ips.assign(PS_MAX_STACK_DEPTH, 0x55d4c8a3f010);  // in /usr/bin/myserver r-xp
  deep.stacks.user_unwind = PS_UNWIND_TRUNCATED;
  deep.count = 1;
  set.AddOnCpu(deep);

  // A walk that stopped early (no CFI for a pc, no frame pointer) ends in a synthetic frame
  // naming why; a full-depth stack that the walker completed is not truncated.
  OnCpuRecord stopped;
  stopped.process = key;
  stopped.tid = 4244;
  stopped.stacks.user_ips = {0x55d4c8a3f010, 0x55d4c8a3f020};
  stopped.stacks.user_unwind = PS_UNWIND_NO_TABLE_PC;
  stopped.count = 1;
  set.AddOnCpu(stopped);
  OnCpuRecord exact;
  exact.process = key;
  exact.tid = 4245;
  exact.stacks.user_ips.assign(PS_MAX_STACK_DEPTH, 0x55d4c8a3f030);
  exact.stacks.user_unwind = PS_UNWIND_COMPLETE;
  exact.count = 1;
  set.AddOnCpu(exact);

  auto out = set.Finish(0, 1);
  REQUIRE(out.size() == 1);
  CHECK(out[0].process_name == "myserver");
  const Profile& p = *out[0].profile;
  REQUIRE(p.sample_size() == 4);
  CHECK(p.sample(0).value(1) == 2000);
  CHECK(p.sample(0).label_size() == 0);
  Resolved a = Resolve(p, 0);
  REQUIRE(a.functions.size() == 2);
  CHECK(a.functions[0].empty());  // no kallsyms: address kept in the kernel mapping
  CHECK(a.mappings[0] == "[kernel.kallsyms]");
  CHECK(a.addresses[0] == 0xffffffff81001010);
  CHECK(a.functions[1] == "[unknown]");

  Resolved b = Resolve(p, 1);
  REQUIRE(b.functions.size() == PS_MAX_STACK_DEPTH + 1);
  CHECK(b.functions.back() == "[truncated]");
  CHECK(b.mappings[0] == "/usr/bin/myserver");  // unreadable file: mapping and address kept
  CHECK(b.addresses[0] == 0x55d4c8a3f010);
  Resolved c = Resolve(p, 2);
  REQUIRE(c.functions.size() == 3);
  CHECK(c.functions.back() == "[incomplete: no unwind info]");
  Resolved d = Resolve(p, 3);
  REQUIRE(d.functions.size() == PS_MAX_STACK_DEPTH);
  CHECK(d.functions.back().empty());
  CHECK(set.stats().user_stack_lost == 2);
  CHECK(set.stats().truncated == 1);
  CHECK(set.stats().user_stack_incomplete == 1);
  // Misses count distinct addresses per profile (leaf and caller kinds), not occurrences.
  CHECK(symbolizer.stats().no_elf == 5);
  CHECK(set.stats().samples == 5);
}

}  // namespace parascope

namespace parascope {

TEST_CASE("ParallelismBucket follows SPEC's label values", "[profile]") {
  CHECK(ParallelismBucket(0) == "1");
  CHECK(ParallelismBucket(1) == "1");
  CHECK(ParallelismBucket(8) == "8");
  CHECK(ParallelismBucket(9) == "9-16");
  CHECK(ParallelismBucket(16) == "9-16");
  CHECK(ParallelismBucket(17) == "17-32");
  CHECK(ParallelismBucket(64) == "33-64");
  CHECK(ParallelismBucket(65) == "65+");
}

TEST_CASE("ParseProfileTypes", "[profile]") {
  auto t = ParseProfileTypes("cpu,latency");
  REQUIRE(t.ok());
  CHECK(t->has(ProfileType::kCpu));
  CHECK(t->has(ProfileType::kLatency));
  CHECK(!t->has(ProfileType::kOffCpu));
  CHECK(t->needs_sched());
  CHECK(!t->needs_offcpu());
  CHECK(!ParseProfileTypes("cpu,bogus").ok());
  CHECK(!ParseProfileTypes("").ok());
  CHECK(!ParseProfileTypes("cpu")->needs_sched());
}

TEST_CASE("ProfileSet builds off_cpu wall and latency with SPEC's types and labels",
          "[profile]") {
  proc::ProcessTable processes(std::string(PS_FIXTURE_DIR) + "/proc/root");
  symbolize::ElfCache elfs;
  StackSymbolizer symbolizer(&processes, &elfs, nullptr);
  ProfileOptions opts;
  opts.period_ns = 1000000;
  opts.period_is_ns = true;
  ProfileSet set(opts, &symbolizer, &processes);
  proc::ProcessKey key{4242, proc::TicksToNs(123456)};
  // Off-CPU records first makes the wall profile a copy of the off_cpu one (ForkWall); on-CPU
  // first builds it directly. Both must give the same profiles.
  const bool offcpu_first = GENERATE(false, true);
  INFO("off-CPU records first: " << offcpu_first);

  OffCpuRecord off;
  off.process = key;
  off.tid = 4243;
  off.thread_name = "worker";
  off.stacks.user_ips = {0x55d4c8a3f020};
  off.state = PS_STATE_SLEEPING;
  off.ns = 5000000;
  off.count = 2;
  if (offcpu_first) set.AddOffCpu(off);

  OnCpuRecord on;
  on.process = key;
  on.tid = 4243;
  on.thread_name = "worker";
  on.stacks.user_ips = {0x55d4c8a3f010};
  on.parallelism = 2;
  on.count = 3;
  on.period_sum = 3000000;
  set.AddOnCpu(on);
  on.parallelism = 1;
  on.parallelism_unknown = true;
  on.count = 1;
  on.period_sum = 1000000;
  set.AddOnCpu(on);

  if (!offcpu_first) set.AddOffCpu(off);
  set.AddRuntime({key, 4100000});

  auto out = set.Finish(0, 10000000);
  REQUIRE(out.size() == 4);
  std::map<std::string, const perftools::profiles::Profile*> by_type;
  for (const auto& p : out) by_type[p.type] = p.profile.get();
  auto str = [](const perftools::profiles::Profile& p, int64_t i) { return p.string_table(i); };
  auto label = [&](const perftools::profiles::Profile& p, int s, const std::string& k) {
    for (const auto& l : p.sample(s).label()) {
      if (str(p, l.key()) == k) return l.str() ? str(p, l.str()) : std::to_string(l.num());
    }
    return std::string("<none>");
  };

  const auto& cpu = *by_type.at("process_cpu");
  REQUIRE(cpu.sample_size() == 1);  // parallelism does not split process_cpu samples
  CHECK(cpu.sample(0).value(0) == 4);
  CHECK(cpu.sample(0).value(1) == 4000000);
  bool exact_comment = false;
  for (int64_t c : cpu.comment()) {
    exact_comment |= str(cpu, c).find("exact from sched_switch 4100000 ns") != std::string::npos;
  }
  CHECK(exact_comment);

  const auto& lat = *by_type.at("latency");
  REQUIRE(lat.sample_type_size() == 1);
  CHECK(str(lat, lat.sample_type(0).type()) == "latency");
  CHECK(str(lat, lat.period_type().type()) == "cpu");
  REQUIRE(lat.sample_size() == 2);
  CHECK(lat.sample(0).value(0) == 1500000);  // 3 samples * 1 ms / 2 threads
  CHECK(label(lat, 0, "parallelism") == "2");
  CHECK(lat.sample(1).value(0) == 1000000);
  CHECK(label(lat, 1, "parallelism") == "1");
  CHECK(lat.comment_size() == 1);  // the mid-run note

  const auto& offp = *by_type.at("off_cpu");
  REQUIRE(offp.sample_type_size() == 1);
  CHECK(str(offp, offp.sample_type(0).type()) == "off_cpu");
  CHECK(offp.period() == 0);
  REQUIRE(offp.sample_size() == 1);
  CHECK(offp.sample(0).value(0) == 5000000);
  CHECK(label(offp, 0, "state") == "sleeping");
  CHECK(label(offp, 0, "thread_name") == "worker");
  CHECK(label(offp, 0, "tid") == "4243");

  const auto& wall = *by_type.at("wall");
  REQUIRE(wall.sample_type_size() == 1);
  CHECK(str(wall, wall.sample_type(0).type()) == "wall");
  CHECK(str(wall, wall.sample_type(0).unit()) == "nanoseconds");
  CHECK(str(wall, wall.period_type().type()) == "wall");
  CHECK(str(wall, wall.period_type().unit()) == "nanoseconds");
  CHECK(wall.period() == 1000000);
  REQUIRE(wall.sample_size() == 2);  // running (both on-CPU records: same stack and labels)
                                     // and sleeping
  int64_t running = 0, sleeping = 0;
  for (int i = 0; i < wall.sample_size(); ++i) {
    (label(wall, i, "state") == "running" ? running : sleeping) += wall.sample(i).value(0);
  }
  CHECK(running == 4000000);
  CHECK(sleeping == 5000000);
  // Every sample's leaf Location is at the record's address, whichever way the profile was made.
  std::set<uint64_t> leaf_addresses;
  for (int i = 0; i < wall.sample_size(); ++i) {
    leaf_addresses.insert(wall.location(wall.sample(i).location_id(0) - 1).address());
  }
  CHECK(leaf_addresses == std::set<uint64_t>{0x55d4c8a3f010, 0x55d4c8a3f020});
  CHECK(set.stats().offcpu_ns == 5000000);
  CHECK(set.stats().samples_parallelism_unknown == 1);
}

}  // namespace parascope

namespace parascope {

// --latency-group=tree|cgroup: the records of several processes go into one owner's profiles;
// each sample names its process, and one address in two programs is two Locations.
TEST_CASE("ProfileSet puts a group's processes in one profile, labelled and kept apart",
          "[profile]") {
  proc::ProcessTable processes;  // the real /proc: this test process is symbolized
  symbolize::ElfCache elfs;
  StackSymbolizer symbolizer(&processes, &elfs, nullptr);
  ProfileOptions opts;
  opts.period_ns = 1000000;
  opts.period_is_ns = true;
  opts.types = *ParseProfileTypes("cpu,latency");
  ProfileSet set(opts, &symbolizer, &processes);
  REQUIRE(ps_test::Caller(1) == 4);

  const proc::ProcessKey self = SelfKey();
  const proc::ProcessKey gone{999999, proc::TicksToNs(1), 7};  // not in /proc: unsymbolized
  ProfileOwner owner;
  owner.process = self;
  owner.group.kind = ProfileGroup::Kind::kTree;
  owner.group.id = self.tgid;
  const uint64_t leaf = reinterpret_cast<uint64_t>(&ps_cpu_profiles_leaf) + 1;
  for (const proc::ProcessKey& k : {self, gone}) {
    OnCpuRecord r;
    r.process = k;
    r.tid = k.tgid;
    r.thread_name = k == self ? "self-thread" : "cc1";
    r.stacks.user_ips = {leaf};  // the same address in both processes
    r.parallelism = 2;
    r.group = self.tgid;
    r.count = 1;
    r.period_sum = 1000000;
    set.AddOnCpu(r, &owner);
  }
  std::vector<ProcessProfile> out = set.Finish(0, 1000000000);
  REQUIRE(out.size() == 2);  // one process_cpu and one latency profile for the whole group
  for (const ProcessProfile& p : out) {
    INFO(p.type);
    CHECK(p.process == self);
    CHECK(p.group.kind == ProfileGroup::Kind::kTree);
    const auto& prof = *p.profile;
    REQUIRE(prof.sample_size() == 2);
    auto label = [&](int s, const std::string& k) {
      for (const auto& l : prof.sample(s).label()) {
        if (prof.string_table(l.key()) == k) {
          return l.str() ? prof.string_table(l.str()) : std::to_string(l.num());
        }
      }
      return std::string("<none>");
    };
    CHECK(label(0, "pid") == std::to_string(self.tgid));
    CHECK(label(1, "pid") == "999999");
    CHECK(label(1, "process") == "cc1");  // exited: the thread's comm stands for the process's
    CHECK(label(0, "process") != "<none>");
    CHECK(prof.sample(0).location_id(0) != prof.sample(1).location_id(0));
    CHECK(Resolve(prof, 0).functions[0] == "ps_cpu_profiles_leaf");
    CHECK(Resolve(prof, 1).functions[0] == "");
    bool comment = false;
    for (int64_t c : prof.comment()) {
      comment |= prof.string_table(c).find("--latency-group=tree") != std::string::npos;
    }
    CHECK(comment);
  }
}

// Process churn past the file exporter's directory budget (export/file_exporter.h): the agent
// builds the images it merges straight into one overflow group. Its profiles must hold what
// the images' own profiles merged by ProfileMerger hold: per pid, labels and stack the same
// values, and, for two running processes of one PIE program at two ASLR bases, one Mapping of
// the program with both processes' pcs at one Location, as the merge makes them.
TEST_CASE("ProfileSet's overflow group holds what merging each image's own profiles gives",
          "[profile]") {
  proc::ProcessTable processes;  // the real /proc
  symbolize::ElfCache elfs;
  StackSymbolizer symbolizer(&processes, &elfs, nullptr);
  ProfileOptions opts;
  opts.period_ns = 1000000;
  opts.period_is_ns = true;
  opts.thread_labels = GENERATE(true, false);  // pid is labelled either way
  INFO("thread labels: " << opts.thread_labels);

  // Two processes of one program (posix_spawn returns once the child has exec'd) and the text
  // address at one file offset in each.
  struct Children {  // killed and reaped however the test ends
    std::vector<pid_t> pids;
    ~Children() {
      for (pid_t pid : pids) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } children;
  std::vector<proc::ProcessKey> keys;
  std::vector<uint64_t> pcs;
  std::string program;
  for (int i = 0; i < 2; ++i) {
    pid_t pid = 0;
    char arg0[] = "sleep", arg1[] = "60";
    char* argv[] = {arg0, arg1, nullptr};
    REQUIRE(posix_spawn(&pid, "/bin/sleep", nullptr, nullptr, argv, environ) == 0);
    children.pids.push_back(pid);
    keys.push_back(KeyOf(std::to_string(pid)));
    // posix_spawn returns once execve(2) has replaced the old image, before the new one is
    // mapped (the vfork parent is released at exec_mmap): read until the program's text shows.
    absl::StatusOr<std::string> maps;
    uint64_t pc = 0;
    for (int tries = 0; pc == 0 && tries < 100000; ++tries) {
      maps = proc::ReadFileToString(absl::StrCat("/proc/", pid, "/maps"));
      REQUIRE(maps.ok());
      for (absl::string_view line : absl::StrSplit(*maps, '\n')) {
        std::vector<absl::string_view> f = absl::StrSplit(line, ' ', absl::SkipEmpty());
        if (f.size() < 6 || f[1] != "r-xp" || !absl::EndsWith(f[5], "/sleep")) continue;
        program = std::string(f[5]);
        uint64_t start = 0;
        REQUIRE(absl::SimpleHexAtoi(f[0].substr(0, f[0].find('-')), &start));
        pc = start + 0x40;  // the same file offset in both
        break;
      }
    }
    INFO("/proc/" << pid << "/maps:\n" << *maps);
    REQUIRE(pc != 0);
    pcs.push_back(pc);
  }
  REQUIRE(pcs[0] != pcs[1]);  // two bases (a PIE under ASLR)
  const proc::ProcessKey gone{999999, proc::TicksToNs(1), 7};
  keys.push_back(gone);
  pcs.push_back(0x401234);

  // Each image's records: an off-CPU interval and an on-CPU sample in its program's text.
  std::vector<std::vector<OffCpuRecord>> off(keys.size());
  std::vector<std::vector<OnCpuRecord>> on(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    OffCpuRecord o;
    o.process = keys[i];
    // The exited image's first record is a worker thread's: its comm does not name the
    // process (the main thread's would).
    o.tid = keys[i].tgid + (i < 2 ? 0 : 1);
    o.thread_name = i < 2 ? "sleep" : "cc1-worker";
    o.stacks.user_ips = {pcs[i], pcs[i] + 8};
    o.state = PS_STATE_SLEEPING;
    o.ns = 1000 * (i + 1);
    o.count = 1;
    off[i].push_back(o);
    OnCpuRecord r;
    r.process = keys[i];
    r.tid = keys[i].tgid;
    r.thread_name = i < 2 ? "sleep" : "cc1";
    r.stacks.user_ips = {pcs[i]};
    r.stacks.kernel_stack_err = PS_ERR_NOT_CAPTURED;
    r.parallelism = 2;
    r.count = 1;
    r.period_sum = 1000000 + i;
    on[i].push_back(r);
  }

  // Each image on its own, merged after (what the file exporter does with Export).
  ProfileSet own(opts, &symbolizer, &processes);
  std::map<std::string, ProfileMerger> merged;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const OffCpuRecord& o : off[i]) own.AddOffCpu(o);
    for (const OnCpuRecord& r : on[i]) own.AddOnCpu(r);
    for (ProcessProfile& p : own.Finish(0, 1000000000)) {
      REQUIRE(merged[p.type].Add(*p.profile, p.process.tgid, p.process_name).ok());
    }
  }
  // All images in one overflow group.
  ProfileSet group(opts, &symbolizer, &processes);
  ProfileOwner owner;
  owner.group.kind = ProfileGroup::Kind::kOverflow;
  for (size_t i = 0; i < keys.size(); ++i) {
    for (const OffCpuRecord& o : off[i]) group.AddOffCpu(o, &owner);
    for (const OnCpuRecord& r : on[i]) group.AddOnCpu(r, &owner);
  }
  CHECK(group.approx_bytes() > 0);
  std::vector<ProcessProfile> out = group.Finish(0, 1000000000);
  REQUIRE(out.size() == 4);
  for (ProcessProfile& p : out) {
    INFO(p.type);
    CHECK(p.group.kind == ProfileGroup::Kind::kOverflow);
    CHECK(p.group_processes == 3);
    REQUIRE(merged.count(p.type) == 1);
    const Profile expected = merged[p.type].Take();
    const auto got = Canonical(*p.profile);
    CHECK(got == Canonical(expected));
    CHECK(got.size() == (p.type == "wall" ? 6u : 3u));
    for (const auto& [k, v] : got) {
      CHECK(absl::StrContains(k, "pid="));
      CHECK(absl::StrContains(k, "process="));
    }
    // One Mapping of the program, as in the merge: both processes' pcs are one Location.
    int program_mappings = 0;
    for (const auto& m : p.profile->mapping()) {
      program_mappings += p.profile->string_table(m.filename()) == program;
    }
    CHECK(program_mappings == 1);
    CHECK(p.profile->location_size() == expected.location_size());
    bool comment = false;
    for (int64_t c : p.profile->comment()) {
      comment |= p.profile->string_table(c) ==
                 "parascope: the profiles of 3 process images merged; each sample's labels pid "
                 "and process name its process";
    }
    CHECK(comment);
  }
}

}  // namespace parascope
