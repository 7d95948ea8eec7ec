#include "agent/profile/pprof_builder.h"

#include <sys/mman.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <mutex>
#include <new>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "agent/util/libdeflate.h"

namespace parascope {

namespace {

// Blocks freed by the arenas of a window, kept for the next arena (a window makes one per
// process): without it every process's profiles cost an mmap, page faults on fresh pages and a
// munmap with its TLB shootdown (make bench: scenario 3 took 0.265 s of agent CPU a window
// without the cache, 0.183 s with it; 2 min of churn 5.29% and 4.43% of a core).
struct ArenaBlockCache {
  std::mutex mu;
  std::vector<void*> blocks;  // each kProfileArenaBlockBytes
};
ArenaBlockCache& BlockCache() {
  static auto* cache = new ArenaBlockCache();  // never destroyed: arenas may outlive statics
  return *cache;
}

void* ArenaBlockAlloc(size_t bytes) {
  if (bytes == kProfileArenaBlockBytes) {
    ArenaBlockCache& c = BlockCache();
    std::lock_guard<std::mutex> l(c.mu);
    if (!c.blocks.empty()) {
      void* p = c.blocks.back();
      c.blocks.pop_back();
      return p;
    }
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  return p;
}

void ArenaBlockDealloc(void* p, size_t bytes) {
  if (bytes == kProfileArenaBlockBytes) {
    ArenaBlockCache& c = BlockCache();
    std::lock_guard<std::mutex> l(c.mu);
    if (c.blocks.size() < kProfileArenaCachedBlocks) {
      c.blocks.push_back(p);
      return;
    }
  }
  munmap(p, bytes);
}

}  // namespace

void ReleaseProfileArenaBlocks() {
  std::vector<void*> blocks;
  {
    ArenaBlockCache& c = BlockCache();
    std::lock_guard<std::mutex> l(c.mu);
    blocks.swap(c.blocks);
  }
  for (void* p : blocks) munmap(p, kProfileArenaBlockBytes);
}

size_t CachedProfileArenaBlocks() {
  ArenaBlockCache& c = BlockCache();
  std::lock_guard<std::mutex> l(c.mu);
  return c.blocks.size();
}

std::shared_ptr<google::protobuf::Arena> NewProfileArena() {
  google::protobuf::ArenaOptions options;
  options.start_block_size = kProfileArenaBlockBytes;
  options.max_block_size = kProfileArenaBlockBytes;
  options.block_alloc = ArenaBlockAlloc;
  options.block_dealloc = ArenaBlockDealloc;
  return std::make_shared<google::protobuf::Arena>(options);
}

PprofBuilder::PprofBuilder(std::vector<ValueTypeSpec> sample_types, ValueTypeSpec period_type,
                           int64_t period, std::shared_ptr<google::protobuf::Arena> arena)
    : arena_(arena != nullptr ? std::move(arena) : NewProfileArena()),
      profile_(google::protobuf::Arena::CreateMessage<perftools::profiles::Profile>(arena_.get())),
      num_values_(sample_types.size()) {
  InternString("");
  for (const auto& st : sample_types) {
    auto* vt = profile_->add_sample_type();
    vt->set_type(InternString(st.type));
    vt->set_unit(InternString(st.unit));
  }
  if (!period_type.type.empty()) {
    profile_->mutable_period_type()->set_type(InternString(period_type.type));
    profile_->mutable_period_type()->set_unit(InternString(period_type.unit));
    profile_->set_period(period);
  }
}

// The keys are views of arena memory that stays as long as the arena, which the copy shares.
PprofBuilder::PprofBuilder(const PprofBuilder& other)
    : arena_(other.arena_),
      profile_(google::protobuf::Arena::CreateMessage<perftools::profiles::Profile>(arena_.get())),
      num_values_(other.num_values_),
      strings_(other.strings_),
      mappings_(other.mappings_),
      functions_(other.functions_),
      locations_(other.locations_),
      samples_(other.samples_),
      frame_memo_(other.frame_memo_),
      approx_bytes_(other.approx_bytes_) {
  profile_->CopyFrom(*other.profile_);
}

PprofBuilder PprofBuilder::ForkAs(const std::vector<ValueTypeSpec>& sample_types,
                                  const ValueTypeSpec& period_type, int64_t period) const {
  PprofBuilder b = *this;
  const size_t n = std::min<size_t>(sample_types.size(), b.profile_->sample_type_size());
  for (size_t i = 0; i < n; ++i) {
    auto* vt = b.profile_->mutable_sample_type(static_cast<int>(i));
    vt->set_type(b.InternString(sample_types[i].type));
    vt->set_unit(b.InternString(sample_types[i].unit));
  }
  if (period_type.type.empty()) {
    b.profile_->clear_period_type();
    b.profile_->clear_period();
  } else {
    b.profile_->mutable_period_type()->set_type(b.InternString(period_type.type));
    b.profile_->mutable_period_type()->set_unit(b.InternString(period_type.unit));
    b.profile_->set_period(period);
  }
  return b;
}

absl::string_view PprofBuilder::ArenaCopy(absl::string_view s) {
  if (s.empty()) return {};
  char* p = google::protobuf::Arena::CreateArray<char>(arena_.get(), s.size());
  memcpy(p, s.data(), s.size());
  return {p, s.size()};
}

absl::Span<const uint64_t> PprofBuilder::ArenaCopy(absl::Span<const uint64_t> ids) {
  if (ids.empty()) return {};
  uint64_t* p = google::protobuf::Arena::CreateArray<uint64_t>(arena_.get(), ids.size());
  std::copy(ids.begin(), ids.end(), p);
  return {p, ids.size()};
}

int64_t PprofBuilder::InternString(absl::string_view s) {
  auto it = strings_.find(s);
  if (it != strings_.end()) return it->second;
  const int64_t id = profile_->string_table_size();
  profile_->add_string_table(std::string(s));
  approx_bytes_ += 2 * s.size() + 64;  // the string, its table copy, their overheads
  strings_.emplace(ArenaCopy(s), id);
  return id;
}

uint64_t PprofBuilder::AddMapping(const MappingSpec& m) {
  std::string key = absl::StrCat(m.memory_start, "/", m.memory_limit, "/", m.file_offset, "/",
                                 m.has_functions, "/", m.build_id, "/", m.filename);
  auto it = mappings_.find(key);
  if (it != mappings_.end()) return it->second;
  auto* pm = profile_->add_mapping();
  uint64_t id = profile_->mapping_size();
  pm->set_id(id);
  pm->set_memory_start(m.memory_start);
  pm->set_memory_limit(m.memory_limit);
  pm->set_file_offset(m.file_offset);
  pm->set_filename(InternString(m.filename));
  pm->set_build_id(InternString(m.build_id));
  pm->set_has_functions(m.has_functions);
  approx_bytes_ += key.size() + 128;
  mappings_.emplace(ArenaCopy(key), id);
  return id;
}

uint64_t PprofBuilder::AddFunction(const FunctionSpec& f) {
  std::string key = absl::StrCat(f.name, "\x1f", f.system_name, "\x1f", f.filename);
  auto it = functions_.find(key);
  if (it != functions_.end()) return it->second;
  auto* pf = profile_->add_function();
  uint64_t id = profile_->function_size();
  pf->set_id(id);
  pf->set_name(InternString(f.name));
  pf->set_system_name(InternString(f.system_name));
  pf->set_filename(InternString(f.filename));
  approx_bytes_ += key.size() + 96;
  functions_.emplace(ArenaCopy(key), id);
  return id;
}

uint64_t PprofBuilder::InsertLocation(const LocationKey& key) {
  const uint64_t id = profile_->location_size() + 1;
  locations_.emplace(LocationKey{key.mapping_id, key.address, ArenaCopy(key.function_ids)}, id);
  auto* pl = profile_->add_location();
  pl->set_id(id);
  pl->set_mapping_id(key.mapping_id);
  pl->set_address(key.address);
  return id;
}

uint64_t PprofBuilder::AddLocation(uint64_t mapping_id, uint64_t address,
                                   absl::Span<const uint64_t> function_ids) {
  LocationKey key{mapping_id, address, function_ids};
  auto it = locations_.find(key);
  if (it != locations_.end()) return it->second;
  const uint64_t id = InsertLocation(key);
  auto* pl = profile_->mutable_location(static_cast<int>(id - 1));
  pl->mutable_line()->Reserve(static_cast<int>(function_ids.size()));
  for (uint64_t fid : function_ids) pl->add_line()->set_function_id(fid);
  approx_bytes_ += 128 + 40 * function_ids.size();
  return id;
}

uint64_t PprofBuilder::AddLocationLines(uint64_t mapping_id, uint64_t address,
                                        absl::Span<const LineRef> lines) {
  // Key: function ids with their line numbers folded in (ids and lines alternate, with the high
  // bit set on the lines so they never equal a plain function-id list).
  key_scratch_.clear();
  for (const LineRef& l : lines) {
    key_scratch_.push_back(l.function_id);
    key_scratch_.push_back(static_cast<uint64_t>(l.line) | (uint64_t{1} << 63));
  }
  LocationKey key{mapping_id, address, key_scratch_};
  auto it = locations_.find(key);
  if (it != locations_.end()) return it->second;
  const uint64_t id = InsertLocation(key);
  auto* pl = profile_->mutable_location(static_cast<int>(id - 1));
  pl->mutable_line()->Reserve(static_cast<int>(lines.size()));
  for (const LineRef& l : lines) {
    auto* line = pl->add_line();
    line->set_function_id(l.function_id);
    if (l.line > 0) line->set_line(l.line);
  }
  approx_bytes_ += 128 + 56 * lines.size();
  return id;
}

uint64_t PprofBuilder::AddSyntheticLocation(absl::string_view name) {
  uint64_t fid = AddFunction({std::string(name), std::string(name), ""});
  return AddLocation(0, 0, {fid});
}

void PprofBuilder::AddSample(absl::Span<const uint64_t> location_ids,
                             absl::Span<const int64_t> values, absl::Span<const LabelSpec> labels) {
  std::string& key = sample_key_scratch_;
  key.clear();
  for (uint64_t id : location_ids) absl::StrAppend(&key, id, ",");
  for (const auto& l : labels) {
    absl::StrAppend(&key, "\x1f", l.key, "=");
    if (l.is_num) {
      absl::StrAppend(&key, l.num, l.num_unit, "#");
    } else {
      absl::StrAppend(&key, l.str, "$");
    }
  }
  auto it = samples_.find(key);
  if (it != samples_.end()) {
    auto* s = profile_->mutable_sample(it->second);
    for (size_t i = 0; i < num_values_ && i < values.size(); ++i) {
      s->set_value(i, s->value(i) + values[i]);
    }
    return;
  }
  auto* s = profile_->add_sample();
  s->mutable_location_id()->Reserve(static_cast<int>(location_ids.size()));
  for (uint64_t id : location_ids) s->add_location_id(id);
  s->mutable_value()->Reserve(static_cast<int>(num_values_));
  for (size_t i = 0; i < num_values_; ++i) s->add_value(i < values.size() ? values[i] : 0);
  s->mutable_label()->Reserve(static_cast<int>(labels.size()));
  for (const auto& l : labels) {
    auto* pl = s->add_label();
    pl->set_key(InternString(l.key));
    if (l.is_num) {
      pl->set_num(l.num);
      if (!l.num_unit.empty()) pl->set_num_unit(InternString(l.num_unit));
    } else {
      pl->set_str(InternString(l.str));
    }
  }
  approx_bytes_ += key.size() + 96 + 8 * (location_ids.size() + num_values_) + 40 * labels.size();
  samples_.emplace(ArenaCopy(key), profile_->sample_size() - 1);
}

void PprofBuilder::AddComment(absl::string_view comment) {
  profile_->add_comment(InternString(comment));
}

int64_t PprofBuilder::ValueSum(size_t index) const {
  int64_t sum = 0;
  for (const auto& s : profile_->sample()) {
    if (static_cast<int>(index) < s.value_size()) sum += s.value(index);
  }
  return sum;
}

std::shared_ptr<perftools::profiles::Profile> PprofBuilder::Build(int64_t time_nanos,
                                                                  int64_t duration_nanos) && {
  profile_->set_time_nanos(time_nanos);
  profile_->set_duration_nanos(duration_nanos);
  // Shares ownership of the arena; the Profile itself is freed with it.
  return std::shared_ptr<perftools::profiles::Profile>(std::move(arena_), profile_);
}

absl::StatusOr<std::string> SerializeGzip(const perftools::profiles::Profile& profile,
                                          size_t store_within) {
  std::string raw;
  if (!profile.SerializeToString(&raw)) return absl::InternalError("pprof: serialization failed");
  return Gzip(raw, raw.size() + kGzipStoredOverhead <= store_within ? 0 : kGzipLevel);
}

absl::StatusOr<std::string> Gzip(absl::string_view raw, int level) {
  // libdeflate compresses a whole buffer at once: no streaming state to set up and clear per
  // call, which is what a small profile costs with zlib (measured on 400 of this agent's
  // profiles, 1.5 KB on average: zlib level 1 35 us each, ratio 1.50; libdeflate level 2 12 us,
  // ratio 1.505; level 1 9 us but 1.44; level 0, stored, 0.14 us). One compressor per level and
  // thread (level 2's hash tables are about 200 KB): the main loop and the push thread compress.
  if (level != 0 && level != kGzipLevel) {
    return absl::InvalidArgumentError(absl::StrCat("gzip: level ", level, " not offered"));
  }
  thread_local DeflateCompressor stored(libdeflate_alloc_compressor(0));
  thread_local DeflateCompressor compressed(libdeflate_alloc_compressor(kGzipLevel));
  libdeflate_compressor* c = level == 0 ? stored.get() : compressed.get();
  if (c == nullptr) return absl::ResourceExhaustedError("gzip: out of memory");
  std::string out;
  out.resize(libdeflate_gzip_compress_bound(c, raw.size()));
  const size_t n = libdeflate_gzip_compress(c, raw.data(), raw.size(), out.data(), out.size());
  // Cannot happen with a buffer of the bound's size (libdeflate.h).
  if (n == 0) return absl::InternalError("gzip: output larger than libdeflate's bound");
  out.resize(n);
  return out;
}

absl::StatusOr<perftools::profiles::Profile> ParseMaybeGzip(absl::string_view data) {
  std::string raw;
  if (data.size() >= 2 && static_cast<unsigned char>(data[0]) == 0x1f &&
      static_cast<unsigned char>(data[1]) == 0x8b) {
    z_stream zs{};
    if (inflateInit2(&zs, 15 + 16) != Z_OK) return absl::InternalError("gzip: inflateInit2");
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs.avail_in = data.size();
    char buf[1 << 16];
    int rc;
    do {
      zs.next_out = reinterpret_cast<Bytef*>(buf);
      zs.avail_out = sizeof(buf);
      rc = inflate(&zs, Z_NO_FLUSH);
      if (rc != Z_OK && rc != Z_STREAM_END) {
        inflateEnd(&zs);
        return absl::InvalidArgumentError(absl::StrCat("gzip: corrupt data (", rc, ")"));
      }
      raw.append(buf, sizeof(buf) - zs.avail_out);
    } while (rc != Z_STREAM_END);
    inflateEnd(&zs);
  } else {
    raw.assign(data.data(), data.size());
  }
  perftools::profiles::Profile p;
  if (!p.ParseFromString(raw)) return absl::InvalidArgumentError("pprof: not a valid Profile");
  return p;
}

}  // namespace parascope
