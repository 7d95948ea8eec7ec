#include "agent/export/server_limits.h"

#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

namespace parascope {
namespace {

using perftools::profiles::Profile;
using perftools::profiles::Sample;

// Index of the value samples are ranked by: default_sample_type, else the last sample type.
int WeightIndex(const Profile& p) {
  int n = p.sample_type_size();
  if (p.default_sample_type() != 0) {
    for (int i = 0; i < n; ++i) {
      if (p.sample_type(i).type() == p.default_sample_type()) return i;
    }
  }
  return n - 1;
}

// Identity of a sample's label set (in the sample's label order).
std::string LabelSetKey(const Sample& s) {
  std::string key;
  for (const auto& l : s.label()) {
    absl::StrAppend(&key, l.key(), ",", l.str(), ",", l.num(), ",", l.num_unit(), ";");
  }
  return key;
}

// Calls f(int64_t*) on every string-table index in the profile. Must list every field of
// proto/profile.proto that holds one.
template <typename F>
void ForEachStringRef(Profile* p, F f) {
  for (auto& vt : *p->mutable_sample_type()) {
    int64_t t = vt.type(), u = vt.unit();
    f(&t);
    f(&u);
    vt.set_type(t);
    vt.set_unit(u);
  }
  for (auto& s : *p->mutable_sample()) {
    for (auto& l : *s.mutable_label()) {
      int64_t k = l.key(), v = l.str(), u = l.num_unit();
      f(&k);
      f(&v);
      f(&u);
      l.set_key(k);
      l.set_str(v);
      l.set_num_unit(u);
    }
  }
  for (auto& m : *p->mutable_mapping()) {
    int64_t file = m.filename(), build = m.build_id();
    f(&file);
    f(&build);
    m.set_filename(file);
    m.set_build_id(build);
  }
  for (auto& fn : *p->mutable_function()) {
    int64_t name = fn.name(), sys = fn.system_name(), file = fn.filename();
    f(&name);
    f(&sys);
    f(&file);
    fn.set_name(name);
    fn.set_system_name(sys);
    fn.set_filename(file);
  }
  int64_t drop = p->drop_frames(), keep = p->keep_frames(), dflt = p->default_sample_type();
  f(&drop);
  f(&keep);
  f(&dflt);
  p->set_drop_frames(drop);
  p->set_keep_frames(keep);
  p->set_default_sample_type(dflt);
  if (p->has_period_type()) {
    int64_t t = p->period_type().type(), u = p->period_type().unit();
    f(&t);
    f(&u);
    p->mutable_period_type()->set_type(t);
    p->mutable_period_type()->set_unit(u);
  }
  for (auto& c : *p->mutable_comment()) f(&c);
}

// Drops Locations, Functions, Mappings and strings that nothing refers to; renumbers strings
// (keeping their order), keeps ids.
void Compact(Profile* p) {
  absl::flat_hash_set<uint64_t> locs, funcs, maps;
  for (const auto& s : p->sample()) locs.insert(s.location_id().begin(), s.location_id().end());
  auto* l = p->mutable_location();
  l->erase(std::remove_if(l->begin(), l->end(),
                          [&](const auto& loc) { return !locs.contains(loc.id()); }),
           l->end());
  for (const auto& loc : p->location()) {
    if (loc.mapping_id() != 0) maps.insert(loc.mapping_id());
    for (const auto& line : loc.line()) funcs.insert(line.function_id());
  }
  auto* f = p->mutable_function();
  f->erase(std::remove_if(f->begin(), f->end(),
                          [&](const auto& fn) { return !funcs.contains(fn.id()); }),
           f->end());
  auto* m = p->mutable_mapping();
  m->erase(std::remove_if(m->begin(), m->end(),
                          [&](const auto& map) { return !maps.contains(map.id()); }),
           m->end());

  const int64_t n = p->string_table_size();
  std::vector<int64_t> remap(n, -1);
  if (n > 0) remap[0] = 0;
  ForEachStringRef(p, [&](int64_t* idx) {
    if (*idx >= 0 && *idx < n) remap[*idx] = 0;
  });
  google::protobuf::RepeatedPtrField<std::string> table;
  for (int64_t i = 0; i < n; ++i) {
    if (remap[i] < 0) continue;
    remap[i] = table.size();
    table.Add(std::move(*p->mutable_string_table(i)));
  }
  p->mutable_string_table()->Swap(&table);
  ForEachStringRef(p, [&](int64_t* idx) {
    if (*idx >= 0 && *idx < n) *idx = remap[*idx];
  });
}

// `in` with the samples order[0, k) replaced by `[other]` samples (grouped by label set when
// `group_labels`), compacted.
Profile Fold(const Profile& in, const std::vector<int>& order, size_t k, bool group_labels,
             size_t max_samples, size_t max_bytes) {
  const int n = in.sample_size();
  std::vector<bool> folded(n, false);
  for (size_t i = 0; i < k; ++i) folded[order[i]] = true;

  Profile out;
  out.CopyFrom(in);
  out.clear_sample();
  for (int i = 0; i < n; ++i) {
    if (!folded[i]) *out.add_sample() = in.sample(i);
  }
  uint64_t max_fn = 0, max_loc = 0;
  for (const auto& fn : in.function()) max_fn = std::max<uint64_t>(max_fn, fn.id());
  for (const auto& loc : in.location()) max_loc = std::max<uint64_t>(max_loc, loc.id());
  if (out.string_table_size() == 0) out.add_string_table("");
  int64_t name = out.string_table_size();
  out.add_string_table("[other]");
  auto* fn = out.add_function();
  fn->set_id(max_fn + 1);
  fn->set_name(name);
  fn->set_system_name(name);
  auto* loc = out.add_location();
  loc->set_id(max_loc + 1);
  loc->add_line()->set_function_id(max_fn + 1);

  const int num_values = in.sample_type_size();
  absl::flat_hash_map<std::string, int> group_index;  // label set -> sample index in `out`
  for (int i = 0; i < n; ++i) {
    if (!folded[i]) continue;
    const Sample& s = in.sample(i);
    std::string key = group_labels ? LabelSetKey(s) : "";
    auto [it, inserted] = group_index.try_emplace(key, out.sample_size());
    Sample* other;
    if (inserted) {
      other = out.add_sample();
      other->add_location_id(max_loc + 1);
      for (int v = 0; v < std::max(num_values, s.value_size()); ++v) other->add_value(0);
      if (group_labels) *other->mutable_label() = s.label();
    } else {
      other = out.mutable_sample(it->second);
    }
    while (other->value_size() < s.value_size()) other->add_value(0);
    for (int v = 0; v < s.value_size(); ++v) {
      other->set_value(v, other->value(v) + s.value(v));
    }
  }
  out.add_comment(out.string_table_size());
  out.add_string_table(absl::StrCat("parascope: folded ", k,
                                    " smallest samples into [other] to stay within the server's "
                                    "limits (",
                                    max_samples, " samples, ", max_bytes, " bytes)"));
  Compact(&out);
  return out;
}

}  // namespace

size_t KeepSampleLabels(Profile* profile, const std::vector<std::string>& keep) {
  const int64_t n_strings = profile->string_table_size();
  std::vector<bool> kept_key(n_strings, false);
  for (int64_t i = 0; i < n_strings; ++i) {
    kept_key[i] = std::find(keep.begin(), keep.end(), profile->string_table(i)) != keep.end();
  }
  auto keeps = [&](const perftools::profiles::Label& l) {
    return l.key() >= 0 && l.key() < n_strings && kept_key[l.key()];
  };
  size_t removed = 0;
  for (const auto& s : profile->sample()) {
    for (const auto& l : s.label()) removed += !keeps(l);
  }
  if (removed == 0) return 0;

  google::protobuf::RepeatedPtrField<Sample> merged;
  absl::flat_hash_map<std::string, int> index;  // locations + remaining labels -> merged index
  for (auto& s : *profile->mutable_sample()) {
    auto* labels = s.mutable_label();
    labels->erase(
        std::remove_if(labels->begin(), labels->end(), [&](const auto& l) { return !keeps(l); }),
        labels->end());
    std::string key;
    for (uint64_t id : s.location_id()) absl::StrAppend(&key, id, ",");
    absl::StrAppend(&key, "|", LabelSetKey(s));
    auto [it, inserted] = index.try_emplace(key, merged.size());
    if (inserted) {
      *merged.Add() = std::move(s);
      continue;
    }
    Sample* into = merged.Mutable(it->second);
    while (into->value_size() < s.value_size()) into->add_value(0);
    for (int v = 0; v < s.value_size(); ++v) into->set_value(v, into->value(v) + s.value(v));
  }
  profile->mutable_sample()->Swap(&merged);
  Compact(profile);
  return removed;
}

size_t TrimForServerLimits(Profile* profile, size_t max_samples, size_t max_bytes) {
  max_samples = std::max<size_t>(max_samples, 2);
  const size_t n = profile->sample_size();
  if (n <= max_samples && profile->ByteSizeLong() <= max_bytes) return 0;
  if (n == 0) return 0;  // nothing to fold; the size comes from elsewhere

  const int w = WeightIndex(*profile);
  auto weight = [&](int i) -> int64_t {
    const Sample& s = profile->sample(i);
    return w >= 0 && w < s.value_size() ? s.value(w) : 0;
  };
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return weight(a) < weight(b); });

  // Distinct label sets among the k smallest, and whether they are kept apart (at most half the
  // sample budget goes to [other] samples, so folding everything always fits).
  const size_t max_sets = std::min(kMaxOtherLabelSets, max_samples / 2);
  auto groups = [&](size_t k, bool* grouped) -> size_t {
    absl::flat_hash_set<std::string> sets;
    for (size_t i = 0; i < k; ++i) {
      sets.insert(LabelSetKey(profile->sample(order[i])));
      if (sets.size() > max_sets) break;
    }
    *grouped = sets.size() <= max_sets;
    return *grouped ? sets.size() : 1;
  };
  // Samples after folding the k smallest: n - k kept plus the [other] samples. Non-increasing
  // in k (each extra folded sample adds at most one group), so the search below is monotone.
  auto count_ok = [&](size_t k) {
    bool grouped;
    return n - k + groups(k, &grouped) <= max_samples;
  };
  auto fold = [&](size_t k) {
    bool grouped;
    groups(k, &grouped);
    return Fold(*profile, order, k, grouped, max_samples, max_bytes);
  };

  // The smallest k meeting the sample limit...
  size_t k = 1;
  if (n > max_samples) {
    k = n - max_samples + 1;
    while (k < n && !count_ok(k)) {
      bool grouped;
      k = std::min(n, n + groups(k, &grouped) - max_samples);
    }
  }
  Profile candidate = fold(k);
  if (candidate.ByteSizeLong() <= max_bytes || k == n) {
    *profile = std::move(candidate);
    return k;
  }
  // ...then the smallest k that also meets the byte limit (binary search; the size shrinks as
  // more samples are folded). Folding everything is the fallback.
  size_t lo = k, hi = n;  // fold(lo) is too big; fold(hi) is the answer if nothing smaller is
  Profile best = fold(n);
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    Profile c = fold(mid);
    if (c.ByteSizeLong() <= max_bytes) {
      hi = mid;
      best = std::move(c);
    } else {
      lo = mid;
    }
  }
  *profile = std::move(best);
  return hi;
}

}  // namespace parascope
