// A unique temporary directory for one test, removed with everything in it when it goes out of scope.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>

#include "test/catch.h"

namespace mt::test {

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mt_test_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
};

}  // namespace mt::test
