#include "agent/profile/pprof_builder.h"

#include <catch2/catch.hpp>

namespace parascope {
namespace {

using perftools::profiles::Profile;

const std::string& Str(const Profile& p, int64_t i) { return p.string_table(i); }

Profile BuildExample() {
  PprofBuilder b({{"samples", "count"}, {"cpu", "nanoseconds"}}, {"cpu", "nanoseconds"}, 52631579);
  uint64_t m = b.AddMapping({0x1000, 0x2000, 0x0, "/bin/app", "abcd", true});
  CHECK(b.AddMapping({0x1000, 0x2000, 0x0, "/bin/app", "abcd", true}) == m);  // dedup
  uint64_t f1 = b.AddFunction({"ns::Foo(int)", "_ZN2ns3FooEi", ""});
  uint64_t f2 = b.AddFunction({"main", "main", ""});
  CHECK(b.AddFunction({"main", "main", ""}) == f2);
  uint64_t l1 = b.AddLocation(m, 0x1100, {f1});
  uint64_t l2 = b.AddLocation(m, 0x1200, {f2});
  CHECK(b.AddLocation(m, 0x1100, {f1}) == l1);
  uint64_t unk = b.AddSyntheticLocation("[unknown]");
  LabelSpec labels[] = {LabelSpec::Str("thread_name", "worker"), LabelSpec::Num("tid", 42)};
  uint64_t stack[] = {l1, l2};
  int64_t v1[] = {1, 100}, v2[] = {2, 250}, v3[] = {5, 7};
  b.AddSample(stack, v1, labels);
  b.AddSample(stack, v2, labels);  // merged with the first
  uint64_t other[] = {unk};
  b.AddSample(other, v3, {});
  CHECK(b.sample_count() == 2);
  CHECK(b.ValueSum(1) == 357);
  b.AddComment("event=cpu-clock");
  return *std::move(b).Build(1700000000000000000, 15000000000);
}

}  // namespace

TEST_CASE("PprofBuilder interns, dedups and merges", "[profile]") {
  Profile p = BuildExample();
  REQUIRE(p.string_table_size() > 0);
  CHECK(p.string_table(0).empty());
  REQUIRE(p.sample_type_size() == 2);
  CHECK(Str(p, p.sample_type(0).type()) == "samples");
  CHECK(Str(p, p.sample_type(0).unit()) == "count");
  CHECK(Str(p, p.sample_type(1).type()) == "cpu");
  CHECK(Str(p, p.sample_type(1).unit()) == "nanoseconds");
  CHECK(Str(p, p.period_type().type()) == "cpu");
  CHECK(p.period() == 52631579);
  CHECK(p.time_nanos() == 1700000000000000000);
  CHECK(p.duration_nanos() == 15000000000);
  REQUIRE(p.comment_size() == 1);
  CHECK(Str(p, p.comment(0)) == "event=cpu-clock");

  REQUIRE(p.mapping_size() == 1);
  CHECK(p.mapping(0).id() == 1);
  CHECK(p.mapping(0).memory_start() == 0x1000);
  CHECK(p.mapping(0).memory_limit() == 0x2000);
  CHECK(Str(p, p.mapping(0).filename()) == "/bin/app");
  CHECK(Str(p, p.mapping(0).build_id()) == "abcd");
  CHECK(p.mapping(0).has_functions());

  REQUIRE(p.function_size() == 3);
  for (int i = 0; i < p.function_size(); ++i) CHECK(p.function(i).id() == uint64_t(i + 1));
  CHECK(Str(p, p.function(0).name()) == "ns::Foo(int)");
  CHECK(Str(p, p.function(0).system_name()) == "_ZN2ns3FooEi");
  CHECK(Str(p, p.function(2).name()) == "[unknown]");

  REQUIRE(p.location_size() == 3);
  CHECK(p.location(0).id() == 1);
  CHECK(p.location(0).mapping_id() == 1);
  CHECK(p.location(0).address() == 0x1100);
  REQUIRE(p.location(0).line_size() == 1);
  CHECK(p.location(0).line(0).function_id() == 1);
  CHECK(p.location(2).mapping_id() == 0);

  REQUIRE(p.sample_size() == 2);
  const auto& s = p.sample(0);
  CHECK(std::vector<uint64_t>(s.location_id().begin(), s.location_id().end()) ==
        std::vector<uint64_t>{1, 2});
  CHECK(std::vector<int64_t>(s.value().begin(), s.value().end()) == std::vector<int64_t>{3, 350});
  REQUIRE(s.label_size() == 2);
  CHECK(Str(p, s.label(0).key()) == "thread_name");
  CHECK(Str(p, s.label(0).str()) == "worker");
  CHECK(Str(p, s.label(1).key()) == "tid");
  CHECK(s.label(1).num() == 42);
  CHECK(s.label(1).str() == 0);
  CHECK(p.sample(1).label_size() == 0);
}

TEST_CASE("PprofBuilder: builders on one arena, a fork, profiles that outlive them all",
          "[profile]") {
  // Ground truth: an off_cpu builder with one sample {l1} of 10 ns (thread "w"); its fork as wall
  // gets 5 more ns on the same stack and labels (merged: 15), then the original gets a new
  // sample {l2} of 7 ns (a new Function) and a Location with lines. The fork's dedup tables
  // are its own: it has one sample (15 ns), the original two (10 + 7 ns), and the same Location
  // with lines added to the fork afterwards is a new id there (2; the original's is 3). Both
  // profiles stay whole after the builders and the caller's arena pointer are gone and the freed
  // blocks kept for the next arena are unmapped (ReleaseProfileArenaBlocks): a profile that did
  // not keep its arena alive would read unmapped memory and fault.
  std::shared_ptr<Profile> off_profile, wall_profile;
  {
    std::shared_ptr<google::protobuf::Arena> arena = NewProfileArena();
    PprofBuilder off({{"off_cpu", "nanoseconds"}}, {"", ""}, 0, arena);
    const uint64_t m = off.AddMapping({0x1000, 0x2000, 0, "/bin/app", "abcd", true});
    const uint64_t f1 = off.AddFunction({"a_function_name_longer_than_sso", "a1", "a.c"});
    const uint64_t l1 = off.AddLocation(m, 0x1100, {f1});
    const LabelSpec labels[] = {LabelSpec::Str("thread_name", "w")};
    const uint64_t s1[] = {l1};
    const int64_t ten[] = {10}, five[] = {5}, seven[] = {7};
    off.AddSample(s1, ten, labels);
    auto wall = std::make_unique<PprofBuilder>(
        off.ForkAs({{"wall", "nanoseconds"}}, {"wall", "nanoseconds"}, 1000));
    wall->AddSample(s1, five, labels);
    const uint64_t f2 = off.AddFunction({"b", "b", ""});
    const uint64_t l2 = off.AddLocation(m, 0x1200, {f2});
    const uint64_t s2[] = {l2};
    off.AddSample(s2, seven, labels);
    const LineRef lines[] = {{f1, 12}};
    CHECK(off.AddLocationLines(m, 0x1300, lines) == 3);
    CHECK(off.AddLocationLines(m, 0x1300, lines) == 3);
    CHECK(wall->AddLocationLines(m, 0x1300, lines) == 2);
    CHECK(wall->AddLocationLines(m, 0x1300, lines) == 2);
    CHECK(wall->AddLocation(m, 0x1100, {f1}) == l1);
    off_profile = std::move(off).Build(1, 2);
    wall_profile = std::move(*wall).Build(1, 2);
  }
  ReleaseProfileArenaBlocks();
  const Profile& o = *off_profile;
  const Profile& w = *wall_profile;
  REQUIRE(o.sample_size() == 2);
  CHECK(o.sample(0).value(0) == 10);
  CHECK(o.sample(1).value(0) == 7);
  REQUIRE(w.sample_size() == 1);
  CHECK(w.sample(0).value(0) == 15);
  CHECK(Str(w, w.sample_type(0).type()) == "wall");
  CHECK(Str(o, o.sample_type(0).type()) == "off_cpu");
  CHECK(w.period() == 1000);
  CHECK(o.location_size() == 3);
  CHECK(w.location_size() == 2);
  REQUIRE(w.function_size() == 1);
  CHECK(Str(w, w.function(0).name()) == "a_function_name_longer_than_sso");
  REQUIRE(w.location(1).line_size() == 1);
  CHECK(w.location(1).line(0).line() == 12);
  CHECK(Str(o, o.function(1).name()) == "b");
  CHECK(Str(w, w.sample(0).label(0).str()) == "w");
}

TEST_CASE("profile arenas: freed blocks are kept for the next arena, at most four, until released",
          "[profile]") {
  // Ground truth: six arenas with a block each are freed: four blocks are kept, two unmapped. A
  // new arena takes one (three left). A block made for one allocation larger than a block is
  // unmapped when freed, not kept: freeing that arena gives back only its first block (four).
  ReleaseProfileArenaBlocks();
  REQUIRE(CachedProfileArenaBlocks() == 0);
  {
    std::vector<std::shared_ptr<google::protobuf::Arena>> arenas;
    for (int i = 0; i < 6; ++i) {
      arenas.push_back(NewProfileArena());
      google::protobuf::Arena::CreateArray<char>(arenas.back().get(), 16)[0] = 'x';
    }
    CHECK(CachedProfileArenaBlocks() == 0);
  }
  CHECK(CachedProfileArenaBlocks() == kProfileArenaCachedBlocks);
  std::shared_ptr<google::protobuf::Arena> a = NewProfileArena();
  google::protobuf::Arena::CreateArray<char>(a.get(), 16)[0] = 'x';
  CHECK(CachedProfileArenaBlocks() == kProfileArenaCachedBlocks - 1);
  char* big = google::protobuf::Arena::CreateArray<char>(a.get(), 2 * kProfileArenaBlockBytes);
  big[2 * kProfileArenaBlockBytes - 1] = 'x';
  a.reset();
  CHECK(CachedProfileArenaBlocks() == kProfileArenaCachedBlocks);
  ReleaseProfileArenaBlocks();
  CHECK(CachedProfileArenaBlocks() == 0);
}

TEST_CASE("pprof gzip round trip is byte-exact", "[profile]") {
  Profile p = BuildExample();
  std::string raw;
  REQUIRE(p.SerializeToString(&raw));
  auto gz = SerializeGzip(p);
  REQUIRE(gz.ok());
  REQUIRE(gz->size() > 2);
  CHECK(static_cast<unsigned char>((*gz)[0]) == 0x1f);
  CHECK(static_cast<unsigned char>((*gz)[1]) == 0x8b);
  auto back = ParseMaybeGzip(*gz);
  REQUIRE(back.ok());
  std::string raw2;
  REQUIRE(back->SerializeToString(&raw2));
  CHECK(raw2 == raw);
  auto plain = ParseMaybeGzip(raw);
  REQUIRE(plain.ok());
  CHECK(plain->sample_size() == 2);
}

// SerializeGzip's store_within: a profile whose stored gzip fits is stored (RFC 1951 block type
// 00: the first deflate byte is BFINAL=1, BTYPE=00, i.e. 0x01, right after the 10-byte member
// header), exactly kGzipStoredOverhead bytes longer than its encoding; one byte more than fits is
// compressed (Huffman block, BTYPE 01 or 10). Both read back byte-exact.
TEST_CASE("pprof gzip: stored within a block, compressed beyond it, both byte-exact",
          "[profile]") {
  Profile p = BuildExample();
  // Repetitive strings: compressible, so compressed and stored forms differ in size.
  for (int i = 0; i < 50; ++i) p.add_string_table("parascope::ProfileSet::AppendFrames");
  std::string raw;
  REQUIRE(p.SerializeToString(&raw));
  const size_t fits = raw.size() + kGzipStoredOverhead;
  auto stored = SerializeGzip(p, fits);
  REQUIRE(stored.ok());
  CHECK(stored->size() == fits);
  REQUIRE(stored->size() > 10);
  CHECK(static_cast<unsigned char>((*stored)[10]) == 0x01);
  auto compressed = SerializeGzip(p, fits - 1);
  REQUIRE(compressed.ok());
  CHECK(compressed->size() < raw.size() / 2);
  CHECK((static_cast<unsigned char>((*compressed)[10]) & 0x06) != 0);
  for (const std::string* gz : {&*stored, &*compressed}) {
    auto back = ParseMaybeGzip(*gz);
    REQUIRE(back.ok());
    CHECK(back->SerializeAsString() == raw);
  }
  CHECK(Gzip(raw, 7).status().code() == absl::StatusCode::kInvalidArgument);
}

TEST_CASE("ParseMaybeGzip rejects corrupt input", "[profile]") {
  auto gz = SerializeGzip(BuildExample());
  REQUIRE(gz.ok());
  std::string truncated = gz->substr(0, gz->size() / 2);
  CHECK(ParseMaybeGzip(truncated).status().code() == absl::StatusCode::kInvalidArgument);
  std::string garbage = "\x1f\x8b garbage";
  CHECK(!ParseMaybeGzip(garbage).ok());
}

}  // namespace parascope
