#include "agent/symbolize/demangle.h"

#include <catch2/catch.hpp>

namespace parascope::symbolize {
namespace {

TEST_CASE("Demangle turns Itanium names into readable C++", "[symbolize]") {
  CHECK(Demangle("_ZN2ps7fixture5GammaEi") == "ps::fixture::Gamma(int)");
  CHECK(Demangle("_ZNSt6vectorIiSaIiEE9push_backERKi") ==
        "std::vector<int, std::allocator<int> >::push_back(int const&)");
  CHECK(Demangle("_Z3fooi.cold") == "foo(int) [clone .cold]");
}

// Fixtures: names as rustc emits them (legacy: Itanium-shaped with a crate hash; v0: RFC 2603).
TEST_CASE("Demangle turns Rust legacy and v0 names into paths", "[symbolize]") {
  CHECK(Demangle("_ZN5tokio7runtime7Runtime8block_on17hdeadbeefcafef00dE") ==
        "tokio::runtime::Runtime::block_on");
  CHECK(Demangle("_ZN3std2rt10lang_start28_$u7b$$u7b$closure$u7d$$u7d$17h5f1a0f3c0e8e5a7bE") ==
        "std::rt::lang_start::{{closure}}");
  CHECK(Demangle("_RNvCs15kBYyAo9fc_7mycrate7example") == "mycrate::example");
  CHECK(Demangle("_RNvNtCs1234_7mycrate3foo3bar") == "mycrate::foo::bar");
  CHECK(Demangle("_RINvCs1234_7mycrate3fooNtNtCs5678_5alloc6string6StringE") ==
        "mycrate::foo::<alloc::string::String>");
  CHECK(Demangle("_RNCNvCsgStHSCytQ6I_7mycrate4main0B3_") == "mycrate::main::{closure#0}");
  CHECK(Demangle("_RNvXs_NtCsd4VYFwevHkG_4core3fmtNtB4_9ArgumentsNtB4_7Display3fmt") ==
        "<core::fmt::Arguments as core::fmt::Display>::fmt");
  CHECK(Demangle("_RNvCs15kBYyAo9fc_7mycrate7example.llvm.123") == "mycrate::example");
  // Not Rust: an Itanium name without the hash stays C++; a broken v0 name stays as it is.
  CHECK(Demangle("_ZN2ps7fixture5GammaEi") == "ps::fixture::Gamma(int)");
  CHECK(Demangle("_RNvC") == "_RNvC");
  CHECK(Demangle("_R") == "_R");
}

TEST_CASE("Demangle leaves non-mangled names unchanged", "[symbolize]") {
  CHECK(Demangle("main") == "main");
  CHECK(Demangle("ps_fixture_alpha") == "ps_fixture_alpha");
  CHECK(Demangle("") == "");
  CHECK(Demangle("i") == "i");  // a valid type mangling ("int"), but not a mangled entity name
  CHECK(Demangle("_Z") == "_Z");
  CHECK(Demangle("_Znot_really_mangled") == "_Znot_really_mangled");
  CHECK(Demangle("do_sys_openat2") == "do_sys_openat2");
}

}  // namespace
}  // namespace parascope::symbolize
