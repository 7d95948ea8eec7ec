#include "agent/profile/profile_set.h"

#include <catch2/catch.hpp>

#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"
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

proc::ProcessKey SelfKey() {
  auto text = proc::ReadFileToString("/proc/self/stat");
  REQUIRE(text.ok());
  auto st = proc::ParseStat(*text);
  REQUIRE(st.ok());
  return {static_cast<uint32_t>(st->pid), proc::TicksToNs(st->start_time_ticks)};
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
  const Profile& p = out[0].profile;
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
  deep.count = 1;
  set.AddOnCpu(deep);

  auto out = set.Finish(0, 1);
  REQUIRE(out.size() == 1);
  CHECK(out[0].process_name == "myserver");
  const Profile& p = out[0].profile;
  REQUIRE(p.sample_size() == 2);
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
  CHECK(set.stats().user_stack_lost == 2);
  CHECK(set.stats().truncated == 1);
  CHECK(symbolizer.stats().no_elf == PS_MAX_STACK_DEPTH);
  CHECK(set.stats().samples == 3);
}

}  // namespace parascope
