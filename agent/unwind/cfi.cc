#include "agent/unwind/cfi.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <gelf.h>
#include <libelf.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "agent/util/status.h"

namespace parascope::unwind {
namespace {

// DW_EH_PE_* pointer encodings (LSB "DWARF Extensions", .eh_frame_hdr / .eh_frame).
constexpr uint8_t kPeOmit = 0xff;
constexpr uint8_t kPeFormatMask = 0x0f;
constexpr uint8_t kPeAbsptr = 0x00, kPeUleb128 = 0x01, kPeUdata2 = 0x02, kPeUdata4 = 0x03,
                  kPeUdata8 = 0x04, kPeSleb128 = 0x09, kPeSdata2 = 0x0a, kPeSdata4 = 0x0b,
                  kPeSdata8 = 0x0c;
constexpr uint8_t kPeApplMask = 0x70;
constexpr uint8_t kPePcrel = 0x10;

// DW_OP_* used by the expressions the walker understands (DWARF 5 section 7.7.1).
constexpr uint8_t kOpDeref = 0x06, kOpAnd = 0x1a, kOpPlus = 0x22, kOpShl = 0x24, kOpGe = 0x2a,
                  kOpLit0 = 0x30, kOpBreg0 = 0x70;

// An operand times the CIE's data alignment factor. Both come from the file: a product that does
// not fit in 64 bits (signed overflow would be undefined behaviour) becomes INT64_MIN, an offset
// Row() finds out of range like any other it cannot express.
int64_t Factored(int64_t operand, int64_t data_align) {
  int64_t out;
  return __builtin_mul_overflow(operand, data_align, &out) ? INT64_MIN : out;
}

// Bounded little-endian reader over a byte span; any overrun sets failed() and returns 0.
class Reader {
 public:
  Reader(absl::Span<const uint8_t> data, size_t pos = 0)
      : data_(data), pos_(std::min(pos, data.size())), fail_(pos > data.size()) {}
  size_t pos() const { return pos_; }
  void seek(size_t p) {
    if (p > data_.size()) fail_ = true;
    pos_ = std::min(p, data_.size());
  }
  bool failed() const { return fail_; }
  bool at_end() const { return pos_ >= data_.size(); }
  uint64_t Fixed(size_t n) {
    if (n > data_.size() - pos_) {
      fail_ = true;
      pos_ = data_.size();
      return 0;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; ++i) v |= uint64_t{data_[pos_ + i]} << (8 * i);
    pos_ += n;
    return v;
  }
  uint8_t U8() { return static_cast<uint8_t>(Fixed(1)); }
  uint64_t Uleb() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64 + 7; shift += 7) {
      if (pos_ >= data_.size()) {
        fail_ = true;
        return 0;
      }
      uint8_t b = data_[pos_++];
      if (shift < 64) v |= uint64_t{b & 0x7fu} << shift;
      if (!(b & 0x80)) return v;
    }
    fail_ = true;
    return v;
  }
  int64_t Sleb() {
    int64_t v = 0;
    int shift = 0;
    uint8_t b = 0;
    do {
      if (pos_ >= data_.size()) {
        fail_ = true;
        return 0;
      }
      b = data_[pos_++];
      if (shift < 64) v |= int64_t(b & 0x7f) << shift;
      shift += 7;
    } while (b & 0x80);
    if (shift < 64 && (b & 0x40)) v |= static_cast<int64_t>(~uint64_t{0} << shift);
    return v;
  }
  std::string CString() {
    std::string s;
    while (pos_ < data_.size() && data_[pos_] != 0) s.push_back(static_cast<char>(data_[pos_++]));
    if (pos_ >= data_.size()) {
      fail_ = true;
      return s;
    }
    ++pos_;
    return s;
  }
  absl::Span<const uint8_t> Bytes(size_t n) {
    if (n > data_.size() - pos_) {
      fail_ = true;
      pos_ = data_.size();
      return {};
    }
    auto s = data_.subspan(pos_, n);
    pos_ += n;
    return s;
  }
  // A DW_EH_PE-encoded pointer; `field_vaddr` is the address of the field (pcrel base).
  std::optional<uint64_t> Pointer(uint8_t enc, uint64_t field_vaddr) {
    if (enc == kPeOmit) return std::nullopt;
    uint64_t v;
    switch (enc & kPeFormatMask) {
      case kPeAbsptr: v = Fixed(8); break;
      case kPeUleb128: v = Uleb(); break;
      case kPeUdata2: v = Fixed(2); break;
      case kPeUdata4: v = Fixed(4); break;
      case kPeUdata8: v = Fixed(8); break;
      case kPeSleb128: v = static_cast<uint64_t>(Sleb()); break;
      case kPeSdata2: v = static_cast<uint64_t>(static_cast<int16_t>(Fixed(2))); break;
      case kPeSdata4: v = static_cast<uint64_t>(static_cast<int32_t>(Fixed(4))); break;
      case kPeSdata8: v = Fixed(8); break;
      default: fail_ = true; return std::nullopt;
    }
    switch (enc & kPeApplMask) {
      case 0: break;
      case kPePcrel: v += field_vaddr; break;
      default: break;  // textrel/datarel/funcrel: not used for FDE addresses on x86-64 Linux
    }
    return v;
  }

 private:
  absl::Span<const uint8_t> data_;
  size_t pos_ = 0;
  bool fail_ = false;
};

// A register rule (DWARF 5 section 6.4.1). Only the kinds the walker can use keep their data.
struct RegRule {
  enum Kind : uint8_t { kUnspecified, kUndefined, kSame, kOffset, kValOffset, kRegister, kExpr,
                        kValExpr };
  Kind kind = kUnspecified;
  int64_t offset = 0;
  absl::Span<const uint8_t> expr;
};

struct CfaRule {
  bool is_expr = false;
  uint64_t reg = 0;
  int64_t offset = 0;
  absl::Span<const uint8_t> expr;
};

struct State {
  CfaRule cfa;
  RegRule fp, ra;
};

struct Cie {
  uint64_t code_align = 1;
  int64_t data_align = 1;
  uint64_t ra_reg = 16;
  uint8_t fde_encoding = kPeAbsptr;
  bool has_aug_data = false;
  bool signal = false;
  bool ok = false;
  absl::Span<const uint8_t> initial;
  uint8_t address_size = 8;
};

struct FdeRows {
  uint64_t start = 0, end = 0;
  int section = 0;
  std::vector<ps_unwind_row> rows;  // pc: absolute ELF address (< 4 GiB, checked)
};

class Builder {
 public:
  Builder(const CfiArch& arch, CfiStats* stats) : arch_(arch), stats_(stats) {}

  // Appends one FdeRows per FDE of the section. Stops at the first corrupt length (the rest of
  // the section cannot be framed); skips FDEs whose CIE or fields are malformed.
  void ParseSection(const CfiSection& sec, int index, std::vector<FdeRows>* out) {
    Reader r(sec.data);
    absl::flat_hash_map<size_t, Cie> cies;
    while (!r.at_end()) {
      uint64_t length = r.Fixed(4);
      bool is64 = false;
      if (r.failed()) return;
      if (length == 0) {
        if (!sec.debug_frame) return;  // .eh_frame terminator
        continue;
      }
      if (length == 0xffffffffu) {
        length = r.Fixed(8);
        is64 = true;
      }
      const size_t body = r.pos();
      if (r.failed() || length > sec.data.size() - body) return;
      const size_t next = body + length;
      const size_t id_pos = r.pos();
      // .eh_frame's CIE id / pointer is 4 bytes even after a 64-bit length (LSB "Exception
      // Frames"); .debug_frame's follows the DWARF format (8 bytes in 64-bit DWARF).
      const bool id64 = is64 && sec.debug_frame;
      uint64_t id = r.Fixed(id64 ? 8 : 4);
      const bool is_cie =
          sec.debug_frame ? id == (id64 ? ~uint64_t{0} : uint64_t{0xffffffffu}) : id == 0;
      if (!is_cie && !r.failed()) {
        if (!sec.debug_frame && id > id_pos) {
          ++stats_->fdes;
          ++stats_->fdes_skipped;
        } else {
          size_t cie_off = sec.debug_frame ? static_cast<size_t>(id) : id_pos - id;
          auto it = cies.find(cie_off);
          if (it == cies.end()) it = cies.emplace(cie_off, ParseCie(sec, cie_off)).first;
          ParseFde(sec, it->second, r, next, index, out);
        }
      }
      r.seek(next);
    }
  }

 private:
  Cie ParseCie(const CfiSection& sec, size_t off) {
    Cie c;
    Reader r(sec.data, off);
    uint64_t length = r.Fixed(4);
    bool is64 = false;
    if (length == 0xffffffffu) {
      length = r.Fixed(8);
      is64 = true;
    }
    const size_t body = r.pos();
    if (r.failed() || length > sec.data.size() - body) return c;
    const size_t end = body + length;
    r.Fixed(is64 && sec.debug_frame ? 8 : 4);  // CIE id
    uint8_t version = r.U8();
    std::string aug = r.CString();
    if (aug.find("eh") != std::string::npos) r.Fixed(8);  // obsolete GCC eh_ptr
    if (version >= 4) {
      c.address_size = r.U8();
      r.U8();  // segment selector size
    }
    c.code_align = r.Uleb();
    c.data_align = r.Sleb();
    c.ra_reg = version == 1 ? r.U8() : r.Uleb();
    if (sec.debug_frame) c.fde_encoding = c.address_size == 4 ? kPeUdata4 : kPeAbsptr;
    if (!aug.empty() && aug[0] == 'z') {
      c.has_aug_data = true;
      uint64_t aug_len = r.Uleb();
      const size_t aug_end = r.pos() + aug_len;
      for (size_t i = 1; i < aug.size() && !r.failed(); ++i) {
        switch (aug[i]) {
          case 'R': c.fde_encoding = r.U8(); break;
          case 'L': r.U8(); break;
          case 'P': {
            uint8_t enc = r.U8();
            r.Pointer(enc & 0x7f, sec.vaddr + r.pos());
            break;
          }
          case 'S': c.signal = true; break;
          default: break;  // 'B', 'G' (arm64) carry no data
        }
      }
      r.seek(aug_end);
    } else if (!aug.empty()) {
      return c;  // an augmentation without 'z' has a layout we cannot know
    }
    if (r.failed() || r.pos() > end) return c;
    c.initial = sec.data.subspan(r.pos(), end - r.pos());
    c.ok = c.code_align != 0 && c.ra_reg == static_cast<uint64_t>(arch_.ra_reg);
    return c;
  }

  void ParseFde(const CfiSection& sec, const Cie& cie, Reader& r, size_t end, int index,
                std::vector<FdeRows>* out) {
    ++stats_->fdes;
    if (sec.debug_frame) ++stats_->fdes_debug_frame;
    if (!cie.ok) {
      ++stats_->fdes_skipped;
      return;
    }
    std::optional<uint64_t> start = r.Pointer(cie.fde_encoding, sec.vaddr + r.pos());
    std::optional<uint64_t> range = r.Pointer(cie.fde_encoding & kPeFormatMask, 0);
    if (cie.has_aug_data) r.Bytes(r.Uleb());
    if (r.failed() || !start || !range || r.pos() > end || *range == 0 || *start == 0 ||
        *start + *range > 0xffffffffu || *start + *range < *start) {
      ++stats_->fdes_skipped;  // also FDEs of discarded (garbage-collected) code at address 0
      return;
    }
    FdeRows f;
    f.start = *start;
    f.end = *start + *range;
    f.section = index;
    State initial;
    initial.cfa.reg = arch_.sp_reg;
    initial.cfa.offset = 8;
    stack_.clear();
    if (!Run(cie, cie.initial, nullptr, &initial, nullptr)) {
      ++stats_->fdes_skipped;
      return;
    }
    State st = initial;
    loc_ = f.start;
    stack_.clear();
    if (!Run(cie, sec.data.subspan(r.pos(), end - r.pos()), &initial, &st, &f)) {
      ++stats_->fdes_skipped;
      return;
    }
    Emit(cie, st, loc_, &f);
    out->push_back(std::move(f));
  }

  // Appends the row for the state in force from pc (if pc is inside the FDE).
  void Emit(const Cie& cie, const State& st, uint64_t pc, FdeRows* f) {
    if (pc >= f->end) return;
    ps_unwind_row row = Row(cie, st, pc);
    if (!f->rows.empty() && f->rows.back().pc == row.pc) {
      f->rows.back() = row;  // two rows at one pc: the later state wins
    } else {
      f->rows.push_back(row);
    }
    ++stats_->rows_raw;
  }

  // Executes CFA instructions (DWARF 5 section 6.4.2). With `f`, emits a row for the state in
  // force before every location change. False on malformed input.
  bool Run(const Cie& cie, absl::Span<const uint8_t> prog, const State* initial, State* st,
           FdeRows* f) {
    Reader r(prog);
    auto advance = [&](uint64_t delta) {
      if (f != nullptr) Emit(cie, *st, loc_, f);
      // Saturating: a location that would wrap around 2^64 is past the FDE's end like any other
      // too-large one; wrapped, it would go back below the rows already emitted.
      uint64_t step;
      if (__builtin_mul_overflow(delta, cie.code_align, &step) ||
          __builtin_add_overflow(loc_, step, &loc_)) {
        loc_ = ~uint64_t{0};
      }
    };
    auto restore = [&](uint64_t reg) {
      if (RegRule* rr = Track(st, reg)) *rr = initial ? *Track(const_cast<State*>(initial), reg)
                                                     : RegRule{};
    };
    while (!r.at_end()) {
      uint8_t op = r.U8();
      uint8_t hi = op & 0xc0, lo = op & 0x3f;
      if (hi == 0x40) {  // DW_CFA_advance_loc
        advance(lo);
        continue;
      }
      if (hi == 0x80) {  // DW_CFA_offset
        int64_t off = Factored(static_cast<int64_t>(r.Uleb()), cie.data_align);
        if (RegRule* rr = Track(st, lo)) *rr = {RegRule::kOffset, off, {}};
        continue;
      }
      if (hi == 0xc0) {  // DW_CFA_restore
        restore(lo);
        continue;
      }
      switch (op) {
        case 0x00: break;  // nop
        case 0x01: {       // set_loc
          std::optional<uint64_t> a = r.Pointer(cie.fde_encoding & kPeFormatMask, 0);
          if (!a || *a < loc_) return false;
          if (f != nullptr) Emit(cie, *st, loc_, f);
          loc_ = *a;
          break;
        }
        case 0x02: advance(r.U8()); break;
        case 0x03: advance(r.Fixed(2)); break;
        case 0x04: advance(r.Fixed(4)); break;
        case 0x05: {  // offset_extended
          uint64_t reg = r.Uleb();
          int64_t off = Factored(static_cast<int64_t>(r.Uleb()), cie.data_align);
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kOffset, off, {}};
          break;
        }
        case 0x06: restore(r.Uleb()); break;  // restore_extended
        case 0x07:                             // undefined
          if (RegRule* rr = Track(st, r.Uleb())) *rr = {RegRule::kUndefined, 0, {}};
          break;
        case 0x08:  // same_value
          if (RegRule* rr = Track(st, r.Uleb())) *rr = {RegRule::kSame, 0, {}};
          break;
        case 0x09: {  // register
          uint64_t reg = r.Uleb();
          r.Uleb();
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kRegister, 0, {}};
          break;
        }
        case 0x0a: stack_.push_back(*st); break;  // remember_state
        case 0x0b:                                 // restore_state (keeps the CFA? no: all rules)
          if (stack_.empty()) return false;
          {
            // DWARF 5: restore_state pops the register rules; GCC and LLVM also restore the CFA
            // (libgcc's unwind-dw2.c copies the whole row), which is what the code relies on.
            *st = stack_.back();
            stack_.pop_back();
          }
          break;
        case 0x0c:  // def_cfa
          st->cfa = {false, r.Uleb(), 0, {}};
          st->cfa.offset = static_cast<int64_t>(r.Uleb());
          break;
        case 0x0d: st->cfa.reg = r.Uleb(); st->cfa.is_expr = false; break;  // def_cfa_register
        case 0x0e: st->cfa.offset = static_cast<int64_t>(r.Uleb()); break;  // def_cfa_offset
        case 0x0f: {  // def_cfa_expression
          st->cfa.is_expr = true;
          st->cfa.expr = r.Bytes(r.Uleb());
          break;
        }
        case 0x10: {  // expression
          uint64_t reg = r.Uleb();
          auto e = r.Bytes(r.Uleb());
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kExpr, 0, e};
          break;
        }
        case 0x11: {  // offset_extended_sf
          uint64_t reg = r.Uleb();
          int64_t off = Factored(r.Sleb(), cie.data_align);
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kOffset, off, {}};
          break;
        }
        case 0x12: {  // def_cfa_sf
          uint64_t reg = r.Uleb();
          st->cfa = {false, reg, Factored(r.Sleb(), cie.data_align), {}};
          break;
        }
        case 0x13: st->cfa.offset = Factored(r.Sleb(), cie.data_align); break;  // def_cfa_offset_sf
        case 0x14: {  // val_offset
          uint64_t reg = r.Uleb();
          int64_t off = Factored(static_cast<int64_t>(r.Uleb()), cie.data_align);
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kValOffset, off, {}};
          break;
        }
        case 0x15: {  // val_offset_sf
          uint64_t reg = r.Uleb();
          int64_t off = Factored(r.Sleb(), cie.data_align);
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kValOffset, off, {}};
          break;
        }
        case 0x16: {  // val_expression
          uint64_t reg = r.Uleb();
          auto e = r.Bytes(r.Uleb());
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kValExpr, 0, e};
          break;
        }
        case 0x2d: break;            // GNU_window_save / AArch64 negate_ra_state
        case 0x2e: r.Uleb(); break;  // GNU_args_size
        case 0x2f: {                 // GNU_negative_offset_extended
          uint64_t reg = r.Uleb();
          int64_t off = Factored(static_cast<int64_t>(0 - r.Uleb()), cie.data_align);
          if (RegRule* rr = Track(st, reg)) *rr = {RegRule::kOffset, off, {}};
          break;
        }
        default: return false;  // unknown opcode: operand length unknown
      }
      if (r.failed()) return false;
    }
    return !r.failed();
  }

  RegRule* Track(State* st, uint64_t reg) {
    if (reg == static_cast<uint64_t>(arch_.fp_reg)) return &st->fp;
    if (reg == static_cast<uint64_t>(arch_.ra_reg)) return &st->ra;
    return nullptr;
  }

  // DW_OP_breg<n> <sleb> at the start of `e`: returns n and the offset, and the rest.
  static bool Breg(absl::Span<const uint8_t> e, uint64_t* reg, int64_t* off, size_t* used) {
    if (e.empty() || e[0] < kOpBreg0 || e[0] > kOpBreg0 + 31) return false;
    Reader r(e, 1);
    *reg = e[0] - kOpBreg0;
    *off = r.Sleb();
    *used = r.pos();
    return !r.failed();
  }

  // The row for state `st` at pc: rules the walker cannot follow become PS_CFA_NONE (frame
  // pointers) and are counted.
  ps_unwind_row Row(const Cie& cie, const State& st, uint64_t pc) {
    ps_unwind_row row{};
    row.pc = static_cast<uint32_t>(pc);
    if (cie.signal) {
      row.flags |= PS_ROW_SIGNAL;
      ++stats_->signal_rows;
    }
    const uint64_t sp = arch_.sp_reg, fp = arch_.fp_reg;
    // CFA.
    if (!st.cfa.is_expr) {
      if (st.cfa.reg == sp || st.cfa.reg == fp) {
        row.cfa_rule = st.cfa.reg == sp ? PS_CFA_SP : PS_CFA_FP;
        if (st.cfa.offset < INT32_MIN || st.cfa.offset > INT32_MAX) row.cfa_rule = PS_CFA_NONE;
        row.cfa_offset = static_cast<int32_t>(st.cfa.offset);
      }
    } else {
      uint64_t reg;
      int64_t off;
      size_t used;
      auto e = st.cfa.expr;
      if (Breg(e, &reg, &off, &used) && (reg == sp || reg == fp) && used + 1 == e.size() &&
          e[used] == kOpDeref && off >= INT32_MIN && off <= INT32_MAX) {
        row.cfa_rule = reg == sp ? PS_CFA_DEREF_SP : PS_CFA_DEREF_FP;
        row.cfa_offset = static_cast<int32_t>(off);
      } else if (Breg(e, &reg, &off, &used) && reg == sp && e.size() == used + 9 &&
                 e[used] == kOpBreg0 + arch_.ra_reg && e[used + 1] == 0 &&
                 e[used + 2] == kOpLit0 + 15 && e[used + 3] == kOpAnd &&
                 e[used + 4] >= kOpLit0 && e[used + 4] < kOpLit0 + 16 && e[used + 5] == kOpGe &&
                 e[used + 6] == kOpLit0 + 3 && e[used + 7] == kOpShl && e[used + 8] == kOpPlus &&
                 off >= 0 && off < 4096) {
        // The PLT's CFA (binutils bfd/elf64-x86-64.c elf_x86_64_eh_frame_plt):
        // DW_OP_breg7 (rsp) N; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and; DW_OP_lit<k>;
        // DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus.
        row.cfa_rule = PS_CFA_PLT;
        row.cfa_offset = static_cast<int32_t>(off);
        row.flags |= static_cast<uint8_t>((e[used + 4] - kOpLit0) << PS_ROW_PLT_SHIFT);
      }
    }
    if (row.cfa_rule == PS_CFA_NONE) {
      ++stats_->unsupported_cfa;
      return row;
    }
    // Return address.
    switch (st.ra.kind) {
      case RegRule::kUndefined:
        row.cfa_rule = PS_CFA_END;  // outermost frame
        return row;
      case RegRule::kOffset:
        if (st.ra.offset >= INT16_MIN && st.ra.offset <= INT16_MAX) {
          row.ra_rule = PS_RA_AT_CFA;
          row.ra_offset = static_cast<int16_t>(st.ra.offset);
          break;
        }
        [[fallthrough]];
      case RegRule::kExpr: {
        uint64_t reg;
        int64_t off;
        size_t used;
        if (st.ra.kind == RegRule::kExpr && Breg(st.ra.expr, &reg, &off, &used) && reg == sp &&
            used == st.ra.expr.size() && off >= INT16_MIN && off <= INT16_MAX) {
          row.ra_rule = PS_RA_AT_SP;
          row.ra_offset = static_cast<int16_t>(off);
          break;
        }
        [[fallthrough]];
      }
      default:
        ++stats_->unsupported_ra;
        row = ps_unwind_row{};
        row.pc = static_cast<uint32_t>(pc);
        return row;
    }
    // Frame pointer.
    switch (st.fp.kind) {
      case RegRule::kUnspecified:
      case RegRule::kSame:
        row.fp_rule = PS_FP_SAME;
        break;
      case RegRule::kOffset:
        if (st.fp.offset >= INT16_MIN && st.fp.offset <= INT16_MAX) {
          row.fp_rule = PS_FP_AT_CFA;
          row.fp_offset = static_cast<int16_t>(st.fp.offset);
          break;
        }
        row.fp_rule = PS_FP_UNDEFINED;
        ++stats_->unsupported_fp;
        break;
      case RegRule::kExpr: {
        uint64_t reg;
        int64_t off;
        size_t used;
        if (Breg(st.fp.expr, &reg, &off, &used) && (reg == sp || reg == fp) &&
            used == st.fp.expr.size() && off >= INT16_MIN && off <= INT16_MAX) {
          // breg<sp>: signal frames; breg<fp>: GCC's realigned (DRAP) frames, rbp saved at
          // rbp + 0 after push %rbp; mov %rsp,%rbp on the aligned stack.
          row.fp_rule = reg == sp ? PS_FP_AT_SP : PS_FP_AT_FP;
          row.fp_offset = static_cast<int16_t>(off);
          break;
        }
        row.fp_rule = PS_FP_UNDEFINED;
        ++stats_->unsupported_fp;
        break;
      }
      case RegRule::kUndefined:
        row.fp_rule = PS_FP_UNDEFINED;
        break;
      default:
        row.fp_rule = PS_FP_UNDEFINED;
        ++stats_->unsupported_fp;
        break;
    }
    return row;
  }

  CfiArch arch_;
  CfiStats* stats_;
  std::vector<State> stack_;
  uint64_t loc_ = 0;
};

bool SameRules(const ps_unwind_row& a, const ps_unwind_row& b) {
  return a.cfa_rule == b.cfa_rule && a.fp_rule == b.fp_rule && a.ra_rule == b.ra_rule &&
         a.flags == b.flags && a.cfa_offset == b.cfa_offset && a.fp_offset == b.fp_offset &&
         a.ra_offset == b.ra_offset;
}

// Sections of an open libelf handle.
absl::StatusOr<UnwindTable> FromElf(Elf* elf, const CfiArch& arch) {
  if (elf == nullptr || elf_kind(elf) != ELF_K_ELF) {
    return absl::InvalidArgumentError("not an ELF file");
  }
  size_t shstrndx = 0;
  if (elf_getshdrstrndx(elf, &shstrndx) != 0) return absl::InvalidArgumentError("corrupt ELF");
  std::vector<CfiSection> sections;
  CfiSection eh, debug;
  bool have_eh = false, have_debug = false;
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr; scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr) continue;
    const char* name = elf_strptr(elf, shstrndx, shdr.sh_name);
    if (name == nullptr || shdr.sh_type == SHT_NOBITS) continue;
    bool is_eh = std::strcmp(name, ".eh_frame") == 0;
    bool is_debug = std::strcmp(name, ".debug_frame") == 0;
    if (!is_eh && !is_debug) continue;
    if (is_debug && (shdr.sh_flags & SHF_COMPRESSED)) continue;  // not decompressed here
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr || data->d_buf == nullptr) continue;
    CfiSection s{absl::MakeConstSpan(static_cast<const uint8_t*>(data->d_buf), data->d_size),
                 shdr.sh_addr, is_debug};
    if (is_eh) {
      eh = s;
      have_eh = true;
    } else {
      debug = s;
      have_debug = true;
    }
  }
  if (have_eh) sections.push_back(eh);
  if (have_debug) sections.push_back(debug);
  if (sections.empty()) return absl::NotFoundError("no .eh_frame or .debug_frame");
  absl::StatusOr<UnwindTable> t = BuildTable(sections, arch);
  if (!t.ok()) return t;
  // PT_LOAD segments (ELF gABI "Program Header").
  size_t phnum = 0;
  if (elf_getphdrnum(elf, &phnum) == 0) {
    for (size_t i = 0; i < phnum; ++i) {
      GElf_Phdr ph;
      if (gelf_getphdr(elf, static_cast<int>(i), &ph) == nullptr || ph.p_type != PT_LOAD) continue;
      t->loads.push_back({ph.p_offset, ph.p_filesz, ph.p_vaddr, (ph.p_flags & PF_X) != 0});
    }
  }
  // NT_GNU_BUILD_ID (binutils include/elf/common.h: type 3, owner "GNU").
  for (Elf_Scn* scn = elf_nextscn(elf, nullptr); scn != nullptr && t->build_id.empty();
       scn = elf_nextscn(elf, scn)) {
    GElf_Shdr shdr;
    if (gelf_getshdr(scn, &shdr) == nullptr || shdr.sh_type != SHT_NOTE) continue;
    Elf_Data* data = elf_getdata(scn, nullptr);
    if (data == nullptr) continue;
    size_t off = 0, name_off, desc_off;
    GElf_Nhdr nh;
    while ((off = gelf_getnote(data, off, &nh, &name_off, &desc_off)) > 0) {
      if (nh.n_type == NT_GNU_BUILD_ID && nh.n_namesz == 4 &&
          std::memcmp(static_cast<const char*>(data->d_buf) + name_off, "GNU", 4) == 0) {
        static const char kHex[] = "0123456789abcdef";
        const auto* d = static_cast<const uint8_t*>(data->d_buf) + desc_off;
        for (size_t i = 0; i < nh.n_descsz; ++i) {
          t->build_id.push_back(kHex[d[i] >> 4]);
          t->build_id.push_back(kHex[d[i] & 15]);
        }
        break;
      }
    }
  }
  return t;
}

}  // namespace

absl::StatusOr<UnwindTable> BuildTable(const std::vector<CfiSection>& sections,
                                       const CfiArch& arch) {
  UnwindTable t;
  std::vector<FdeRows> fdes;
  Builder b(arch, &t.stats);
  for (size_t i = 0; i < sections.size(); ++i) b.ParseSection(sections[i], static_cast<int>(i), &fdes);
  if (fdes.empty()) return absl::NotFoundError("no FDE in .eh_frame/.debug_frame");
  // By start; at one start the earlier section first. An FDE overlapping the previous kept one
  // is skipped (two sections describing one function, or a corrupt range).
  std::stable_sort(fdes.begin(), fdes.end(), [](const FdeRows& a, const FdeRows& b) {
    return a.start != b.start ? a.start < b.start : a.section < b.section;
  });
  uint64_t end = 0;
  auto push = [&](const ps_unwind_row& row) {
    if (!t.rows.empty() && SameRules(t.rows.back(), row)) return;
    if (!t.rows.empty() && t.rows.back().pc == row.pc) {
      t.rows.back() = row;
      if (t.rows.size() >= 2 && SameRules(t.rows[t.rows.size() - 2], row)) t.rows.pop_back();
      return;
    }
    t.rows.push_back(row);
  };
  ps_unwind_row none{};
  for (const FdeRows& f : fdes) {
    if (f.start < end || f.rows.empty()) {
      ++t.stats.fdes_skipped;
      continue;
    }
    if (f.start > end && !t.rows.empty()) {
      none.pc = static_cast<uint32_t>(end);
      push(none);
    }
    for (const ps_unwind_row& r : f.rows) push(r);
    end = f.end;
  }
  none.pc = static_cast<uint32_t>(end);
  push(none);
  if (t.rows.size() > PS_UNWIND_MAX_TABLE_ROWS) {
    return absl::ResourceExhaustedError(absl::StrCat("unwind table of ", t.rows.size(),
                                                     " rows exceeds ", PS_UNWIND_MAX_TABLE_ROWS));
  }
  return t;
}

absl::StatusOr<UnwindTable> BuildTableFromFile(const std::string& path, const CfiArch& arch) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);  // never block on a FIFO
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("open ", path));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a regular file"));
  }
  elf_version(EV_CURRENT);
  Elf* elf = elf_begin(fd, ELF_C_READ_MMAP, nullptr);
  absl::StatusOr<UnwindTable> t = FromElf(elf, arch);
  if (elf != nullptr) elf_end(elf);
  close(fd);
  return t;
}

absl::StatusOr<UnwindTable> BuildTableFromMemory(const void* image, size_t size,
                                                 const CfiArch& arch) {
  elf_version(EV_CURRENT);
  // libelf does not write through the pointer for ELF_C_READ (elf_memory(3)).
  Elf* elf = elf_memory(static_cast<char*>(const_cast<void*>(image)), size);
  absl::StatusOr<UnwindTable> t = FromElf(elf, arch);
  if (elf != nullptr) elf_end(elf);
  return t;
}

}  // namespace parascope::unwind
