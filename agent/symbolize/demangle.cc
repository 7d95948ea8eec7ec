#include "agent/symbolize/demangle.h"

#include <cxxabi.h>
#include <libiberty/demangle.h>

#include <cstdlib>
#include <memory>

namespace parascope::symbolize {
namespace {

// A Rust legacy symbol: an Itanium nested name whose last component is "17h" + 16 hex digits
// (the crate hash), as rustc's legacy mangling emits (rustc_symbol_mangling/src/legacy.rs).
bool IsRustLegacy(const std::string& s) {
  if (s.size() < 24 || s.compare(0, 3, "_ZN") != 0 || s.back() != 'E') return false;
  const size_t h = s.size() - 1 - 19;  // "17h" + 16 digits + "E"
  if (s.compare(h, 3, "17h") != 0) return false;
  for (size_t i = h + 3; i < s.size() - 1; ++i) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return false;
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
  if (system_name[1] == 'R' || (system_name[1] == 'Z' && IsRustLegacy(system_name))) {
    // cplus_demangle returns a malloc'ed string or nullptr (libiberty/demangle.h).
    return Free(cplus_demangle(system_name.c_str(), DMGL_RUST | DMGL_PARAMS | DMGL_ANSI),
                system_name);
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
