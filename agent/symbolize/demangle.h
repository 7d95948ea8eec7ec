// Symbol demangling for profile function names: C++ (Itanium ABI) and Rust (legacy and v0).
#pragma once

#include <string>

namespace parascope::symbolize {

// Returns the human-readable form of a mangled name, or `system_name` unchanged when it is not
// one (C symbols, kernel symbols, malformed manglings):
//  - Itanium C++ ABI names ("_ZN2ps3fooEi" -> "ps::foo(int)"); compiler clone suffixes are kept
//    the demangler's way ("_Z3fooi.cold" -> "foo(int) [clone .cold]"). Source: Itanium C++ ABI,
//    "External Names (a.k.a. Mangling)"; libstdc++ abi::__cxa_demangle.
//  - Rust legacy names (Itanium-shaped, ending in a "17h<16 hex digits>E" hash:
//    "_ZN4core3fmt5write17h0123456789abcdefE" -> "core::fmt::write", hash dropped) and Rust v0
//    names ("_R..." -> "mycrate::example", "<tokio::runtime::Runtime>::block_on"). Source: the
//    Rust RFC 2603 (v0 symbol mangling); demangled by libiberty's rust-demangle.c (binutils).
//    Suffixes follow rustc-demangle (src/lib.rs): ThinLTO's ".llvm.<HEX>" is dropped, another
//    '.' suffix of ASCII letters, digits and punctuation is kept after the path
//    ("_ZN3foo3bar17h0123456789abcdefE.cold.1" -> "foo::bar.cold.1"). The output is
//    rustc-demangle's alternate form ("{:#}"), except that libiberty writes a non-ASCII char
//    constant escaped ('\u{2202}') where rustc-demangle writes the character itself.
// Only names starting with "_Z" or "_R" are demangled, so short C names such as "i" are never
// read as type manglings ("int"). Thread-safe.
std::string Demangle(const std::string& system_name);

}  // namespace parascope::symbolize
