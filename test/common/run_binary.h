// Helpers for tests that drive the megatrain binary as a user does (optionally under mpirun) and
// read back its metrics file.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <string>

namespace mt::test {

namespace fs = std::filesystem;

inline const std::string& megatrain_bin() {
  static const std::string bin = std::string(MT_BINARY_DIR) + "/megatrain";
  return bin;
}
inline std::string source_path(const std::string& rel) { return std::string(MT_SOURCE_DIR) + "/" + rel; }

// A fresh directory for this test process, removed at exit.
inline fs::path temp_dir() {
  static struct Dir {
    fs::path path;
    Dir() {
      path = fs::temp_directory_path() / ("mt_test_" + std::to_string(::getpid()));
      fs::remove_all(path);
      fs::create_directories(path);
    }
    ~Dir() { fs::remove_all(path); }
  } dir;
  return dir.path;
}

inline std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct RunResult {
  int code;
  std::string out, err;
  double seconds = 0;      // wall time of the whole command
  bool timed_out = false;  // killed by the timeout_s wrapper (exit status 124, or 137 after -k)
};

// Runs "[env ENV] [timeout -k 10 TIMEOUT_S] [mpirun -np NP] megatrain ARGS", capturing stdout and
// stderr under temp_dir()/tag.*. ENV is a list of VAR=value words for the command (and, through
// mpirun, every rank); TIMEOUT_S > 0 stops a hanging run (TERM, then KILL 10 s later).
inline RunResult run_megatrain(const std::string& args, const std::string& tag, int np = 0,
                               const std::string& env = "", int timeout_s = 0) {
  const fs::path out = temp_dir() / (tag + ".stdout"), err = temp_dir() / (tag + ".stderr");
  std::string cmd = env.empty() ? "" : "env " + env + " ";
  if (timeout_s > 0) cmd += "timeout -k 10 " + std::to_string(timeout_s) + " ";
  if (np > 0) cmd += "mpirun -np " + std::to_string(np) + " ";
  cmd += megatrain_bin() + " " + args + " > " + out.string() + " 2> " + err.string();
  const auto t0 = std::chrono::steady_clock::now();
  const int status = std::system(cmd.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return {code, read_file(out), read_file(err), seconds, timeout_s > 0 && (code == 124 || code == 137)};
}

// What the collective watchdog (training.collective_timeout_s) must say on stderr when a collective
// of `group` never completes on the reporting rank `rank`: the word "watchdog", the collective
// (all_reduce, reduce_scatter, all_gather, ...), the group ("group dp"), and the global rank with
// its mesh coordinates, e.g.
//   rank 0 (tp 0, cp 0, dp 0, pp 0) group dp: watchdog: all_reduce did not complete within 5 s ...
// Returns what is missing, "" when nothing is.
inline std::string watchdog_report_missing(const std::string& err, const std::string& group, int rank) {
  const auto icase = std::regex::ECMAScript | std::regex::icase;
  const struct {
    const char* what;
    std::string pattern;
  } expect[] = {
      {"the word watchdog", "watchdog"},
      {"the collective's name",
       R"(all[_ -]?reduce|reduce[_ -]?scatter|all[_ -]?gather|all[_ -]?to[_ -]?all|broadcast|barrier|batch_p2p|\bsend\b|\brecv\b)"},
      {"the group", "group[ =:\"'`]*" + group + "\\b|\\b" + group + "[\"'`]* group"},
      {"the global rank", "\\brank[ =:]*" + std::to_string(rank) + "\\b"},
      {"the tp coordinate", R"(\btp[ =:]*[0-9])"},
      {"the pp coordinate", R"(\bpp[ =:]*[0-9])"},
      {"the dp coordinate", R"(\bdp[ =:]*[0-9])"},
  };
  std::string missing;
  for (const auto& e : expect)
    if (!std::regex_search(err, std::regex(e.pattern, icase))) missing += std::string(missing.empty() ? "" : ", ") + e.what;
  return missing;
}

struct StepMetrics {
  double loss = 0, grad_norm = 0;
  bool operator==(const StepMetrics& o) const { return loss == o.loss && grad_norm == o.grad_norm; }
};

// iteration -> loss and grad norm of the training records of a metrics file.
inline std::map<int64_t, StepMetrics> read_metrics(const fs::path& file) {
  std::map<int64_t, StepMetrics> m;
  std::ifstream f(file);
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) m[j["iteration"].get<int64_t>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
  }
  return m;
}

// A fingerprint of every file under dir (path and content hash), to prove nothing was touched.
inline std::string fingerprint(const fs::path& dir) {
  std::string fp;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    fp += e.path().string() + "\n";
    if (e.is_regular_file()) fp += std::to_string(std::hash<std::string>{}(read_file(e.path()))) + "\n";
  }
  return fp;
}

inline int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace mt::test
