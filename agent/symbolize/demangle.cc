#include "agent/symbolize/demangle.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>

namespace parascope::symbolize {

std::string Demangle(const std::string& system_name) {
  // Itanium ABI: every mangled entity name begins with "_Z" (<mangled-name> ::= _Z <encoding>).
  if (system_name.size() < 3 || system_name[0] != '_' || system_name[1] != 'Z') {
    return system_name;
  }
  int status = 0;
  // __cxa_demangle returns a malloc'ed buffer (or nullptr with status != 0).
  std::unique_ptr<char, decltype(&std::free)> out(
      abi::__cxa_demangle(system_name.c_str(), nullptr, nullptr, &status), &std::free);
  if (status != 0 || out == nullptr) return system_name;
  return std::string(out.get());
}

}  // namespace parascope::symbolize
