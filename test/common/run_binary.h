// Helpers for tests that drive the megatrain binary as a user does (optionally under mpirun) and
// read back its metrics file.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
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
};

// Runs "[mpirun -np NP] megatrain ARGS", capturing stdout and stderr under temp_dir()/tag.*.
inline RunResult run_megatrain(const std::string& args, const std::string& tag, int np = 0) {
  const fs::path out = temp_dir() / (tag + ".stdout"), err = temp_dir() / (tag + ".stderr");
  std::string cmd = np > 0 ? "mpirun -np " + std::to_string(np) + " " : "";
  cmd += megatrain_bin() + " " + args + " > " + out.string() + " 2> " + err.string();
  const int status = std::system(cmd.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_file(out), read_file(err)};
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
