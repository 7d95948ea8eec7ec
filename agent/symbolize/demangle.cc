#include "agent/symbolize/demangle.h"

#include <cxxabi.h>
#include <libiberty/demangle.h>

#include <cstdlib>
#include <memory>

namespace parascope::symbolize {
namespace {

// ThinLTO's ".llvm.<hex>" suffix (upper-case hex digits and '@'), which rustc-demangle cuts before
// demangling (rustc-demangle src/lib.rs, demangle()): the length of `s` without it.
size_t WithoutLlvmSuffix(const std::string& s) {
  size_t i = s.find(".llvm.");
  if (i == std::string::npos) return s.size();
  for (size_t j = i + 6; j < s.size(); ++j) {
    char c = s[j];
    if (!((c >= '0' && c <= '9') || (c >= 'A' && c <= 'F') || c == '@')) return s.size();
  }
  return i;
}

// The length of the Rust legacy symbol at the start of `s` (its first `len` bytes), or 0 if it is
// not one: an Itanium nested name "_ZN" (<length><bytes>)+ "E" whose last component is "h" + 16
// hex digits, the crate hash (rustc_symbol_mangling/src/legacy.rs; parsed by length prefixes as
// rustc-demangle's legacy.rs does, since the components themselves may contain '.').
size_t RustLegacyLength(const std::string& s, size_t len) {
  if (len < 24 || s.compare(0, 3, "_ZN") != 0) return 0;
  size_t i = 3, last = 0, last_len = 0;
  while (i < len && s[i] != 'E') {
    size_t n = 0, digits = 0;
    for (; i < len && s[i] >= '0' && s[i] <= '9' && digits < 6; ++i, ++digits) {
      n = n * 10 + (s[i] - '0');
    }
    if (digits == 0 || n == 0 || n > len - i) return 0;
    last = i;
    last_len = n;
    i += n;
  }
  if (i >= len || last_len != 17 || s[last] != 'h') return 0;
  for (size_t k = last + 1; k < last + 17; ++k) {
    char c = s[k];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
  }
  return i + 1;
}

// The length of the v0 symbol at the start of `s`: v0 manglings use only [A-Za-z0-9_] (RFC 2603),
// so it ends at the first '.'.
size_t RustV0Length(const std::string& s, size_t len) {
  size_t dot = s.find('.');
  return dot == std::string::npos || dot > len ? len : dot;
}

// rustc-demangle keeps a suffix that starts with '.' and is all ASCII letters, digits and
// punctuation (LLVM's ".cold.1", ".exit.i.i"); any other suffix makes the symbol not Rust.
bool IsSymbolLikeSuffix(const std::string& s, size_t from, size_t to) {
  if (from == to) return true;
  if (s[from] != '.') return false;
  for (size_t i = from; i < to; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c <= ' ' || c >= 0x7f) return false;
  }
  return true;
}

std::string Free(char* p, const std::string& fallback) {
  if (p == nullptr) return fallback;
  std::string out(p);
  std::free(p);
  return out;
}

}  // namespace

std::string Demangle(const std::string& system_name) {
  if (system_name.size() < 3 || system_name[0] != '_') return system_name;
  if (system_name[1] == 'R' || system_name[1] == 'Z') {
    const size_t len = WithoutLlvmSuffix(system_name);
    const size_t head =
        system_name[1] == 'R' ? RustV0Length(system_name, len) : RustLegacyLength(system_name, len);
    // A suffix that is not symbol-like makes it not Rust (an Itanium name may go on with
    // parameter types after a hash-like last component: C++ then).
    if (head != 0 && IsSymbolLikeSuffix(system_name, head, len)) {
      // cplus_demangle returns a malloc'ed string or nullptr (libiberty/demangle.h). Without
      // DMGL_VERBOSE it leaves out legacy hashes and v0 crate disambiguators.
      char* out =
          cplus_demangle(system_name.substr(0, head).c_str(), DMGL_RUST | DMGL_PARAMS | DMGL_ANSI);
      if (out == nullptr) return system_name;
      return Free(out, system_name) + system_name.substr(head, len - head);
    }
  }
  // Itanium ABI: every mangled entity name begins with "_Z" (<mangled-name> ::= _Z <encoding>).
  if (system_name[1] != 'Z') return system_name;
  int status = 0;
  char* out = abi::__cxa_demangle(system_name.c_str(), nullptr, nullptr, &status);
  if (status != 0) {
    std::free(out);
    return system_name;
  }
  return Free(out, system_name);
}

}  // namespace parascope::symbolize
