#include "agent/proc/process_table.h"

#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
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
  // Executable mappings only: the only ones a pc can be in.
  REQUIRE((*info)->maps.size() == 4);
  // ... and no room kept for the others: a snapshot lives as long as its process.
  CHECK((*info)->maps.capacity() == 4);
  CHECK((*info)->maps[0].start == 0x55d4c8a3f000);
  CHECK((*info)->maps[3].path == "[vdso]");
  CHECK((*info)->files.size() == 4);
  CHECK_FALSE((*info)->snapshot);
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
  CHECK(!table.FindMapping(gone, 0x55d4c8a3f000));
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
  // The executable segment 55d4c8a3f000-55d4c8a52000; the read-only one after it is not kept.
  const MapEntry* m = p.FindMapping(0x55d4c8a3f000);
  REQUIRE(m != nullptr);
  CHECK(m->start == 0x55d4c8a3f000);
  CHECK(m->perms == "r-xp");
  CHECK(p.FindMapping(0x55d4c8a51fff) == m);
  CHECK(p.FindMapping(0x55d4c8a52000) == nullptr);
  CHECK(p.FindMapping(0x55d4c8a5a000) == nullptr);
  // Before the first and at/after the last mapping.
  CHECK(p.FindMapping(0) == nullptr);
  CHECK(p.FindMapping(0x55d4c8a3efff) == nullptr);
  REQUIRE(p.FindMapping(0x7ffd5e1fbfff) != nullptr);
  CHECK(p.FindMapping(0x7ffd5e1fbfff)->path == "[vdso]");
  CHECK(p.FindMapping(0x7ffd5e1fc000) == nullptr);
  CHECK(p.FindMapping(UINT64_MAX) == nullptr);

  ProcessInfo empty;
  CHECK(empty.FindMapping(0x1000) == nullptr);
}

TEST_CASE("ProcessTable::FindMapping and HostPath") {
  ProcessTable table(kRoot);
  MappingRef libc = table.FindMapping(kKey, 0x7f1b3404e000 + 0x1234);
  REQUIRE(libc);
  CHECK(libc->path == "/usr/lib/x86_64-linux-gnu/libc.so.6");
  CHECK(libc->offset == 0x26000);
  CHECK(libc.file == nullptr);  // read at flush (Get), not pinned
  // map_files/ first (the file itself, whatever the process's root), then root + path.
  CHECK(table.HostPaths(libc) ==
        std::vector<std::string>{kRoot + "/4242/map_files/7f1b3404e000-7f1b341a3000",
                                 kRoot + "/4242/root/usr/lib/x86_64-linux-gnu/libc.so.6"});

  MappingRef jit = table.FindMapping(kKey, 0x7f1b33c40fff);
  REQUIRE(jit);
  CHECK(jit->deleted);
  CHECK(table.HostPaths(jit) ==
        std::vector<std::string>{kRoot + "/4242/map_files/7f1b33c00000-7f1b33c41000"});

  MappingRef vdso = table.FindMapping(kKey, 0x7ffd5e1fa000);
  REQUIRE(vdso);
  CHECK(table.HostPaths(vdso).empty());
  CHECK(!table.FindMapping(kKey, 0x55d4c9f0e000));  // [heap]: not executable

  CHECK(!table.FindMapping(kKey, 0x1000));
  CHECK(!table.FindMapping({4242, TicksToNs(200000)}, 0x7f1b3404e000));
}

TEST_CASE("ProcessTable re-reads maps on a miss at most once per window") {
  TempProcRoot root;
  ProcessTable table(root.dir());
  REQUIRE(table.Get(kKey).ok());
  constexpr uint64_t kPlugin = 0x7f1b40001000;
  root.AppendMaps(4242, "7f1b40000000-7f1b40010000 r-xp 00000000 fd:01 77 /usr/lib/libdl1.so");

  // Maps were read by Get in this window: no re-read yet.
  CHECK(!table.FindMapping(kKey, kPlugin));
  table.EndWindow();
  CHECK(table.size() == 1);  // used in the window that ended

  MappingRef m = table.FindMapping(kKey, kPlugin);
  REQUIRE(m);
  CHECK(m->path == "/usr/lib/libdl1.so");
  CHECK(m->inode == 77);

  // Another library in the same window: no second re-read.
  root.AppendMaps(4242, "7f1b50000000-7f1b50010000 r-xp 00000000 fd:01 78 /usr/lib/libdl2.so");
  CHECK(!table.FindMapping(kKey, 0x7f1b50000000));
  table.EndWindow();
  m = table.FindMapping(kKey, 0x7f1b50000000);
  REQUIRE(m);
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
  CHECK(!table.FindMapping(kKey, 0x10));  // miss -> re-read fails
  CHECK(table.vanished() == 1);
  MappingRef m = table.FindMapping(kKey, 0x55d4c8a3f000);
  REQUIRE(m);
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

TEST_CASE("ProcessTable drops an idle snapshot once a later image of its process was snapshotted") {
  ProcessTable table(kRoot);
  const ProcessKey before{kKey.tgid, kKey.start_boot_ns, 1};
  const ProcessKey after{kKey.tgid, kKey.start_boot_ns, 2};
  // Another process that got the pid (another start time) supersedes nothing.
  const ProcessKey other_start{kKey.tgid, kKey.start_boot_ns + 5'000'000, 1};
  REQUIRE(table.Snapshot(before).ok());
  REQUIRE(table.Snapshot(other_start).ok());  // same tick: the fixture's stat matches it too
  table.EndWindow();
  table.EndWindow();
  CHECK(table.HasSnapshot(before));  // idle, but its process still runs: kept
  REQUIRE(table.Snapshot(after).ok());
  REQUIRE(table.Get(before).ok());  // used this window (a flush of its samples): kept
  table.EndWindow();
  CHECK(table.HasSnapshot(before));
  table.EndWindow();
  CHECK_FALSE(table.HasSnapshot(before));  // idle, and the exec since made it done
  CHECK(table.HasSnapshot(after));
  CHECK(table.HasSnapshot(other_start));
  CHECK(table.size() == 2);
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

// comm comes from stat's field 2, which prints the name as comm does, unescaped: names with
// parentheses, backslashes, tabs, newlines and quotes come out as the process set them.
TEST_CASE("ProcessTable takes comm exactly as the process named itself, from the real /proc") {
  char saved[17] = {};
  REQUIRE(prctl(PR_GET_NAME, saved) == 0);
  for (const std::string name : {"plain (x) y", "back\\slash\ttab", "new\nline) ", "a\"quote"}) {
    INFO(name);
    REQUIRE(prctl(PR_SET_NAME, name.c_str()) == 0);
    auto stat_text = ReadFileToString("/proc/self/stat");
    REQUIRE(stat_text.ok());
    auto st = ParseStat(*stat_text);
    REQUIRE(st.ok());
    ProcessTable table;
    auto info = table.Get({static_cast<uint32_t>(getpid()), st->start_time_ticks * 10'000'000});
    REQUIRE(info.ok());
    CHECK((*info)->comm == name);
  }
  REQUIRE(prctl(PR_SET_NAME, saved) == 0);
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

TEST_CASE("ReadFileAt and ReadLinkAt read through a directory fd, and name the path in errors") {
  TempProcRoot root;
  const std::string dir = root.dir() + "/4242";
  const int fd = open(dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  struct Closer {
    int fd;
    ~Closer() { close(fd); }
  } closer{fd};
  // Another directory now has the path: reads through the fd still reach the one opened.
  fs::rename(dir, root.dir() + "/4242-moved");
  fs::create_directory(dir);
  std::ofstream(dir + "/comm") << "other\n";
  auto comm = ReadFileAt(fd, dir, "comm");
  REQUIRE(comm.ok());
  CHECK(*comm == "myserver\n");
  CHECK(*ReadFileToString(dir + "/comm") == "other\n");
  // Errors name the file as `dir` (a label only) and `name` give it.
  auto missing = ReadFileAt(fd, "/label", "nonexistent");
  CHECK(absl::IsNotFound(missing.status()));
  CHECK(absl::StrContains(missing.status().message(), "open /label/nonexistent: "));
  auto link = ReadLinkAt(fd, "/label", "exe");
  CHECK(absl::IsNotFound(link.status()));
  CHECK(absl::StrContains(link.status().message(), "readlink /label/exe: "));
  // A child's /proc directory, opened before it was reaped: once it has been, every read through
  // the fd fails NotFound, even where a new process could have taken its pid.
  const pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) _exit(0);
  const std::string child_dir = absl::StrCat("/proc/", child);
  const int child_fd = open(child_dir.c_str(), O_PATH | O_DIRECTORY | O_CLOEXEC);
  int status = 0;
  REQUIRE(waitpid(child, &status, 0) == child);
  REQUIRE(child_fd >= 0);
  Closer child_closer{child_fd};
  CHECK(absl::IsNotFound(ReadFileAt(child_fd, child_dir, "stat").status()));
  CHECK(absl::IsNotFound(ReadLinkAt(child_fd, child_dir, "exe").status()));
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
  MappingRef text = table.FindMapping(self, reinterpret_cast<uintptr_t>(&FunctionInTestBinary));
  REQUIRE(text);
  CHECK(text->executable());
  CHECK(text->file_backed());
  CHECK(text->path == *exe);
  std::vector<std::string> hosts = table.HostPaths(text);
  REQUIRE(hosts.size() == 2);
  CHECK(hosts[1] == absl::StrCat("/proc/", getpid(), "/root", *exe));
  for (const std::string& h : hosts) CHECK(access(h.c_str(), R_OK) == 0);

  int on_stack = 0;
  CHECK(!table.FindMapping(self, reinterpret_cast<uintptr_t>(&on_stack)));  // not executable

  auto reused = table.Get({self.tgid, self.start_boot_ns + TicksToNs(2)});
  REQUIRE_FALSE(reused.ok());
  CHECK(absl::IsNotFound(reused.status()));
  CHECK(table.vanished() == 1);
  CHECK(table.read_errors() == 0);
}

// A child that maps a copy of /bin/true's text from a file it then deletes, and waits.
TEST_CASE("ProcessTable::Snapshot pins mapped files: readable after deletion and exit") {
  TempProcRoot scratch;  // a temporary directory
  const std::string copy = scratch.dir() + "/mapped.bin";
  fs::copy_file("/bin/true", copy);
  int pipefd[2];
  REQUIRE(pipe(pipefd) == 0);
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    int fd = open(copy.c_str(), O_RDONLY);
    void* p = fd < 0 ? MAP_FAILED : mmap(nullptr, 4096, PROT_READ | PROT_EXEC, MAP_PRIVATE, fd, 0);
    char c = p == MAP_FAILED ? 'e' : 'm';
    (void)!write(pipefd[1], &c, 1);
    pause();
    _exit(0);
  }
  close(pipefd[1]);
  char c = 0;
  REQUIRE(read(pipefd[0], &c, 1) == 1);
  close(pipefd[0]);
  REQUIRE(c == 'm');
  fs::remove(copy);

  auto stat_text = ReadFileToString(absl::StrCat("/proc/", child, "/stat"));
  REQUIRE(stat_text.ok());
  auto st = ParseStat(*stat_text);
  REQUIRE(st.ok());
  const ProcessKey key{static_cast<uint32_t>(child), TicksToNs(st->start_time_ticks), 7};
  ProcessTable table;
  auto snap = table.Snapshot(key);
  INFO(snap.status().ToString());
  REQUIRE(snap.ok());
  CHECK((*snap)->snapshot);
  CHECK(table.HasSnapshot(key));
  CHECK_FALSE(table.HasSnapshot({key.tgid, key.start_boot_ns, 8}));  // another image
  const MapEntry* deleted = nullptr;
  const PinnedFile* pinned = nullptr;
  for (size_t i = 0; i < (*snap)->maps.size(); ++i) {
    if ((*snap)->maps[i].deleted) {
      deleted = &(*snap)->maps[i];
      pinned = (*snap)->files[i].get();
    }
  }
  REQUIRE(deleted != nullptr);
  CHECK(deleted->path == copy);
  REQUIRE(pinned != nullptr);
  const size_t pins = table.pinned_files();
  CHECK(pins >= 2);  // the deleted copy, libc, ld.so, the test binary

  kill(child, SIGKILL);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  table.EndWindow();  // snapshotted in that window: kept
  MappingRef m = table.FindMapping(key, deleted->start);
  REQUIRE(m);
  REQUIRE(m.file == pinned);
  std::vector<std::string> hosts = table.HostPaths(m);
  REQUIRE_FALSE(hosts.empty());
  CHECK(hosts[0] == pinned->path());
  // The pinned file is the deleted copy, byte for byte (/bin/true's ELF magic).
  std::ifstream in(hosts[0], std::ios::binary);
  char magic[4] = {};
  in.read(magic, 4);
  CHECK(std::string(magic, 4) == "\x7f" "ELF");
  snap = absl::StatusOr<std::shared_ptr<const ProcessInfo>>();
  m = MappingRef();
  table.EndWindow();  // used in the last window: kept
  CHECK(table.size() == 1);
  table.EndWindow();  // idle for a window: released, files closed
  CHECK(table.size() == 0);
  CHECK(table.pinned_files() == 0);
  CHECK(access(pinned == nullptr ? "" : hosts[0].c_str(), F_OK) != 0);
  CHECK(table.snapshots() == 1);
}

TEST_CASE("ProcessTable::Snapshot again keeps earlier mappings the new read does not contradict") {
  TempProcRoot root;
  ProcessTable table(root.dir());
  REQUIRE(table.Snapshot(kKey).ok());
  // Since: the deleted JIT library is unmapped, another library now overlaps libc's old range
  // (libc was unmapped too), and a plugin is loaded.
  std::ofstream(root.dir() + "/4242/maps", std::ios::trunc)
      << "55d4c8a3f000-55d4c8a52000 r-xp 00004000 fd:01 1835021 /usr/bin/myserver\n"
      << "7f1b34000000-7f1b34100000 r-xp 00000000 fd:01 99 /usr/lib/libother.so\n"
      << "7f1b40000000-7f1b40010000 r-xp 00000000 fd:01 77 /usr/lib/libplugin.so\n"
      << "7ffd5e1fa000-7ffd5e1fc000 r-xp 00000000 00:00 0 [vdso]\n";
  auto snap = table.Snapshot(kKey);
  REQUIRE(snap.ok());
  std::vector<std::string> paths;
  for (const MapEntry& m : (*snap)->maps) paths.push_back(absl::StrCat(absl::Hex(m.start), " ", m.path));
  CHECK(paths == std::vector<std::string>{"55d4c8a3f000 /usr/bin/myserver",
                                          "7f1b33c00000 /tmp/libjit-7781.so",
                                          "7f1b34000000 /usr/lib/libother.so",
                                          "7f1b40000000 /usr/lib/libplugin.so",
                                          "7ffd5e1fa000 [vdso]"});
  CHECK((*snap)->files.size() == (*snap)->maps.size());
  MappingRef jit = table.FindMapping(kKey, 0x7f1b33c00010);
  REQUIRE(jit);
  CHECK(jit->path == "/tmp/libjit-7781.so");
  MappingRef other = table.FindMapping(kKey, 0x7f1b3404e000);  // in libc's old range
  REQUIRE(other);
  CHECK(other->path == "/usr/lib/libother.so");
}

TEST_CASE("ProcessTable::Snapshot of an exiting process keeps the mappings its samples ran in") {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  auto text = ReadFileToString(absl::StrCat("/proc/", child, "/stat"));
  REQUIRE(text.ok());
  auto st = ParseStat(*text);
  REQUIRE(st.ok());
  const ProcessKey key{static_cast<uint32_t>(child), TicksToNs(st->start_time_ticks), 1};
  ProcessTable table;
  auto first = table.Snapshot(key);
  REQUIRE(first.ok());
  REQUIRE(!(*first)->maps.empty());
  const uint64_t pc = (*first)->maps.front().start;
  const std::string path = (*first)->maps.front().path;

  // A zombie (exited, not reaped: WNOWAIT) has its stat but no mm, so its maps read empty.
  kill(child, SIGKILL);
  siginfo_t info{};
  REQUIRE(waitid(P_PID, child, &info, WEXITED | WNOWAIT) == 0);
  auto maps = ReadFileToString(absl::StrCat("/proc/", child, "/maps"));
  REQUIRE(maps.ok());
  CHECK(maps->empty());  // the premise, from the real kernel
  auto again = table.Snapshot(key);
  REQUIRE(again.ok());
  CHECK((*again)->maps.size() == (*first)->maps.size());
  MappingRef m = table.FindMapping(key, pc);
  REQUIRE(m);
  CHECK(m->path == path);
  REQUIRE(waitpid(child, nullptr, 0) == child);
}

TEST_CASE("ProcessTable keeps the snapshot of a running process through idle windows") {
  pid_t child = fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  // The child's /proc entry exists from fork on; its stat shows its own start time.
  auto text = ReadFileToString(absl::StrCat("/proc/", child, "/stat"));
  REQUIRE(text.ok());
  auto st = ParseStat(*text);
  REQUIRE(st.ok());
  const ProcessKey key{static_cast<uint32_t>(child), TicksToNs(st->start_time_ticks), 1};
  ProcessTable table;
  REQUIRE(table.Snapshot(key).ok());
  for (int i = 0; i < 3; ++i) table.EndWindow();  // idle, but running: kept
  CHECK(table.size() == 1);
  CHECK(table.HasSnapshot(key));
  kill(child, SIGKILL);
  REQUIRE(waitpid(child, nullptr, 0) == child);
  table.EndWindow();  // exited and idle: released
  CHECK(table.size() == 0);
  CHECK(table.pinned_files() == 0);
}

}  // namespace
}  // namespace parascope::proc
