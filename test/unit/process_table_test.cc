#include "agent/proc/process_table.h"

#include <stdlib.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "agent/proc/read_file.h"
#include "agent/proc/stat.h"

namespace parascope::proc {
namespace {

namespace fs = std::filesystem;

const std::string kRoot = std::string(PS_FIXTURE_DIR) + "/proc/root";
// Fixture 4242 has start_time 123456 ticks; a BPF-side start_boottime inside that tick.
constexpr uint64_t kStartNs = 1'234'565'432'100;
constexpr ProcessKey kKey{4242, kStartNs};

// A writable copy of the fixture proc root, removed at scope exit.
class TempProcRoot {
 public:
  TempProcRoot() {
    std::string tmpl = (fs::temp_directory_path() / "ps-proc-XXXXXX").string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    dir_ = tmpl;
    fs::copy(kRoot, dir_, fs::copy_options::recursive);
  }
  ~TempProcRoot() { fs::remove_all(dir_); }
  const std::string& dir() const { return dir_; }
  void AppendMaps(uint32_t tgid, const std::string& line) {
    std::ofstream(absl::StrCat(dir_, "/", tgid, "/maps"), std::ios::app) << line << "\n";
  }
  void Clone(uint32_t from, uint32_t to) {
    fs::copy(absl::StrCat(dir_, "/", from), absl::StrCat(dir_, "/", to),
             fs::copy_options::recursive);
  }
  void Remove(uint32_t tgid) { fs::remove_all(absl::StrCat(dir_, "/", tgid)); }

 private:
  std::string dir_;
};

__attribute__((noinline)) int FunctionInTestBinary(int x) { return x * 3 + 1; }

TEST_CASE("ProcessTable reads a process from the fixture root") {
  ProcessTable table(kRoot);
  auto info = table.Get(kKey);
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  CHECK((*info)->key == kKey);
  CHECK((*info)->comm == "myserver");
  CHECK((*info)->exe_path.empty());
  REQUIRE((*info)->maps.size() == 9);
  CHECK((*info)->maps[0].start == 0x55d4c8a3b000);
  CHECK((*info)->maps[8].path == "[vdso]");
  CHECK(table.size() == 1);
  CHECK(table.vanished() == 0);
  CHECK(table.read_errors() == 0);

  // A second Get is served from the cache: same object.
  auto again = table.Get(kKey);
  REQUIRE(again.ok());
  CHECK(*again == *info);
}

TEST_CASE("ProcessTable checks the start time, allowing one tick of rounding") {
  ProcessTable table(kRoot);
  CHECK(table.Get({4242, TicksToNs(123456)}).ok());
  CHECK(table.Get({4242, TicksToNs(123457) + 9'999'999}).ok());
  CHECK(table.Get({4242, TicksToNs(123455)}).ok());
  CHECK(table.vanished() == 0);

  auto later = table.Get({4242, TicksToNs(123458)});
  REQUIRE_FALSE(later.ok());
  CHECK(absl::IsNotFound(later.status()));
  auto earlier = table.Get({4242, TicksToNs(123454) + 9'999'999});
  REQUIRE_FALSE(earlier.ok());
  CHECK(absl::IsNotFound(earlier.status()));
  CHECK(table.vanished() == 2);
  CHECK(table.read_errors() == 0);
  CHECK(table.size() == 3);
}

TEST_CASE("ProcessTable reports missing processes once per window") {
  ProcessTable table(kRoot);
  const ProcessKey gone{9999, kStartNs};
  auto r = table.Get(gone);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsNotFound(r.status()));
  CHECK(table.vanished() == 1);
  CHECK(absl::IsNotFound(table.Get(gone).status()));
  CHECK(table.FindMapping(gone, 0x55d4c8a3f000) == nullptr);
  CHECK(table.vanished() == 1);  // cached failure, no new read
  table.EndWindow();
  CHECK(absl::IsNotFound(table.Get(gone).status()));
  CHECK(table.vanished() == 2);
  CHECK(table.size() == 0);
}

TEST_CASE("ProcessInfo::FindMapping: start inclusive, end exclusive") {
  ProcessTable table(kRoot);
  auto info = table.Get(kKey);
  REQUIRE(info.ok());
  const ProcessInfo& p = **info;
  // First executable segment 55d4c8a3f000-55d4c8a52000, followed directly by 55d4c8a52000.
  const MapEntry* m = p.FindMapping(0x55d4c8a3f000);
  REQUIRE(m != nullptr);
  CHECK(m->start == 0x55d4c8a3f000);
  CHECK(m->perms == "r-xp");
  CHECK(p.FindMapping(0x55d4c8a51fff) == m);
  m = p.FindMapping(0x55d4c8a52000);
  REQUIRE(m != nullptr);
  CHECK(m->start == 0x55d4c8a52000);
  CHECK(m->perms == "r--p");
  // Gap 55d4c8a58000-55d4c8a5a000.
  CHECK(p.FindMapping(0x55d4c8a57fff) == m);
  CHECK(p.FindMapping(0x55d4c8a58000) == nullptr);
  CHECK(p.FindMapping(0x55d4c8a59fff) == nullptr);
  REQUIRE(p.FindMapping(0x55d4c8a5a000) != nullptr);
  // Before the first and at/after the last mapping.
  CHECK(p.FindMapping(0) == nullptr);
  CHECK(p.FindMapping(0x55d4c8a3afff) == nullptr);
  REQUIRE(p.FindMapping(0x55d4c8a3b000) != nullptr);
  REQUIRE(p.FindMapping(0x7ffd5e1fbfff) != nullptr);
  CHECK(p.FindMapping(0x7ffd5e1fbfff)->path == "[vdso]");
  CHECK(p.FindMapping(0x7ffd5e1fc000) == nullptr);
  CHECK(p.FindMapping(UINT64_MAX) == nullptr);

  ProcessInfo empty;
  CHECK(empty.FindMapping(0x1000) == nullptr);
}

TEST_CASE("ProcessTable::FindMapping and HostPath") {
  ProcessTable table(kRoot);
  const MapEntry* libc = table.FindMapping(kKey, 0x7f1b3404e000 + 0x1234);
  REQUIRE(libc != nullptr);
  CHECK(libc->path == "/usr/lib/x86_64-linux-gnu/libc.so.6");
  CHECK(libc->offset == 0x26000);
  CHECK(table.HostPath(kKey, *libc) == kRoot + "/4242/root/usr/lib/x86_64-linux-gnu/libc.so.6");

  const MapEntry* jit = table.FindMapping(kKey, 0x7f1b33c40fff);
  REQUIRE(jit != nullptr);
  CHECK(jit->deleted);
  CHECK(table.HostPath(kKey, *jit) == kRoot + "/4242/map_files/7f1b33c00000-7f1b33c41000");

  const MapEntry* vdso = table.FindMapping(kKey, 0x7ffd5e1fa000);
  REQUIRE(vdso != nullptr);
  CHECK(table.HostPath(kKey, *vdso).empty());
  const MapEntry* heap = table.FindMapping(kKey, 0x55d4c9f0e000);
  REQUIRE(heap != nullptr);
  CHECK(table.HostPath(kKey, *heap).empty());

  CHECK(table.FindMapping(kKey, 0x1000) == nullptr);
  CHECK(table.FindMapping({4242, TicksToNs(200000)}, 0x7f1b3404e000) == nullptr);
}

TEST_CASE("ProcessTable re-reads maps on a miss at most once per window") {
  TempProcRoot root;
  ProcessTable table(root.dir());
  REQUIRE(table.Get(kKey).ok());
  constexpr uint64_t kPlugin = 0x7f1b40001000;
  root.AppendMaps(4242, "7f1b40000000-7f1b40010000 r-xp 00000000 fd:01 77 /usr/lib/libdl1.so");

  // Maps were read by Get in this window: no re-read yet.
  CHECK(table.FindMapping(kKey, kPlugin) == nullptr);
  table.EndWindow();
  CHECK(table.size() == 1);  // used in the window that ended

  const MapEntry* m = table.FindMapping(kKey, kPlugin);
  REQUIRE(m != nullptr);
  CHECK(m->path == "/usr/lib/libdl1.so");
  CHECK(m->inode == 77);

  // Another library in the same window: no second re-read.
  root.AppendMaps(4242, "7f1b50000000-7f1b50010000 r-xp 00000000 fd:01 78 /usr/lib/libdl2.so");
  CHECK(table.FindMapping(kKey, 0x7f1b50000000) == nullptr);
  table.EndWindow();
  m = table.FindMapping(kKey, 0x7f1b50000000);
  REQUIRE(m != nullptr);
  CHECK(m->path == "/usr/lib/libdl2.so");
  CHECK(table.vanished() == 0);
  CHECK(table.read_errors() == 0);
}

TEST_CASE("ProcessTable keeps cached maps when the process exits") {
  TempProcRoot root;
  ProcessTable table(root.dir());
  REQUIRE(table.Get(kKey).ok());
  table.EndWindow();
  root.Remove(4242);
  CHECK(table.FindMapping(kKey, 0x10) == nullptr);  // miss -> re-read fails
  CHECK(table.vanished() == 1);
  const MapEntry* m = table.FindMapping(kKey, 0x55d4c8a3f000);
  REQUIRE(m != nullptr);
  CHECK(m->path == "/usr/bin/myserver");
  CHECK(table.Get(kKey).ok());
}

TEST_CASE("ProcessTable forgets processes not used during a window") {
  ProcessTable table(kRoot);
  REQUIRE(table.Get(kKey).ok());
  table.EndWindow();
  CHECK(table.size() == 1);
  table.EndWindow();
  CHECK(table.size() == 0);
}

TEST_CASE("ProcessTable eviction prefers idle entries, then least recently used") {
  TempProcRoot root;
  root.Clone(4242, 1);
  root.Clone(4242, 2);
  root.Clone(4242, 3);
  const ProcessKey k1{1, kStartNs}, k2{2, kStartNs}, k3{3, kStartNs};
  ProcessTable table(root.dir(), 2);

  SECTION("idle in the current window first") {
    REQUIRE(table.Get(k1).ok());
    REQUIRE(table.Get(k2).ok());
    table.EndWindow();
    REQUIRE(table.Get(k2).ok());
    REQUIRE(table.Get(k1).ok());
    REQUIRE(table.Get(k3).ok());  // both k1 and k2 used this window: evicts LRU k2
    CHECK(table.size() == 2);
    table.EndWindow();
    REQUIRE(table.Get(k3).ok());
    REQUIRE(table.Get(k2).ok());  // k1 idle in this window: evicted
    CHECK(table.size() == 2);
    root.Remove(1);
    root.Remove(2);
    root.Remove(3);
    CHECK(table.Get(k2).ok());
    CHECK(table.Get(k3).ok());
    CHECK(absl::IsNotFound(table.Get(k1).status()));
  }
  SECTION("least recently used") {
    REQUIRE(table.Get(k1).ok());
    REQUIRE(table.Get(k2).ok());
    REQUIRE(table.Get(k1).ok());
    REQUIRE(table.Get(k3).ok());
    CHECK(table.size() == 2);
    root.Remove(1);
    root.Remove(2);
    root.Remove(3);
    CHECK(table.Get(k1).ok());
    CHECK(table.Get(k3).ok());
    CHECK(absl::IsNotFound(table.Get(k2).status()));
  }
}

TEST_CASE("ProcessTable counts unparsable /proc text as read errors") {
  TempProcRoot root;
  root.AppendMaps(4242, "not a maps line");
  ProcessTable table(root.dir());
  auto r = table.Get(kKey);
  REQUIRE_FALSE(r.ok());
  CHECK(absl::IsInvalidArgument(r.status()));
  CHECK(table.read_errors() == 1);
  CHECK(table.vanished() == 0);
  CHECK(table.size() == 0);
}

TEST_CASE("ProcessTable falls back to stat's comm") {
  TempProcRoot root;
  fs::remove(root.dir() + "/4242/comm");
  ProcessTable table(root.dir());
  auto r = table.Get(kKey);
  REQUIRE(r.ok());
  CHECK((*r)->comm == "myserver");
}

TEST_CASE("ReadFileToString and ReadLink") {
  auto missing = ReadFileToString(kRoot + "/4242/nonexistent");
  REQUIRE_FALSE(missing.ok());
  CHECK(absl::IsNotFound(missing.status()));
  auto comm = ReadFileToString(kRoot + "/4242/comm");
  REQUIRE(comm.ok());
  CHECK(*comm == "myserver\n");
  // /proc files report st_size 0; the reader must still return all of them.
  auto maps = ReadFileToString("/proc/self/maps");
  REQUIRE(maps.ok());
  CHECK(maps->size() > 100);
  CHECK(maps->back() == '\n');
  CHECK(absl::IsNotFound(ReadLink(kRoot + "/4242/exe").status()));
  auto self = ReadLink("/proc/self/exe");
  REQUIRE(self.ok());
  CHECK(fs::equivalent(*self, "/proc/self/exe"));
}

TEST_CASE("ProcessTable against the real /proc/self") {
  auto stat_text = ReadFileToString("/proc/self/stat");
  REQUIRE(stat_text.ok());
  auto st = ParseStat(*stat_text);
  REQUIRE(st.ok());
  REQUIRE(st->pid == getpid());
  const ProcessKey self{static_cast<uint32_t>(getpid()), st->start_time_ticks * 10'000'000};

  ProcessTable table;
  auto info = table.Get(self);
  INFO(info.status().ToString());
  REQUIRE(info.ok());
  CHECK((*info)->comm == st->comm);
  auto exe = ReadLink("/proc/self/exe");
  REQUIRE(exe.ok());
  CHECK((*info)->exe_path == *exe);
  CHECK_FALSE((*info)->maps.empty());

  CHECK(FunctionInTestBinary(1) == 4);
  const MapEntry* text =
      table.FindMapping(self, reinterpret_cast<uintptr_t>(&FunctionInTestBinary));
  REQUIRE(text != nullptr);
  CHECK(text->executable());
  CHECK(text->file_backed());
  CHECK(text->path == *exe);
  std::string host = table.HostPath(self, *text);
  CHECK(host == absl::StrCat("/proc/", getpid(), "/root", *exe));
  CHECK(access(host.c_str(), R_OK) == 0);

  int on_stack = 0;
  const MapEntry* stack = table.FindMapping(self, reinterpret_cast<uintptr_t>(&on_stack));
  REQUIRE(stack != nullptr);
  CHECK(stack->path == "[stack]");

  auto reused = table.Get({self.tgid, self.start_boot_ns + TicksToNs(2)});
  REQUIRE_FALSE(reused.ok());
  CHECK(absl::IsNotFound(reused.status()));
  CHECK(table.vanished() == 1);
  CHECK(table.read_errors() == 0);
}

}  // namespace
}  // namespace parascope::proc
