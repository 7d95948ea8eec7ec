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
