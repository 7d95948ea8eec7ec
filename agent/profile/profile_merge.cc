#include "agent/profile/profile_merge.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace parascope {

namespace pp = perftools::profiles;

int64_t ProfileMerger::Str(absl::string_view s) {
  if (out_.string_table_size() == 0) {
    out_.add_string_table("");
    strings_.emplace("", 0);
  }
  auto [it, inserted] = strings_.try_emplace(s, out_.string_table_size());
  if (inserted) {
    out_.add_string_table(std::string(s));
    approx_bytes_ += 2 * s.size() + 64;  // the string, its table copy, their overheads
  }
  return it->second;
}

absl::Status ProfileMerger::Add(const pp::Profile& p, uint32_t pid, absl::string_view comm) {
  const int nstr = p.string_table_size();
  auto src = [&](int64_t i) -> absl::string_view {
    return i >= 0 && i < nstr ? absl::string_view(p.string_table(static_cast<int>(i)))
                              : absl::string_view();
  };
  if (profiles_ == 0) {
    Str("");
    for (const pp::ValueType& t : p.sample_type()) {
      pp::ValueType* o = out_.add_sample_type();
      o->set_type(Str(src(t.type())));
      o->set_unit(Str(src(t.unit())));
    }
    out_.mutable_period_type()->set_type(Str(src(p.period_type().type())));
    out_.mutable_period_type()->set_unit(Str(src(p.period_type().unit())));
    out_.set_period(p.period());
    out_.set_time_nanos(p.time_nanos());
    out_.set_duration_nanos(p.duration_nanos());
    out_.set_default_sample_type(Str(src(p.default_sample_type())));
    out_.set_drop_frames(Str(src(p.drop_frames())));
    out_.set_keep_frames(Str(src(p.keep_frames())));
    for (int64_t c : p.comment()) common_comments_.emplace_back(src(c));
  } else {
    bool same = p.sample_type_size() == out_.sample_type_size();
    for (int i = 0; same && i < p.sample_type_size(); ++i) {
      same = src(p.sample_type(i).type()) == out_.string_table(out_.sample_type(i).type()) &&
             src(p.sample_type(i).unit()) == out_.string_table(out_.sample_type(i).unit());
    }
    if (!same) {
      return absl::InvalidArgumentError(
          absl::StrCat("pid ", pid, ": sample types differ from the merged profiles'"));
    }
    std::vector<std::string> kept;
    for (std::string& c : common_comments_) {
      if (std::any_of(p.comment().begin(), p.comment().end(),
                      [&](int64_t i) { return src(i) == c; })) {
        kept.push_back(std::move(c));
      }
    }
    common_comments_ = std::move(kept);
  }
  ++profiles_;

  absl::flat_hash_map<uint64_t, uint64_t> function_ids;
  for (const pp::Function& f : p.function()) {
    auto key = std::make_tuple(Str(src(f.name())), Str(src(f.system_name())),
                               Str(src(f.filename())), f.start_line());
    auto [it, inserted] = functions_.try_emplace(key, out_.function_size() + 1);
    if (inserted) {
      approx_bytes_ += 128;
      pp::Function* o = out_.add_function();
      o->set_id(it->second);
      o->set_name(std::get<0>(key));
      o->set_system_name(std::get<1>(key));
      o->set_filename(std::get<2>(key));
      o->set_start_line(f.start_line());
    }
    function_ids[f.id()] = it->second;
  }
  struct MappingRemap {
    uint64_t id = 0;
    uint64_t delta = 0;  // added to an address (mod 2^64): first start - this start
  };
  absl::flat_hash_map<uint64_t, MappingRemap> mapping_ids;
  for (const pp::Mapping& m : p.mapping()) {
    const uint32_t bits = (m.has_functions() ? 1u : 0u) | (m.has_filenames() ? 2u : 0u) |
                          (m.has_line_numbers() ? 4u : 0u) | (m.has_inline_frames() ? 8u : 0u);
    auto key = std::make_tuple(Str(src(m.filename())), Str(src(m.build_id())), m.file_offset(),
                               m.memory_limit() - m.memory_start(), bits);
    auto [it, inserted] = mappings_.try_emplace(key, out_.mapping_size());
    if (inserted) {
      approx_bytes_ += 160;
      pp::Mapping* o = out_.add_mapping();
      *o = m;
      o->set_id(static_cast<uint64_t>(out_.mapping_size()));
      o->set_filename(std::get<0>(key));
      o->set_build_id(std::get<1>(key));
    }
    const pp::Mapping& first = out_.mapping(it->second);
    mapping_ids[m.id()] = {first.id(), first.memory_start() - m.memory_start()};
  }
  absl::flat_hash_map<uint64_t, uint64_t> location_ids;
  for (const pp::Location& l : p.location()) {
    uint64_t mapping_id = 0;
    uint64_t address = l.address();
    if (auto m = mapping_ids.find(l.mapping_id()); m != mapping_ids.end()) {
      mapping_id = m->second.id;
      address += m->second.delta;
    }
    key_scratch_.clear();
    key_scratch_.push_back(static_cast<int64_t>(mapping_id));
    key_scratch_.push_back(static_cast<int64_t>(address));
    key_scratch_.push_back(l.is_folded() ? 1 : 0);
    for (const pp::Line& line : l.line()) {
      auto f = function_ids.find(line.function_id());
      key_scratch_.push_back(f != function_ids.end() ? static_cast<int64_t>(f->second) : 0);
      key_scratch_.push_back(line.line());
      key_scratch_.push_back(line.column());
    }
    auto [it, inserted] = locations_.try_emplace(key_scratch_, out_.location_size() + 1);
    if (inserted) {
      approx_bytes_ += 96 + 8 * key_scratch_.size() + 48 * (key_scratch_.size() - 3) / 3;
      pp::Location* o = out_.add_location();
      o->set_id(it->second);
      o->set_mapping_id(mapping_id);
      o->set_address(address);
      o->set_is_folded(l.is_folded());
      for (size_t i = 3; i + 2 < key_scratch_.size(); i += 3) {
        pp::Line* line = o->add_line();
        line->set_function_id(static_cast<uint64_t>(key_scratch_[i]));
        line->set_line(key_scratch_[i + 1]);
        line->set_column(key_scratch_[i + 2]);
      }
    }
    location_ids[l.id()] = it->second;
  }
  const int64_t pid_key = Str("pid");
  const int64_t process_key = Str("process");
  const int64_t comm_str = Str(comm);
  for (const pp::Sample& s : p.sample()) {
    // The Sample, its arrays, and each Label (a message of ~48 bytes behind a pointer).
    approx_bytes_ += 96 + 8 * (s.location_id_size() + s.value_size()) +
                     56 * (2 + static_cast<size_t>(s.label_size()));
    pp::Sample* o = out_.add_sample();
    o->mutable_location_id()->Reserve(s.location_id_size());
    for (uint64_t id : s.location_id()) {
      auto it = location_ids.find(id);
      o->add_location_id(it != location_ids.end() ? it->second : 0);
    }
    *o->mutable_value() = s.value();
    pp::Label* l = o->add_label();
    l->set_key(pid_key);
    l->set_num(pid);
    l = o->add_label();
    l->set_key(process_key);
    l->set_str(comm_str);
    for (const pp::Label& sl : s.label()) {
      l = o->add_label();
      l->set_key(Str(src(sl.key())));
      if (sl.str() != 0) l->set_str(Str(src(sl.str())));
      l->set_num(sl.num());
      if (sl.num_unit() != 0) l->set_num_unit(Str(src(sl.num_unit())));
    }
  }
  return absl::OkStatus();
}

pp::Profile ProfileMerger::Take(absl::string_view note) {
  for (const std::string& c : common_comments_) out_.add_comment(Str(c));
  out_.add_comment(Str(absl::StrCat("parascope: the profiles of ", profiles_,
                                    " process images merged; each sample's labels pid and "
                                    "process name its process")));
  if (!note.empty()) out_.add_comment(Str(note));
  pp::Profile result = std::move(out_);
  out_ = pp::Profile();
  profiles_ = 0;
  approx_bytes_ = 0;
  common_comments_.clear();
  strings_.clear();
  functions_.clear();
  mappings_.clear();
  locations_.clear();
  return result;
}

}  // namespace parascope
