// C++ symbol demangling for profile function names.
#pragma once

#include <string>

namespace parascope::symbolize {

// Returns the human-readable form of an Itanium C++ ABI mangled name ("_ZN2ps3fooEi" ->
// "ps::foo(int)"), or `system_name` unchanged when it is not a mangled C++ name (C symbols, kernel
// symbols, malformed manglings). Only names starting with "_Z" are demangled, so short C names
// such as "i" are never read as type manglings ("int"). Compiler clone suffixes are kept the
// demangler's way ("_Z3fooi.cold" -> "foo(int) [clone .cold]").
// Source: Itanium C++ ABI, "External Names (a.k.a. Mangling)"; libstdc++ abi::__cxa_demangle.
// Thread-safe.
std::string Demangle(const std::string& system_name);

}  // namespace parascope::symbolize
