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

// Symbols rustc itself printed, with their demangling-alt (the hashless form) from rustc's UI
// tests (tests/ui/symbol-names: basic, issue-60925, impl1, const-generics-demangling), and
// rustc-demangle's own test vectors (src/legacy.rs, src/v0.rs: thinlto, branch labels, closures,
// dyn traits). The expected strings are theirs, not libiberty's output copied back; where a UI
// test prints only a symbol's prefix, the hash is completed with 0123456789abcdef (".cold.1" and
// the "moocow" variant are ours, following rustc-demangle's suffix rule).
TEST_CASE("Demangle matches rustc-demangle on rustc's legacy symbols", "[symbolize]") {
  CHECK(Demangle("_ZN5basic4main17h1dddcfd03744167fE") == "basic::main");
  // $LT$ $GT$ and $u6d$ ('m') escapes, ".." for "::" inside a component.
  CHECK(Demangle("_ZN11issue_609253foo37Foo$LT$issue_60925..llv$u6d$..Foo$GT$3foo17h84ab5dafbd2a"
                 "1508E") == "issue_60925::foo::Foo<issue_60925::llvm::Foo>::foo");
  // An inherent impl in another module, and a trait impl for a type inside a closure.
  CHECK(Demangle("_ZN5impl13bar33_$LT$impl$u20$impl1..foo..Foo$GT$3baz17h0123456789abcdefE") ==
        "impl1::bar::<impl impl1::foo::Foo>::baz");
  CHECK(
      Demangle("_ZN209_$LT$$u5b$$RF$dyn$u20$impl1..Foo$u2b$Assoc$u20$$u3d$$u20$extern$u20$$u22$"
               "C$u22$$u20$fn$LP$$RF$u8$C$$u20$...$RP$$u2b$impl1..AutoTrait$u3b$$u20$3$u5d$$u20$"
               "as$u20$impl1..main..$u7b$$u7b$closure$u7d$$u7d$..Bar$GT$6method17h0123456789abcdef"
               "E") ==
      "<[&dyn impl1::Foo+Assoc = extern \"C\" fn(&u8, ::.)+impl1::AutoTrait; 3] "
      "as impl1::main::{{closure}}::Bar>::method");
  // Suffixes: ThinLTO's ".llvm.<HEX>" is dropped, LLVM's other period-delimited words are kept.
  CHECK(Demangle("_ZN9backtrace3foo17hbb467fcdaea5d79bE.llvm.A5310EB9") == "backtrace::foo");
  CHECK(Demangle("_ZN4core5slice77_$LT$impl$u20$core..ops..index..IndexMut$LT$I$GT$$u20$for$u20$"
                 "$u5b$T$u5d$$GT$9index_mut17haf9727c2edfbc47bE.exit.i.i") ==
        "core::slice::<impl core::ops::index::IndexMut<I> for [T]>::index_mut.exit.i.i");
  CHECK(Demangle("_ZN3foo3bar17h05af221e174051e9E.cold.1") == "foo::bar.cold.1");
  // Not symbol-like after the hash: not Rust, and not C++ either.
  CHECK(Demangle("_ZN3foo17h05af221e174051e9E.llvm moocow") ==
        "_ZN3foo17h05af221e174051e9E.llvm moocow");
}

TEST_CASE("Demangle matches rustc-demangle on rustc's v0 symbols", "[symbolize]") {
  // Inherent impls.
  CHECK(Demangle("_RNvMNtCs4fqI2P2rA04_5impl13fooNtB2_3Foo3bar") == "<impl1::foo::Foo>::bar");
  CHECK(Demangle("_RNvMNtCs4fqI2P2rA04_5impl13barNtNtB4_3foo3Foo3baz") == "<impl1::foo::Foo>::baz");
  // A trait impl for an array of trait objects (a const length, a higher-ranked fn pointer, an
  // associated type binding) by a trait declared in a closure.
  CHECK(Demangle("_RNvXNCNvCs4fqI2P2rA04_5impl14mains_0ARDNtB6_3Foop5AssocFG_KCRL0_hvEuNtB6_9Auto"
                 "TraitEL_j3_NtB2_3Bar6method") ==
        "<[&dyn impl1::Foo<Assoc = for<'a> extern \"C\" fn(&'a u8, ...)> + impl1::AutoTrait; 3] as "
        "impl1::main::{closure#1}::Bar>::method");
  // Const generics: u8, a negative i16, bool; and a usize argument after a type.
  CHECK(Demangle("_RMCsno73SFvQKx_1cINtB0_8UnsignedKhb_E") == "<c::Unsigned<11>>");
  CHECK(Demangle("_RMs_Csno73SFvQKx_1cINtB2_6SignedKsn98_E") == "<c::Signed<-152>>");
  CHECK(Demangle("_RMs0_Csno73SFvQKx_1cINtB3_4BoolKb1_E") == "<c::Bool<true>>");
  CHECK(Demangle("_RMC0INtC8arrayvec8ArrayVechKj7b_E") == "<arrayvec::ArrayVec<u8, 123>>");
  // Closures, nested and inside a generic trait method instance.
  CHECK(Demangle("_RNCNCNgCs6DXkGYLi8lr_2cc5spawn00B5_") == "cc::spawn::{closure#0}::{closure#0}");
  CHECK(Demangle("_RNCINkXs25_NgCsbmNqQUJIY6D_4core5sliceINyB9_4IterhENuNgNoBb_4iter8iterator8Ite"
                 "rator9rpositionNCNgNpB9_6memchr7memrchrs_0E0Bb_") ==
        "<core::slice::Iter<u8> as core::iter::iterator::Iterator>::rposition::<core::slice::memchr"
        "::memrchr::{closure#1}>::{closure#0}");
  CHECK(Demangle("_RINbNbCskIICzLVDPPb_5alloc5alloc8box_freeDINbNiB4_5boxed5FnBoxuEp6OutputuEL_ECs"
                 "1iopQbuBiw2_3std") ==
        "alloc::alloc::box_free::<dyn alloc::boxed::FnBox<(), Output = ()>>");
  // Punycode identifiers.
  CHECK(Demangle("_RNqCs4fqI2P2rA04_11utf8_identsu30____7hkackfecea1cbdathfdh9hlq6y") ==
        "utf8_idents::\xe1\x83\xa1\xe1\x83\x90\xe1\x83\xad\xe1\x83\x9b\xe1\x83\x94\xe1\x83\x9a\xe1"
        "\x83\x90\xe1\x83\x93_\xe1\x83\x92\xe1\x83\x94\xe1\x83\x9b\xe1\x83\xa0\xe1\x83\x98\xe1\x83"
        "\x94\xe1\x83\x9a\xe1\x83\x98_\xe1\x83\xa1\xe1\x83\x90\xe1\x83\x93\xe1\x83\x98\xe1\x83\x9a"
        "\xe1\x83\x98");
  // Suffixes.
  CHECK(Demangle("_RNvC9backtrace3foo.llvm.A5310EB9") == "backtrace::foo");
  CHECK(Demangle("_RNvNtNtNtNtCs92dm3009vxr_4rand4rngs7adapter9reseeding4fork23FORK_HANDLER_REGIS"
                 "TERED.0.0") ==
        "rand::rngs::adapter::reseeding::fork::FORK_HANDLER_REGISTERED.0.0");
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
