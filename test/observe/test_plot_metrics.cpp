// scripts/plot_metrics.py on real metrics files (two tiny runs overlaid): a PNG of the asked size
// (signature and IHDR read here), and a one-line error for a file that is no metrics file. Needs
// python3 with matplotlib (scripts/run_tests.sh installs python3-matplotlib); without it the test
// says SKIPPED, or fails under MEGATRAIN_REQUIRE_TOKENIZER=1 (the full set-up of run_tests.sh).
#include <cstdlib>

#include "catch.h"
#include "observe_runs.h"

using namespace mt::test;

namespace {

// The first python3 with matplotlib: the one on PATH, else Debian's (a PATH may put another
// Python first, e.g. pyenv's, that lacks Debian's python3-matplotlib).
const std::string& python() {
  static const std::string py = [] {
    for (const char* p : {"python3", "/usr/bin/python3"})
      if (std::system((std::string(p) + " -c 'import matplotlib' > /dev/null 2>&1").c_str()) == 0) return std::string(p);
    return std::string();
  }();
  return py;
}

bool have_matplotlib() {
  if (!python().empty()) return true;
  const char* req = std::getenv("MEGATRAIN_REQUIRE_TOKENIZER");
  if (req && std::string(req) == "1") FAIL("python3 matplotlib is missing: scripts/apt_install_missing.sh python3-matplotlib");
  WARN("SKIPPED: python3 matplotlib is missing; scripts/apt_install_missing.sh python3-matplotlib");
  return false;
}

uint32_t be32(const std::string& s, size_t pos) {
  REQUIRE(pos + 4 <= s.size());
  return (uint32_t{static_cast<unsigned char>(s[pos])} << 24) | (uint32_t{static_cast<unsigned char>(s[pos + 1])} << 16) |
         (uint32_t{static_cast<unsigned char>(s[pos + 2])} << 8) | uint32_t{static_cast<unsigned char>(s[pos + 3])};
}

int run_script(const std::string& args, const std::string& tag, std::string* err) {
  const fs::path e = temp_dir() / (tag + ".plot.stderr");
  const std::string cmd = python() + " " + source_path("scripts/plot_metrics.py") + " " + args + " > /dev/null 2> " + e.string();
  const int status = std::system(cmd.c_str());
  *err = read_file(e);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("plot_metrics.py draws several runs' curves into one PNG", "[plot][e2e]") {
  if (!have_matplotlib()) return;
  const MainRun& run = main_run();
  REQUIRE(run.code == 0);
  per_iteration_run();  // writes temp_dir()/every/metrics.jsonl
  const fs::path png = temp_dir() / "plots" / "curves.png";
  std::string err;
  const int code = run_script((run.dir / "metrics.jsonl").string() + " " + (temp_dir() / "every" / "metrics.jsonl").string() +
                                  " --label 'log_interval 5' --label 'log_interval 1' --title tiny --width 6 --height 4 -o " +
                                  png.string(),
                              "two", &err);
  INFO(err);
  REQUIRE(code == 0);
  REQUIRE(fs::exists(png));
  const std::string s = read_file(png);
  REQUIRE(s.size() > 33);
  CHECK(s.substr(0, 8) == std::string("\x89PNG\r\n\x1a\n", 8));
  CHECK(s.substr(12, 4) == "IHDR");
  CHECK(be32(s, 16) == 600);  // 6 x 4 inches at 100 dpi
  CHECK(be32(s, 20) == 400);
  CHECK(s.size() > 20000);    // four panels of curves, not an empty canvas
  CHECK(s.substr(s.size() - 8, 4) == "IEND");

  // Not a metrics file, or labels that do not match: one line naming the problem, exit 1.
  const fs::path bad = temp_dir() / "plots" / "bad.jsonl";
  std::ofstream(bad) << "{\"iteration\": 1, \"loss\": 2.0}\nnot json\n";
  CHECK(run_script(bad.string() + " -o " + (temp_dir() / "plots" / "bad.png").string(), "bad", &err) == 1);
  CHECK(count_lines(err) == 1);
  CHECK_THAT(err, Catch::Contains("bad.jsonl:2: not a JSON line"));
  CHECK(!fs::exists(temp_dir() / "plots" / "bad.png"));
  CHECK(run_script((run.dir / "metrics.jsonl").string() + " --label a --label b -o " + png.string(), "labels", &err) == 1);
  CHECK_THAT(err, Catch::Contains("2 --label for 1 metrics files"));
}
