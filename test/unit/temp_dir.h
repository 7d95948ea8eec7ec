// A fresh directory under $TMPDIR for one unit test, removed with everything in it by the
// destructor (mkdtemp(3): mode 0700).
#pragma once

#include <stdlib.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <string>

namespace parascope::unit_testing {

class TempDir {
 public:
  // `prefix`: the directory's name before mkdtemp's six random characters.
  explicit TempDir(const std::string& prefix = "ps-unit-") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "XXXXXX")).string();
    REQUIRE(mkdtemp(tmpl.data()) != nullptr);
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace parascope::unit_testing
