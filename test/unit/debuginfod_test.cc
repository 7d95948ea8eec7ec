// symbolize::Debuginfod without the network beyond 127.0.0.1: the cache size bound (least
// recently used build-id directories go first), queue overflow, failures and their retry
// interval, shutdown during a stalled transfer, one fetch from a local server speaking
// debuginfod's GET /buildid/<id>/debuginfo (cpp-httplib), and DwarfCache using the fetched file
// for a stripped library from the window after it arrived.
#include "agent/symbolize/debuginfod.h"

#include <fcntl.h>
#include <gelf.h>
#include <httplib.h>
#include <libelf.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "agent/symbolize/dwarf.h"
#include "agent/symbolize/elf_file.h"
#include "test/unit/temp_dir.h"

namespace parascope::symbolize {
namespace {

namespace fs = std::filesystem;

using unit_testing::TempDir;

// Polls `done` every 10 ms until it holds or `timeout` passes; returns its last value.
template <typename F>
bool PollUntil(F done, absl::Duration timeout = absl::Seconds(20)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!done()) {
    if (absl::Now() > deadline) return done();
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return true;
}

// <dir>/<name>/debuginfo of `bytes` bytes, its atime and mtime `age_s` seconds ago.
void WriteEntry(const std::string& dir, const std::string& name, size_t bytes, int age_s) {
  fs::create_directories(dir + "/" + name);
  const std::string file = dir + "/" + name + "/debuginfo";
  std::ofstream(file, std::ios::binary) << std::string(bytes, 'x');
  timespec t{};
  clock_gettime(CLOCK_REALTIME, &t);
  t.tv_sec -= age_s;
  const timespec times[2] = {t, t};
  REQUIRE(utimensat(AT_FDCWD, file.c_str(), times, 0) == 0);
  REQUIRE(utimensat(AT_FDCWD, (dir + "/" + name).c_str(), times, 0) == 0);
}

// A TCP port on 127.0.0.1 nobody listens on (bound, then closed).
int ClosedPort() {
  int s = socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(s >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
  socklen_t len = sizeof(a);
  REQUIRE(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  close(s);
  return ntohs(a.sin_port);
}

// A listening socket that never accepts: connections complete in the kernel's backlog and the
// request is never answered, so a fetch stalls.
struct StalledServer {
  StalledServer() {
    fd = socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0);
    REQUIRE(listen(fd, 16) == 0);
    socklen_t len = sizeof(a);
    REQUIRE(getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
    port = ntohs(a.sin_port);
  }
  ~StalledServer() { close(fd); }
  int fd = -1;
  int port = 0;
};

// st_value of the .symtab symbol `name` in the ELF file at `path`, 0 if none.
uint64_t SymbolValue(const std::string& path, const std::string& name) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  REQUIRE(fd >= 0);
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ, nullptr);
  REQUIRE(elf != nullptr);
  uint64_t out = 0;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr sh{};
    if (gelf_getshdr(scn, &sh) == nullptr || sh.sh_type != SHT_SYMTAB || sh.sh_entsize == 0) {
      continue;
    }
    Elf_Data* data = elf_getdata(scn, nullptr);
    for (size_t i = 0; data != nullptr && i < sh.sh_size / sh.sh_entsize; ++i) {
      GElf_Sym sym{};
      if (gelf_getsym(data, static_cast<int>(i), &sym) == nullptr) continue;
      const char* n = elf_strptr(elf, sh.sh_link, sym.st_name);
      if (n != nullptr && name == n) out = sym.st_value;
    }
  }
  elf_end(elf);
  close(fd);
  return out;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A debuginfod server on 127.0.0.1 serving `files` (build id -> bytes) and 404 otherwise,
// counting requests by path.
class DebuginfodServer {
 public:
  explicit DebuginfodServer(std::map<std::string, std::string> files) : files_(std::move(files)) {
    server_.Get(R"(/buildid/([0-9a-f]+)/debuginfo)",
                [this](const httplib::Request& req, httplib::Response& res) {
                  {
                    std::lock_guard<std::mutex> l(mu_);
                    ++requests_[req.path];
                  }
                  auto it = files_.find(req.matches[1]);
                  if (it != files_.end()) {
                    res.set_content(it->second, "application/octet-stream");
                  } else {
                    res.status = 404;
                  }
                });
    port_ = server_.bind_to_any_port("127.0.0.1");
    REQUIRE(port_ > 0);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~DebuginfodServer() {
    server_.stop();
    thread_.join();
  }
  std::string url() const { return absl::StrCat("http://127.0.0.1:", port_); }
  int requests(const std::string& id) {
    std::lock_guard<std::mutex> l(mu_);
    return requests_[absl::StrCat("/buildid/", id, "/debuginfo")];
  }

 private:
  const std::map<std::string, std::string> files_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::map<std::string, int> requests_;
};

std::string Id(int n) { return absl::StrCat("ab", std::string(36, '0'), n % 10, n / 10 % 10); }

TEST_CASE("BoundDebuginfodCache deletes least recently used build-id directories first",
          "[debuginfod]") {
  TempDir dir;
  WriteEntry(dir.path(), "aa010000000000000000", 1000, 300);  // oldest
  WriteEntry(dir.path(), "aa020000000000000000", 1000, 200);
  WriteEntry(dir.path(), "aa030000000000000000", 1000, 100);                         // newest
  std::ofstream(dir.path() + "/cache_clean_interval_s") << "86400";  // libdebuginfod's, 5 bytes
  fs::create_directories(dir.path() + "/not-a-build-id");
  std::ofstream(dir.path() + "/not-a-build-id/x") << std::string(5000, 'y');

  // Within the bound: nothing happens.
  CacheBound b = BoundDebuginfodCache(dir.path(), 3005);
  CHECK(b.bytes == 3005);
  CHECK(b.evicted == 0);
  // Over it by one byte: the oldest goes, the control file and the other directory stay.
  b = BoundDebuginfodCache(dir.path(), 3004);
  CHECK(b.bytes == 2005);
  CHECK(b.evicted == 1);
  CHECK_FALSE(fs::exists(dir.path() + "/aa010000000000000000"));
  CHECK(fs::exists(dir.path() + "/aa020000000000000000/debuginfo"));
  CHECK(fs::exists(dir.path() + "/cache_clean_interval_s"));
  CHECK(fs::exists(dir.path() + "/not-a-build-id/x"));
  // A recent use (atime) makes the older directory the newer one.
  const std::string used = dir.path() + "/aa020000000000000000/debuginfo";
  const timespec now[2] = {{0, UTIME_NOW}, {0, UTIME_OMIT}};
  REQUIRE(utimensat(AT_FDCWD, used.c_str(), now, 0) == 0);
  b = BoundDebuginfodCache(dir.path(), 1500);
  CHECK(b.bytes == 1005);
  CHECK(b.evicted == 1);
  CHECK(fs::exists(used));
  CHECK_FALSE(fs::exists(dir.path() + "/aa030000000000000000"));
  // A bound below every file: all build-id directories go.
  b = BoundDebuginfodCache(dir.path(), 0);
  CHECK(b.bytes == 5);
  CHECK(b.evicted == 1);
  // Short hex names (other data, e.g. a .build-id/xx tree) are never deleted.
  WriteEntry(dir.path(), "cafe", 1000, 400);
  b = BoundDebuginfodCache(dir.path(), 0);
  CHECK(b.evicted == 0);
  CHECK(fs::exists(dir.path() + "/cafe/debuginfo"));
  // A missing directory is empty.
  b = BoundDebuginfodCache(dir.path() + "/missing", 0);
  CHECK(b.bytes == 0);
  CHECK(b.evicted == 0);
}

TEST_CASE("Debuginfod applies the size bound to the cache it starts with", "[debuginfod]") {
  TempDir dir;
  WriteEntry(dir.path(), "aa010000000000000000", 600 << 10, 300);
  WriteEntry(dir.path(), "aa020000000000000000", 600 << 10, 200);
  std::ofstream(dir.path() + "/" + kCacheMarker);  // made by an earlier run
  DebuginfodOptions o;
  o.urls = {absl::StrCat("http://127.0.0.1:", ClosedPort())};
  o.cache_dir = dir.path();
  o.cache_max_bytes = 1 << 20;
  auto d = Debuginfod::Create(o);
  REQUIRE(d.ok());
  CHECK(PollUntil([&] { return (*d)->stats().evictions == 1; }));
  CHECK((*d)->stats().cache_bytes == 600 << 10);
  CHECK_FALSE(fs::exists(dir.path() + "/aa010000000000000000"));
  // What is on disk is found without a request.
  CHECK((*d)->Lookup("aa020000000000000000") == dir.path() + "/aa020000000000000000/debuginfo");
  CHECK((*d)->Lookup("aa010000000000000000").empty());
  CHECK((*d)->Lookup("../etc").empty());  // not a build id
}

TEST_CASE("Debuginfod counts failures and asks again only after retry_after", "[debuginfod]") {
  TempDir dir;
  DebuginfodOptions o;
  o.urls = {absl::StrCat("http://127.0.0.1:", ClosedPort())};
  o.cache_dir = dir.path() + "/new/cache";  // created
  {
    auto d = Debuginfod::Create(o);
    REQUIRE(d.ok());
    CHECK(fs::is_directory(o.cache_dir));
    CHECK((*d)->Request(Id(1)));
    CHECK_FALSE((*d)->Request(Id(1)));  // queued or in progress: once
    CHECK(PollUntil([&] { return (*d)->stats().errors == 1; }));
    CHECK_FALSE((*d)->Request(Id(1)));  // failed a moment ago
    CHECK_FALSE((*d)->Fetched(Id(1)));
    CHECK((*d)->Lookup(Id(1)).empty());
    CHECK_FALSE((*d)->Request("not hex"));
    DebuginfodStats s = (*d)->stats();
    CHECK(s.fetched == 0);
    CHECK(s.not_found == 0);
    CHECK(s.dropped == 0);
  }
  o.retry_after = absl::ZeroDuration();
  auto d = Debuginfod::Create(o);
  REQUIRE(d.ok());
  CHECK((*d)->Request(Id(1)));
  CHECK(PollUntil([&] { return (*d)->stats().errors == 1; }));
  CHECK((*d)->Request(Id(1)));  // retry_after passed
  CHECK(PollUntil([&] { return (*d)->stats().errors == 2; }));
}

TEST_CASE("Debuginfod drops requests beyond its queue and stops a stalled fetch at exit",
          "[debuginfod]") {
  TempDir dir;
  StalledServer server;
  DebuginfodOptions o;
  o.urls = {absl::StrCat("http://127.0.0.1:", server.port)};
  o.cache_dir = dir.path();
  o.queue_capacity = 2;
  auto d = Debuginfod::Create(o);
  REQUIRE(d.ok());
  REQUIRE((*d)->Request(Id(0)));
  // The thread takes it and waits for the server.
  REQUIRE(PollUntil([&] {
    DebuginfodStats s = (*d)->stats();
    return s.busy && s.queued == 0;
  }));
  CHECK((*d)->Request(Id(1)));
  CHECK((*d)->Request(Id(2)));
  CHECK_FALSE((*d)->Request(Id(3)));  // queue full
  CHECK_FALSE((*d)->Request(Id(4)));
  CHECK_FALSE((*d)->Request(Id(1)));  // already queued: not a drop
  DebuginfodStats s = (*d)->stats();
  CHECK(s.queued == 2);
  CHECK(s.dropped == 2);
  // Shutdown aborts the transfer through the progress callback (polled once a second), well
  // before the 30 s stall timeout.
  const absl::Time t0 = absl::Now();
  d->reset();
  const absl::Duration took = absl::Now() - t0;
  INFO("destructor took " << absl::FormatDuration(took));
  CHECK(took < absl::Seconds(5));
}

TEST_CASE("Debuginfod fetches from a debuginfod server and keeps the cache bound", "[debuginfod]") {
  const std::string id = Id(7);
  const std::string body =
      "\x7f"
      "ELF debug file stand-in " +
      std::string(300 << 10, 'd');
  DebuginfodServer server(std::map<std::string, std::string>{{id, body}});
  TempDir dir;
  WriteEntry(dir.path(), "aa010000000000000000", 800 << 10, 300);  // old: evicted to make room
  std::ofstream(dir.path() + "/" + kCacheMarker);  // made by an earlier run
  DebuginfodOptions o;
  o.urls = {server.url()};
  o.cache_dir = dir.path();
  o.cache_max_bytes = 1 << 20;
  auto d = Debuginfod::Create(o);
  REQUIRE(d.ok());
  CHECK((*d)->Lookup(id).empty());
  CHECK((*d)->Request(id));
  CHECK((*d)->Request(Id(8)));  // the server has no such file
  CHECK(PollUntil([&] {
    DebuginfodStats s = (*d)->stats();
    return s.fetched == 1 && s.not_found == 1;
  }));
  CHECK((*d)->Fetched(id));
  CHECK_FALSE((*d)->Fetched(Id(8)));
  const std::string path = (*d)->Lookup(id);
  CHECK(path == dir.path() + "/" + id + "/debuginfo");
  CHECK(ReadAll(path) == body);
  CHECK((*d)->Lookup(Id(8)).empty());  // libdebuginfod's negative-cache mark is no file
  CHECK_FALSE((*d)->Request(id));      // fetched: never again
  DebuginfodStats s = (*d)->stats();
  CHECK(s.evictions == 1);
  CHECK_FALSE(fs::exists(dir.path() + "/aa010000000000000000"));
  CHECK(s.cache_bytes <= uint64_t{1} << 20);
  CHECK(s.cache_bytes >= body.size());
  CHECK(s.errors == 0);
  d->reset();
  CHECK(server.requests(id) == 1);
}

TEST_CASE("DwarfCache uses a debug file from debuginfod from the window after it arrived",
          "[debuginfod][symbolize]") {
  // The stripped fixture has only .dynsym; the unstripped one (same build id) has .symtab and
  // DWARF, so it serves as the stripped one's debug file.
  auto stripped = ElfFile::Open(PS_FIXTURE_LIB_STRIPPED);
  REQUIRE(stripped.ok());
  const std::string id = (*stripped)->build_id();
  REQUIRE(id.size() == 40);
  const uint64_t local = SymbolValue(PS_FIXTURE_LIB, "ps_fixture_local");
  REQUIRE(local != 0);
  DebuginfodServer server(std::map<std::string, std::string>{{id, ReadAll(PS_FIXTURE_LIB)}});
  TempDir dir;
  DebuginfodOptions o;
  o.urls = {server.url()};
  o.cache_dir = dir.path() + "/cache";
  auto d = Debuginfod::Create(o);
  REQUIRE(d.ok());
  DebugSearch search;
  search.debug_dirs = {dir.path()};  // holds nothing
  search.debuginfod = d->get();
  DwarfCache cache(search);
  const std::string key = "b:" + id;

  std::shared_ptr<DwarfFile> f = cache.Get(key, PS_FIXTURE_LIB_STRIPPED, "", "");
  REQUIRE(f != nullptr);
  for (const SourceFrame& frame : f->Symbolize(local)) CHECK(frame.name != "ps_fixture_local");
  CHECK(f->awaiting_debuginfod() == id);
  CHECK(f->debug_file().empty());
  CHECK(PollUntil([&] { return (*d)->Fetched(id); }));
  CHECK(cache.Get(key, PS_FIXTURE_LIB_STRIPPED, "", "") == f);  // not within the window
  cache.EndWindow();

  std::shared_ptr<DwarfFile> g = cache.Get(key, PS_FIXTURE_LIB_STRIPPED, "", "");
  REQUIRE(g != nullptr);
  CHECK(g != f);
  const std::vector<SourceFrame>& frames = g->Symbolize(local);
  REQUIRE_FALSE(frames.empty());
  CHECK(frames.back().name == "ps_fixture_local");
  CHECK(frames.back().line > 0);
  CHECK(g->HasDwarf());
  CHECK(g->debug_file() == o.cache_dir + "/" + id + "/debuginfo");
  CHECK(g->awaiting_debuginfod().empty());
  cache.EndWindow();
  CHECK(cache.Get(key, PS_FIXTURE_LIB_STRIPPED, "", "") == g);  // kept from now on
  CHECK(server.requests(id) == 1);
}

}  // namespace
TEST_CASE("Debuginfod refuses a non-empty cache directory it did not make", "[debuginfod]") {
  TempDir dir;
  std::ofstream(dir.path() + "/precious") << "data";
  DebuginfodOptions o;
  o.urls = {absl::StrCat("http://127.0.0.1:", ClosedPort())};
  o.cache_dir = dir.path();
  auto d = Debuginfod::Create(o);
  REQUIRE_FALSE(d.ok());
  CHECK(absl::IsFailedPrecondition(d.status()));
  CHECK(absl::StrContains(d.status().message(), dir.path()));
  CHECK(fs::exists(dir.path() + "/precious"));
  // An empty (or new) directory is claimed with the marker, and then accepted again.
  TempDir fresh;
  o.cache_dir = fresh.path() + "/cache";
  {
    auto first = Debuginfod::Create(o);
    REQUIRE(first.ok());
  }
  CHECK(fs::exists(o.cache_dir + "/" + kCacheMarker));
  std::ofstream(o.cache_dir + "/cache_clean_interval_s") << "86400";
  CHECK(Debuginfod::Create(o).ok());
}

}  // namespace parascope::symbolize
