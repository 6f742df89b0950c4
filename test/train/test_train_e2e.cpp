// End to end through the megatrain binary (as a user runs it): a tiny Llama config on mock data
// trains with falling loss, two runs with one seed log identical losses, a run stopped and resumed
// from its checkpoint logs bit-identical losses to one that never stopped, and bad input (a
// misspelled key, a truncated .idx, too many ranks) ends in a one-line error and a non-zero exit
// without touching existing checkpoints.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "catch.h"
#include "data/indexed_dataset.h"

namespace fs = std::filesystem;

namespace {

const std::string kBin = std::string(MT_BINARY_DIR) + "/megatrain";
const std::string kTiny = std::string(MT_SOURCE_DIR) + "/configs/ci/tiny-llama.yaml";

fs::path temp_dir() {
  static fs::path dir = [] {
    fs::path d = fs::temp_directory_path() / ("mt_e2e_" + std::to_string(::getpid()));
    fs::remove_all(d);
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

struct Result {
  int code;
  std::string err;
};

Result run(const std::string& args, const std::string& tag) {
  const fs::path err = temp_dir() / (tag + ".stderr");
  const std::string cmd = kBin + " " + args + " > " + (temp_dir() / (tag + ".stdout")).string() + " 2> " + err.string();
  int status = std::system(cmd.c_str());
  std::ifstream f(err);
  std::stringstream ss;
  ss << f.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, ss.str()};
}

std::string train_args(const std::string& name, const std::string& extra = "") {
  const fs::path d = temp_dir() / name;
  return "train --config " + kTiny + " --set training.train_iters=40 --set logging.log_interval=1" +
         " --set checkpoint.dir=" + (d / "ckpt").string() + " --set logging.metrics_file=" +
         (d / "metrics.jsonl").string() + " " + extra;
}

// iteration -> the metrics record's loss and grad_norm, as written (full precision text).
std::map<int64_t, std::pair<double, double>> losses(const std::string& name) {
  std::map<int64_t, std::pair<double, double>> m;
  std::ifstream f(temp_dir() / name / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) m[j["iteration"].get<int64_t>()] = {j["loss"].get<double>(), j["grad_norm"].get<double>()};
  }
  return m;
}

// A fingerprint of every file under dir (name, size, bytes), to prove nothing was touched.
std::string fingerprint(const fs::path& dir) {
  std::string fp;
  for (auto& e : fs::recursive_directory_iterator(dir)) {
    fp += e.path().string() + "\n";
    if (e.is_regular_file()) {
      std::ifstream f(e.path(), std::ios::binary);
      std::stringstream ss;
      ss << f.rdbuf();
      fp += std::to_string(std::hash<std::string>{}(ss.str())) + "\n";
    }
  }
  return fp;
}

int count_lines(const std::string& s) {
  int n = 0;
  for (char c : s) n += c == '\n';
  return n;
}

}  // namespace

TEST_CASE("training is deterministic, the loss falls, and resume is bit-exact", "[e2e]") {
  REQUIRE(run(train_args("a"), "a").code == 0);
  REQUIRE(run(train_args("b"), "b").code == 0);
  auto a = losses("a"), b = losses("b");
  REQUIRE(a.size() == 40);
  for (auto& [it, v] : a) {
    INFO("iteration " << it);
    CHECK(v == b[it]);  // loss and grad norm bit-identical
  }
  // Mock data is learnable: the loss falls clearly from ln(128) = 4.85.
  CHECK(a[1].first > 4.6);
  CHECK(a[40].first < a[1].first - 1.0);

  // Stopped at 20 by exit_interval (a checkpoint is written), then resumed to 40.
  REQUIRE(run(train_args("c", "--set training.exit_interval=20"), "c1").code == 0);
  REQUIRE(fs::exists(temp_dir() / "c" / "ckpt" / "iter_0000020" / "DONE"));
  REQUIRE(run(train_args("c"), "c2").code == 0);
  auto c = losses("c");
  REQUIRE(c.size() == 40);
  for (int64_t it = 1; it <= 40; ++it) {
    INFO("iteration " << it);
    CHECK(c[it] == a[it]);
  }
}

TEST_CASE("a misspelled key is a one-line error that leaves checkpoints untouched", "[e2e][errors]") {
  REQUIRE(run(train_args("d", "--set training.train_iters=4"), "d").code == 0);
  const fs::path ck = temp_dir() / "d" / "ckpt";
  const std::string before = fingerprint(ck);
  // The same config with a typo in one key.
  std::ifstream in(kTiny);
  std::stringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  auto pos = text.find("hidden_size");
  REQUIRE(pos != std::string::npos);
  text.replace(pos, 11, "hiden_size");
  const fs::path bad = temp_dir() / "typo.yaml";
  std::ofstream(bad) << text;
  Result r = run("train --config " + bad.string() + " --set checkpoint.dir=" + ck.string(), "typo");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find("hiden_size") != std::string::npos);
  CHECK(r.err.find("hidden_size") != std::string::npos);
  CHECK(r.err.find(bad.string()) != std::string::npos);
  CHECK(fingerprint(ck) == before);
}

TEST_CASE("a truncated .idx is a one-line error that leaves checkpoints untouched", "[e2e][errors]") {
  const fs::path prefix = temp_dir() / "tiny_text_document";
  {
    mt::data::IndexedDatasetWriter w(prefix.string(), mt::DType::U16);
    std::vector<int32_t> doc;
    for (int d = 0; d < 40; ++d) {
      doc.clear();
      for (int i = 0; i < 50 + d; ++i) doc.push_back((d * 7 + i * 3) % 127);
      w.add_item(doc.data(), static_cast<int64_t>(doc.size()));
      w.end_document();
    }
    w.finalize();
  }
  const std::string data_args = "--set data.mock=false --set data.paths=[" + prefix.string() +
                                "] --set data.split=[1,0,0] --set training.eval_iters=0";
  REQUIRE(run(train_args("e", data_args + " --set training.train_iters=4"), "e").code == 0);
  const fs::path ck = temp_dir() / "e" / "ckpt";
  const std::string before = fingerprint(ck);
  const fs::path idx = prefix.string() + ".idx";
  fs::resize_file(idx, fs::file_size(idx) - 9);
  Result r = run(train_args("e", data_args + " --set training.train_iters=8"), "e2");
  CHECK(r.code != 0);
  CHECK(count_lines(r.err) == 1);
  CHECK(r.err.find(".idx") != std::string::npos);
  CHECK(fingerprint(ck) == before);
}

TEST_CASE("more ranks than the layout uses is refused with the layout it would need", "[e2e][errors]") {
  const std::string cmd = "mpirun -np 2 " + kBin + " " + train_args("f", "--set training.train_iters=2") + " > " +
                          (temp_dir() / "f.out").string() + " 2>&1";
  int status = std::system(cmd.c_str());
  CHECK((WIFEXITED(status) && WEXITSTATUS(status) != 0));
  std::ifstream f(temp_dir() / "f.out");
  std::stringstream ss;
  ss << f.rdbuf();
  CHECK(ss.str().find("2 ranks were started") != std::string::npos);
  CHECK(ss.str().find("data 2") != std::string::npos);
}

TEST_CASE("--version and --help", "[e2e][cli]") {
  CHECK(run("--version", "version").code == 0);
  std::ifstream f(temp_dir() / "version.stdout");
  std::string line;
  std::getline(f, line);
  CHECK(line.rfind("megatrain ", 0) == 0);
  CHECK(run("train --help", "help").code == 0);
  CHECK(run("train", "nocfg").code != 0);
}
