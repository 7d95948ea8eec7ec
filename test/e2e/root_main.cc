// main() of the root test binaries: Catch2's, except that a run in which a [root] test was
// skipped for lack of root (RequireRoot, outside CI) exits 77, which ctest reports as skipped
// (SKIP_RETURN_CODE in CMakeLists.txt) instead of "Passed".
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "test/e2e/e2e_util.h"

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  if (failed == 0 && parascope::testing::RootTestsSkipped() > 0) return parascope::testing::kSkippedExitCode;
  return failed;
}
