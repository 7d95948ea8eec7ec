// Retention of --output-dir (export/retention.h) through FileExporter on a real directory: the
// byte bound measured from the disk (st_blocks of every file) after each write, oldest windows
// deleted first, empty directories removed, the age bound, the index bound, and a restart that
// finds an earlier run's files (and a crash's .tmp leftover) and keeps the bound over both.
#include "agent/export/retention.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/export/file_exporter.h"
#include "agent/profile/pprof_builder.h"
#include "test/unit/temp_dir.h"

namespace parascope {
namespace {

namespace fs = std::filesystem;

using unit_testing::TempDir;

// What the directory holds on disk: every regular file's allocated bytes, and the window starts
// of the profile files.
struct DiskUsage {
  int64_t bytes = 0;
  int64_t files = 0;
  std::set<int64_t> windows;
};

DiskUsage Measure(const std::string& root) {
  DiskUsage u;
  for (const auto& e : fs::recursive_directory_iterator(root)) {
    if (!e.is_regular_file()) continue;
    struct stat st;
    REQUIRE(stat(e.path().c_str(), &st) == 0);
    u.bytes += static_cast<int64_t>(st.st_blocks) * 512;
    ++u.files;
    std::string name = e.path().filename().string();
    if (absl::EndsWith(name, ".pb.gz")) {
      int64_t t0 = 0;
      std::string digits = name.substr(name.rfind('-') + 1);
      digits = digits.substr(0, digits.find('.'));
      REQUIRE(absl::SimpleAtoi(digits, &t0));
      u.windows.insert(t0);
    }
  }
  return u;
}

// A profile of process `tgid` for the window starting at t0_ms whose gzip file is about
// `bytes` long (random strings do not compress).
ProcessProfile MakeProfile(uint32_t tgid, int64_t t0_ms, size_t bytes, std::mt19937* rng) {
  ProcessProfile p;
  p.process.tgid = tgid;
  p.process.start_boot_ns = uint64_t{tgid} * 10000000;  // 1 tick = 10 ms
  p.process.exec_id = 1;
  p.type = "process_cpu";
  p.profile->set_time_nanos(t0_ms * 1000000);
  p.profile->add_string_table("");
  std::string s(bytes, ' ');
  for (char& c : s) c = static_cast<char>('!' + (*rng)() % 90);
  p.profile->add_string_table(s);
  return p;
}

// The file exporter alone (no retention): the SPEC layout, the profile byte-exact after a
// gunzip, no .tmp left behind, and a directory removed under it (a process's, the whole root)
// made again.
TEST_CASE(
    "file exporter: the SPEC layout, byte-exact content, a removed or replaced root made again",
    "[unit]") {
  TempDir tmp;
  const std::string root = tmp.path() + "/var/out";  // made with its parent at the first write
  FileExporter exporter(root);
  REQUIRE(exporter.Start(absl::Now()).ok());
  std::mt19937 rng(7);
  ProcessProfile p = MakeProfile(4242, 1700000000000, 200, &rng);
  REQUIRE(exporter.Export(p).ok());
  const std::string path = root + "/4242/4242.1/process_cpu-1700000000000.pb.gz";
  CHECK(exporter.PathFor(p) == path);
  auto read = [](const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  auto parsed = ParseMaybeGzip(read(path));
  REQUIRE(parsed.ok());
  CHECK(parsed->SerializeAsString() == p.profile->SerializeAsString());
  CHECK(Measure(root).files == 1);  // no .tmp left
  // Within one filesystem block (statfs f_bsize, 4 KiB or more on Linux): stored, not compressed.
  CHECK(fs::file_size(path) == p.profile->ByteSizeLong() + kGzipStoredOverhead);
  // Beyond a block: compressed (repetitive content, a tenth of its size or less).
  ProcessProfile big = MakeProfile(4242, 1700000005000, 10, &rng);
  big.profile->add_string_table(std::string(200000, 'x'));
  REQUIRE(exporter.Export(big).ok());
  CHECK(fs::file_size(exporter.PathFor(big)) < big.profile->ByteSizeLong() / 10);
  auto big_back = ParseMaybeGzip(read(exporter.PathFor(big)));
  REQUIRE(big_back.ok());
  CHECK(big_back->SerializeAsString() == big.profile->SerializeAsString());
  fs::remove(exporter.PathFor(big));
  // The process's directory is removed while the exporter knows it (a user, or retention, in
  // the same window and after one): the next profile makes it again.
  for (int windows = 0; windows < 2; ++windows) {
    fs::remove_all(root + "/4242");
    ProcessProfile r = MakeProfile(4242, 1700000010000 + windows, 200, &rng);
    REQUIRE(exporter.Export(r).ok());
    auto r_back = ParseMaybeGzip(read(exporter.PathFor(r)));
    REQUIRE(r_back.ok());
    CHECK(r_back->SerializeAsString() == r.profile->SerializeAsString());
    exporter.EndWindow(absl::Now());
  }
  fs::remove_all(root + "/4242");
  // The root is removed (a user cleaning up): the next profile makes it again, whether its
  // process's directory was known (q) or not (a new process).
  fs::remove_all(root);
  ProcessProfile fresh = MakeProfile(4343, 1700000015000, 200, &rng);
  REQUIRE(exporter.Export(fresh).ok());
  CHECK(ParseMaybeGzip(read(exporter.PathFor(fresh))).ok());
  fs::remove_all(root);
  ProcessProfile q = MakeProfile(4242, 1700000015000, 200, &rng);
  REQUIRE(exporter.Export(q).ok());
  auto again = ParseMaybeGzip(read(exporter.PathFor(q)));
  REQUIRE(again.ok());
  CHECK(again->SerializeAsString() == q.profile->SerializeAsString());
  CHECK(Measure(root).files == 1);
  // The root is moved aside and made again (`mv out out.old && mkdir out`): after the window,
  // profiles go to the new root, with their process directories made again.
  fs::rename(root, root + ".old");
  fs::create_directory(root);
  exporter.EndWindow(absl::Now());
  ProcessProfile moved = MakeProfile(4242, 1700000020000, 200, &rng);
  REQUIRE(exporter.Export(moved).ok());
  auto moved_back = ParseMaybeGzip(read(exporter.PathFor(moved)));
  REQUIRE(moved_back.ok());
  CHECK(moved_back->SerializeAsString() == moved.profile->SerializeAsString());
  CHECK(Measure(root).files == 1);
  CHECK(Measure(root + ".old").files == 1);
  // A root that cannot be made: an error naming the path, nothing written.
  FileExporter blocked(exporter.PathFor(moved) + "/sub");
  absl::Status s = blocked.Export(q);
  CHECK_FALSE(s.ok());
  CHECK(absl::StrContains(s.message(), "process_cpu-1700000020000.pb.gz"));
}

}  // namespace

// A profile of one sample (`type`'s two values: count 1 and `ns`) in `fn` of process `tgid`.
ProcessProfile OneSample(uint32_t tgid, const std::string& type, int64_t t0_ms, int64_t ns,
                         const std::string& fn) {
  PprofBuilder b({{type == "process_cpu" ? "samples" : "contentions", "count"},
                  {type == "process_cpu" ? "cpu" : "delay", "nanoseconds"}},
                 {"cpu", "nanoseconds"}, 1000);
  uint64_t m = b.AddMapping(
      {0x400000 + tgid * 0x10000ull, 0x401000 + tgid * 0x10000ull, 0, "/usr/bin/app", "", true});
  uint64_t l = b.AddLocation(m, 0x400010 + tgid * 0x10000ull, {b.AddFunction({fn, fn, ""})});
  b.AddSample({l}, {1, ns}, {LabelSpec::Num("tid", tgid)});
  ProcessProfile p;
  p.process = {tgid, uint64_t{tgid} * 10000000, 1};
  p.process_name = absl::StrCat("app", tgid);
  p.type = type;
  p.profile = std::move(b).Build(t0_ms * 1000000, 1000000000);
  return p;
}

// pids of processes that have exited and been reaped.
std::vector<uint32_t> GonePids(int n) {
  std::vector<uint32_t> out;
  for (int i = 0; i < n; ++i) {
    pid_t pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) _exit(0);
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    out.push_back(static_cast<uint32_t>(pid));
  }
  return out;
}

TEST_CASE("file exporter: past the new-process budget, exited processes share overflow/ files",
          "[unit]") {
  TempDir tmp;
  const std::string root = tmp.path() + "/out";
  RetentionOptions ro;
  ro.max_bytes = int64_t{1} << 30;  // indexes the files, deletes nothing
  FileExporter exporter(root, ro, /*max_new_processes=*/2);
  REQUIRE(exporter.Start(absl::Now()).ok());
  const std::vector<uint32_t> gone = GonePids(4);
  const uint32_t alive = static_cast<uint32_t>(getpid());
  constexpr int64_t kT0 = 1700000000000;
  auto own_dir = [&](uint32_t tgid) { return absl::StrCat(root, "/", tgid, "/", tgid, ".1"); };
  // Two new directories, then the budget is spent: gone[2] and gone[3] are merged (both their
  // types), the running process still gets its own directory.
  for (uint32_t tgid : {gone[0], gone[1], gone[2], alive, gone[3]}) {
    for (const char* type : {"process_cpu", "off_cpu"}) {
      REQUIRE(exporter.Export(OneSample(tgid, type, kT0, 1000 + tgid, "f")).ok());
    }
  }
  for (uint32_t tgid : {gone[0], gone[1], alive}) {
    CHECK(fs::exists(own_dir(tgid) + "/process_cpu-1700000000000.pb.gz"));
    CHECK(fs::exists(own_dir(tgid) + "/off_cpu-1700000000000.pb.gz"));
  }
  for (uint32_t tgid : {gone[2], gone[3]}) CHECK(!fs::exists(absl::StrCat(root, "/", tgid)));
  CHECK(exporter.merged_processes() == 2);
  CHECK(exporter.merged_profiles() == 4);
  CHECK(!fs::exists(root + "/overflow"));  // written at Flush
  REQUIRE(exporter.Flush().ok());
  for (const char* type : {"process_cpu", "off_cpu"}) {
    const std::string path = absl::StrCat(root, "/overflow/0/", type, "-1700000000000.pb.gz");
    std::ifstream in(path, std::ios::binary);
    auto merged = ParseMaybeGzip(std::string(std::istreambuf_iterator<char>(in), {}));
    REQUIRE(merged.ok());
    CHECK(merged->time_nanos() == kT0 * 1000000);
    // One sample per merged process, labelled pid, process, then its own tid; values intact.
    std::map<int64_t, int64_t> ns_by_pid;
    for (const auto& s : merged->sample()) {
      REQUIRE(s.label_size() == 3);
      CHECK(merged->string_table(s.label(0).key()) == "pid");
      CHECK(merged->string_table(s.label(1).str()) == absl::StrCat("app", s.label(0).num()));
      CHECK(s.label(2).num() == s.label(0).num());  // tid
      ns_by_pid[s.label(0).num()] += s.value(1);
    }
    CHECK(ns_by_pid ==
          std::map<int64_t, int64_t>{{gone[2], 1000 + gone[2]}, {gone[3], 1000 + gone[3]}});
  }
  // Retention indexes the overflow files like the others: 6 own files and 2 merged.
  CHECK(exporter.retention_stats().files == 8);
  CHECK(Measure(root).files == 8);

  // The next window: an image merged before (it ran across the boundary) is merged again, so
  // it stays in one place; a new exited process gets a directory again (a fresh budget).
  exporter.EndWindow(absl::Now());
  const uint32_t fresh = GonePids(1)[0];
  REQUIRE(exporter.Export(OneSample(gone[2], "process_cpu", kT0 + 1000, 5, "g")).ok());
  REQUIRE(exporter.Export(OneSample(fresh, "process_cpu", kT0 + 1000, 6, "g")).ok());
  CHECK(!fs::exists(absl::StrCat(root, "/", gone[2])));
  CHECK(fs::exists(own_dir(fresh) + "/process_cpu-1700000001000.pb.gz"));
  CHECK(exporter.merged_profiles() == 5);
  CHECK(exporter.merged_processes() == 2);  // gone[2] was counted when first merged
  // A part that cannot be written (overflow/ is a file here): Flush says so, and the profile it
  // held is counted lost.
  fs::remove_all(root + "/overflow");
  std::ofstream(root + "/overflow") << "x";
  absl::Status flushed = exporter.Flush();
  CHECK(!flushed.ok());
  CHECK(absl::StrContains(flushed.message(), "overflow"));
  CHECK(exporter.TakeMergedLost() == 1);
  CHECK(exporter.TakeMergedLost() == 0);

  // Without a budget (the default) nothing is ever merged.
  FileExporter unbounded(tmp.path() + "/unbounded");
  for (uint32_t tgid : gone) {
    REQUIRE(unbounded.Export(OneSample(tgid, "process_cpu", kT0, 1, "f")).ok());
  }
  REQUIRE(unbounded.Flush().ok());
  CHECK(unbounded.merged_processes() == 0);
  CHECK(Measure(tmp.path() + "/unbounded").files == 4);
}

// The path of an agent that builds the merged images itself (an overflow group, profile_set.h
// ProfileGroup::Kind::kOverflow): MergesProcess decides as Export would, once per image, and
// each ExportMergedPart is the next part of its type, carrying the merged parts' note.
TEST_CASE("file exporter: an overflow group's profiles are written as overflow/ parts", "[unit]") {
  TempDir tmp;
  const std::string root = tmp.path() + "/out";
  FileExporter exporter(root, {}, /*max_new_processes=*/1);
  const std::vector<uint32_t> gone = GonePids(3);
  const uint32_t alive = static_cast<uint32_t>(getpid());
  constexpr int64_t kT0 = 1700000000000;
  auto key = [](uint32_t tgid) { return proc::ProcessKey{tgid, uint64_t{tgid} * 10000000, 1}; };
  // Within the budget: a directory of its own (Export makes it).
  CHECK(!exporter.MergesProcess(key(gone[0])));
  REQUIRE(exporter.Export(OneSample(gone[0], "off_cpu", kT0, 5, "f")).ok());
  // Past it: exited images are merged, decided once (asked again, the same answer, counted
  // once); a running process never is.
  CHECK(exporter.MergesProcess(key(gone[1])));
  CHECK(exporter.MergesProcess(key(gone[1])));
  CHECK(exporter.MergesProcess(key(gone[2])));
  CHECK(!exporter.MergesProcess(key(alive)));
  CHECK(exporter.merged_processes() == 2);
  // Export agrees with the decisions made before it: the running process gets its directory,
  // a merged image none (its profile waits for Flush, as the third part below).
  REQUIRE(exporter.Export(OneSample(alive, "off_cpu", kT0, 7, "f")).ok());
  CHECK(fs::exists(absl::StrCat(root, "/", alive)));
  REQUIRE(exporter.Export(OneSample(gone[2], "process_cpu", kT0, 3, "h")).ok());
  CHECK(!fs::exists(absl::StrCat(root, "/", gone[2])));
  CHECK(exporter.merged_processes() == 2);
  for (int part = 0; part < 2; ++part) {
    ProcessProfile p = OneSample(gone[1 + part], "off_cpu", kT0, 9, "g");
    p.group.kind = ProfileGroup::Kind::kOverflow;
    p.group_processes = 1;
    REQUIRE(exporter.ExportMergedPart(std::move(p)).ok());
  }
  CHECK(exporter.merged_profiles() == 3);
  for (int part = 0; part < 2; ++part) {
    const std::string path = absl::StrCat(root, "/overflow/", part, "/off_cpu-", kT0, ".pb.gz");
    INFO(path);
    std::ifstream in(path, std::ios::binary);
    auto written = ParseMaybeGzip(std::string(std::istreambuf_iterator<char>(in), {}));
    REQUIRE(written.ok());
    REQUIRE(written->comment_size() == 1);
    CHECK(written->string_table(written->comment(0)) ==
          "parascope: processes that had exited when the window was written, past the 1 new "
          "process directories a window may make (--output-max-new-processes)");
    REQUIRE(written->sample_size() == 1);
    CHECK(written->sample(0).value(1) == 9);
  }
  REQUIRE(exporter.Flush().ok());  // the merged process_cpu profile: the type's first part
  CHECK(fs::exists(absl::StrCat(root, "/overflow/0/process_cpu-", kT0, ".pb.gz")));
  CHECK(!fs::exists(absl::StrCat(root, "/overflow/2")));
  // The next window: the merged images stay merged, without being counted again.
  exporter.EndWindow(absl::Now());
  CHECK(exporter.MergesProcess(key(gone[2])));
  CHECK(exporter.merged_processes() == 2);
}

TEST_CASE("retention: the byte bound holds on disk after every write, oldest windows go first",
          "[unit]") {
  TempDir dir;
  RetentionOptions ro;
  ro.max_bytes = 200 * 1024;
  FileExporter files(dir.path(), ro);
  REQUIRE(files.Start(absl::Now()).ok());
  std::mt19937 rng(1);
  int64_t written = 0;
  // 40 windows of 3 processes, ~6 KB each (8 KiB on disk): ~960 KiB in all, ~5x the bound.
  // Process 100 runs throughout; 200+w lives one window only.
  for (int w = 0; w < 40; ++w) {
    const int64_t t0 = 1700000000000 + w * 15000;
    for (uint32_t tgid : {100u, 200u + w, 300u + w / 10}) {
      REQUIRE(files.Export(MakeProfile(tgid, t0, 6000, &rng)).ok());
      ++written;
      DiskUsage u = Measure(dir.path());
      INFO("window " << w << " tgid " << tgid);
      REQUIRE(u.bytes <= ro.max_bytes);
      CHECK(u.bytes == files.retention_stats().bytes);
      CHECK(u.files == files.retention_stats().files);
    }
  }
  DiskUsage u = Measure(dir.path());
  RetentionStats s = files.retention_stats();
  CHECK(s.deleted_bytes_bound > 0);
  CHECK(static_cast<int64_t>(s.deleted_bytes_bound) + u.files == written);
  CHECK(u.bytes > ro.max_bytes - 3 * 8192);  // close to the bound: only what did not fit went
  // The newest windows are the ones kept: the last window whole, nothing older than a gap.
  const int64_t last = 1700000000000 + 39 * 15000;
  REQUIRE(!u.windows.empty());
  CHECK(*u.windows.rbegin() == last);
  CHECK(*u.windows.begin() >= last - static_cast<int64_t>(u.windows.size()) * 15000);
  for (auto it = std::next(u.windows.begin()); it != u.windows.end(); ++it) {
    CHECK(*it - *std::prev(it) == 15000);
  }
  // The directories of processes whose files all went are gone, their pid directories too.
  for (int w = 0; w < 20; ++w) {
    INFO("pid " << 200 + w);
    CHECK_FALSE(fs::exists(absl::StrCat(dir.path(), "/", 200 + w)));
  }
  CHECK(fs::exists(absl::StrCat(dir.path(), "/100")));
}

TEST_CASE("retention: windows older than the age bound are deleted whole", "[unit]") {
  TempDir dir;
  RetentionOptions ro;
  ro.max_age = absl::Minutes(1);
  FileExporter files(dir.path(), ro);
  REQUIRE(files.Start(absl::Now()).ok());
  std::mt19937 rng(2);
  const absl::Time now = absl::FromUnixMillis(1700000600000);
  // Windows every 15 s from 2 minutes ago to now, 2 processes each.
  for (int w = 0; w <= 8; ++w) {
    const int64_t t0 = absl::ToUnixMillis(now - absl::Minutes(2)) + w * 15000;
    for (uint32_t tgid : {10u, 20u}) REQUIRE(files.Export(MakeProfile(tgid, t0, 100, &rng)).ok());
  }
  files.EndWindow(now);
  DiskUsage u = Measure(dir.path());
  // Kept: t0 >= now - 60 s, i.e. windows 4..8.
  CHECK(u.windows.size() == 5);
  CHECK(*u.windows.begin() == absl::ToUnixMillis(now - absl::Minutes(1)));
  CHECK(u.files == 10);
  CHECK(files.retention_stats().deleted_age == 8);
}

TEST_CASE("retention: a restart indexes the earlier run's files and keeps the bound over both",
          "[unit]") {
  TempDir dir;
  std::mt19937 rng(3);
  RetentionOptions ro;
  ro.max_bytes = 64 * 1024;
  {
    FileExporter first(dir.path());  // no bound: 12 files of 8 KiB
    REQUIRE(first.Start(absl::Now()).ok());
    for (int w = 0; w < 12; ++w) {
      REQUIRE(first.Export(MakeProfile(7, 1700000000000 + w * 15000, 6000, &rng)).ok());
    }
  }
  // A crash's leftover and a file the agent did not write.
  std::string image = absl::StrCat(dir.path(), "/7/70.1");
  std::ofstream(image + "/process_cpu-1700000999000.pb.gz.tmp") << std::string(5000, 'x');
  std::ofstream(dir.path() + "/README") << "operator's notes\n";
  const int64_t foreign = [&] {
    struct stat st;
    REQUIRE(stat((dir.path() + "/README").c_str(), &st) == 0);
    return static_cast<int64_t>(st.st_blocks) * 512;
  }();
  REQUIRE(Measure(dir.path()).bytes > ro.max_bytes);

  FileExporter second(dir.path(), ro);
  REQUIRE(second.Start(absl::Now()).ok());
  CHECK_FALSE(fs::exists(image + "/process_cpu-1700000999000.pb.gz.tmp"));
  CHECK(fs::exists(dir.path() + "/README"));
  DiskUsage u = Measure(dir.path());
  CHECK(u.bytes - foreign <= ro.max_bytes);
  CHECK(u.bytes - foreign == second.retention_stats().bytes);
  CHECK(*u.windows.rbegin() == 1700000000000 + 11 * 15000);  // the newest kept
  for (int w = 12; w < 20; ++w) {
    REQUIRE(second.Export(MakeProfile(7, 1700000000000 + w * 15000, 6000, &rng)).ok());
    CHECK(Measure(dir.path()).bytes - foreign <= ro.max_bytes);
  }
  CHECK(*Measure(dir.path()).windows.rbegin() == 1700000000000 + 19 * 15000);
}

TEST_CASE("retention: the index bound deletes the oldest files beyond it", "[unit]") {
  TempDir dir;
  RetentionOptions ro;
  ro.max_age = absl::Hours(24 * 365 * 100);
  ro.max_files = 10;
  FileExporter files(dir.path(), ro);
  REQUIRE(files.Start(absl::Now()).ok());
  std::mt19937 rng(4);
  for (int w = 0; w < 25; ++w) {
    REQUIRE(files.Export(MakeProfile(5, absl::ToUnixMillis(absl::Now()) + w, 10, &rng)).ok());
  }
  DiskUsage u = Measure(dir.path());
  CHECK(u.files == 10);
  CHECK(files.retention_stats().deleted_files_bound == 15);
}

}  // namespace parascope
