// ProfileMerger (agent/profile/profile_merge.h): the merge of several processes' profiles gives
// each process's samples back exactly (by its pid label, frames compared by function, line and
// file offset), and shares what the processes share (one Mapping and one Location per distinct
// pc of a binary loaded at different bases).
#include "agent/profile/profile_merge.h"

#include <catch2/catch.hpp>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "agent/profile/pprof_builder.h"

namespace parascope {
namespace {

namespace pp = perftools::profiles;

constexpr int64_t kT0 = 1733456789000000000;

// The profile of a process that loaded /usr/bin/app (a PIE, build id "ab12") at `base`: samples
// in main (pc base+0x1010, line 7) called from _start (base+0x1100), and in a frame without a
// mapping ("[unknown]"), with thread labels and an on-CPU comment of its own.
pp::Profile AppProfile(uint64_t base, int64_t ns_main, int64_t ns_unknown, uint32_t tid,
                       const std::string& own_comment) {
  PprofBuilder b({{"samples", "count"}, {"cpu", "nanoseconds"}}, {"cpu", "nanoseconds"}, 52631578);
  uint64_t m = b.AddMapping({base, base + 0x2000, 0x1000, "/usr/bin/app", "ab12", true});
  uint64_t f_main = b.AddFunction({"main", "main", "app.c"});
  uint64_t f_start = b.AddFunction({"_start", "_start", ""});
  LineRef main_line{f_main, 7};
  uint64_t l_main = b.AddLocationLines(m, base + 0x1010, {&main_line, 1});
  uint64_t l_start = b.AddLocation(m, base + 0x1100, {f_start});
  uint64_t l_unknown = b.AddSyntheticLocation("[unknown]");
  std::vector<LabelSpec> labels{LabelSpec::Str("thread_name", "app"), LabelSpec::Num("tid", tid)};
  b.AddSample({l_main, l_start}, {1, ns_main}, labels);
  if (ns_unknown > 0) b.AddSample({l_unknown}, {1, ns_unknown}, labels);
  b.AddComment("parascope: event=cpu-clock frequency=19Hz");
  b.AddComment(own_comment);
  return *std::move(b).Build(kT0, 15000000000);
}

std::string S(const pp::Profile& p, int64_t i) { return p.string_table(static_cast<int>(i)); }

// Each sample as "frames|values|labels" (frames: function:line@file offset, leaf first), by pid
// label (0 for a profile without one); the pid and process labels themselves are left out.
std::map<int64_t, std::multiset<std::string>> Canon(const pp::Profile& p) {
  std::map<uint64_t, const pp::Mapping*> mappings;
  for (const pp::Mapping& m : p.mapping()) mappings[m.id()] = &m;
  std::map<uint64_t, const pp::Location*> locations;
  for (const pp::Location& l : p.location()) locations[l.id()] = &l;
  std::map<uint64_t, const pp::Function*> functions;
  for (const pp::Function& f : p.function()) functions[f.id()] = &f;
  std::map<int64_t, std::multiset<std::string>> out;
  for (const pp::Sample& s : p.sample()) {
    std::string text;
    for (uint64_t id : s.location_id()) {
      const pp::Location& l = *locations.at(id);
      for (const pp::Line& line : l.line()) {
        absl::StrAppend(&text, S(p, functions.at(line.function_id())->name()), ":", line.line(),
                        ",");
      }
      if (l.mapping_id() != 0) {
        const pp::Mapping& m = *mappings.at(l.mapping_id());
        absl::StrAppend(&text, "@", S(p, m.filename()), "+",
                        l.address() - m.memory_start() + m.file_offset());
      }
      text += ";";
    }
    text += "|";
    for (int64_t v : s.value()) absl::StrAppend(&text, v, ",");
    text += "|";
    int64_t pid = 0;
    for (const pp::Label& l : s.label()) {
      if (S(p, l.key()) == "pid") {
        pid = l.num();
      } else if (S(p, l.key()) != "process") {
        absl::StrAppend(&text, S(p, l.key()), "=", S(p, l.str()), l.num(), ",");
      }
    }
    out[pid].insert(text);
  }
  return out;
}

TEST_CASE("ProfileMerger gives each process's samples back by its pid label", "[merge]") {
  const pp::Profile a = AppProfile(0x555500000000, 30000000, 5000000, 101, "on-CPU a");
  const pp::Profile b = AppProfile(0x561200000000, 70000000, 0, 202, "on-CPU b");
  const pp::Profile c = AppProfile(0x555500000000, 11000000, 2000000, 303, "on-CPU c");
  ProfileMerger merger;
  REQUIRE(merger.Add(a, 100, "app").ok());
  REQUIRE(merger.Add(b, 200, "app").ok());
  REQUIRE(merger.Add(c, 300, "other").ok());
  CHECK(merger.profiles() == 3);
  CHECK(merger.samples() == 5);
  // The estimate counts at least the serialized content (what the exporter bounds parts by).
  const size_t approx = merger.approx_bytes();
  const pp::Profile m = merger.Take("note");
  CHECK(merger.empty());
  CHECK(merger.approx_bytes() == 0);
  CHECK(approx >= m.ByteSizeLong());

  const auto merged = Canon(m);
  REQUIRE(merged.size() == 3);
  CHECK(merged.at(100) == Canon(a).at(0));
  CHECK(merged.at(200) == Canon(b).at(0));
  CHECK(merged.at(300) == Canon(c).at(0));

  // Shared: one app Mapping (at the first process's base), one Location per distinct pc.
  REQUIRE(m.mapping_size() == 1);
  CHECK(m.mapping(0).memory_start() == 0x555500000000);
  CHECK(S(m, m.mapping(0).build_id()) == "ab12");
  CHECK(m.location_size() == 3);
  CHECK(m.function_size() == 3);  // main, _start, [unknown]
  // Every sample starts with pid and process, then keeps its own labels.
  std::map<int64_t, std::string> process_of;
  for (const pp::Sample& s : m.sample()) {
    REQUIRE(s.label_size() == 4);
    CHECK(S(m, s.label(0).key()) == "pid");
    CHECK(S(m, s.label(1).key()) == "process");
    process_of[s.label(0).num()] = S(m, s.label(1).str());
    CHECK(S(m, s.label(2).key()) == "thread_name");
    CHECK(S(m, s.label(3).key()) == "tid");
  }
  CHECK(process_of == std::map<int64_t, std::string>{{100, "app"}, {200, "app"}, {300, "other"}});

  // Scalars from the first profile; comments: the shared one, the count, the note.
  CHECK(m.time_nanos() == kT0);
  CHECK(m.duration_nanos() == 15000000000);
  CHECK(m.period() == 52631578);
  CHECK(S(m, m.period_type().type()) == "cpu");
  REQUIRE(m.sample_type_size() == 2);
  CHECK(S(m, m.sample_type(1).unit()) == "nanoseconds");
  std::vector<std::string> comments;
  for (int64_t i : m.comment()) comments.push_back(S(m, i));
  CHECK(comments == std::vector<std::string>{
                        "parascope: event=cpu-clock frequency=19Hz",
                        "parascope: the profiles of 3 process images merged; each sample's "
                        "labels pid and process name its process",
                        "note"});

  // Round trip through the wire form.
  auto parsed = ParseMaybeGzip(*SerializeGzip(m));
  REQUIRE(parsed.ok());
  CHECK(Canon(*parsed) == merged);
}

TEST_CASE("ProfileMerger refuses another sample type and starts over after Take", "[merge]") {
  ProfileMerger merger;
  REQUIRE(merger.Add(AppProfile(0x1000000, 1, 0, 1, "x"), 1, "a").ok());
  PprofBuilder off({{"contentions", "count"}, {"delay", "nanoseconds"}}, {"", ""}, 0);
  off.AddSample({off.AddSyntheticLocation("[unknown]")}, {1, 5}, {});
  absl::Status s = merger.Add(*std::move(off).Build(kT0, 1), 2, "b");
  CHECK(s.code() == absl::StatusCode::kInvalidArgument);
  CHECK(merger.profiles() == 1);
  const pp::Profile first = merger.Take();
  CHECK(Canon(first).size() == 1);

  // A fresh merge shares nothing with the last one.
  REQUIRE(merger.Add(AppProfile(0x2000000, 9, 0, 2, "y"), 7, "c").ok());
  const pp::Profile second = merger.Take();
  REQUIRE(second.mapping_size() == 1);
  CHECK(second.mapping(0).memory_start() == 0x2000000);
  CHECK(Canon(second).count(7) == 1);
  CHECK(Canon(second).count(1) == 0);
}

}  // namespace
}  // namespace parascope
