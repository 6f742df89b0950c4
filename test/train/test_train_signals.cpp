// Issue #20: stop signals on a real megatrain process (alone and under mpirun with 2 ranks).
// SIGTERM / SIGUSR1 / a first SIGINT stop after the current iteration, saving a checkpoint when
// checkpoint.dir is set and saying that none is saved when it is not, exit 0; a second SIGINT exits
// at once (130) with a message; a signal already pending when the process starts (during start-up)
// ends it cleanly before iteration 1.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"

using namespace mt::test;

namespace {

const std::string kTiny = source_path("configs/ci/tiny-llama.yaml");

struct Proc {
  pid_t pid = -1;
  fs::path out, err;
};

// Starts "[mpirun -np NP] megatrain ARGS" (ARGS split at spaces) with stdout/stderr in files. With
// pending_sig, that signal is blocked and raised before exec: it is pending when megatrain starts.
Proc spawn(const std::string& args, const std::string& tag, int np = 0, int pending_sig = 0) {
  Proc p{-1, temp_dir() / (tag + ".stdout"), temp_dir() / (tag + ".stderr")};
  std::vector<std::string> words;
  if (np > 0) words = {"mpirun", "-np", std::to_string(np)};
  words.push_back(megatrain_bin());
  std::istringstream ss(args);
  for (std::string w; ss >> w;) words.push_back(w);
  p.pid = ::fork();
  REQUIRE(p.pid >= 0);
  if (p.pid == 0) {
    const int o = ::open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    if (pending_sig) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, pending_sig);
      ::sigprocmask(SIG_BLOCK, &set, nullptr);
      ::kill(::getpid(), pending_sig);
    }
    std::vector<char*> argv;
    for (std::string& w : words) argv.push_back(w.data());
    argv.push_back(nullptr);
    ::execvp(argv[0], argv.data());
    ::_exit(127);
  }
  return p;
}

// Waits until `file` contains `text` (true) or the process ended / 120 s passed (false).
bool wait_for(const Proc& p, const fs::path& file, const std::string& text) {
  for (int i = 0; i < 12000; ++i) {
    if (read_file(file).find(text) != std::string::npos) return true;
    siginfo_t info{};
    if (::waitid(P_PID, static_cast<id_t>(p.pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 && info.si_pid == p.pid)
      return read_file(file).find(text) != std::string::npos;  // ended (not reaped: wait_exit reads its status)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

// The exit status (128 + signal when killed); -1 after 180 s (then the process is killed).
int wait_exit(const Proc& p) {
  int status = 0;
  for (int i = 0; i < 18000; ++i) {
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, &status, 0);
  return -1;
}

// Many iterations (the run is always stopped by a signal), global batch 32 for iterations long
// enough to signal twice within one.
std::string args(const std::string& dir_value) {
  return "train --config " + kTiny + " --set training.train_iters=100000 --set training.eval_interval=0" +
         " --set training.global_batch_size=32 --set logging.log_interval=1 --set logging.metrics_file= " +
         "--set checkpoint.save_interval=0 --set checkpoint.dir=" + dir_value;
}

std::vector<std::string> iter_dirs(const fs::path& dir) {
  std::vector<std::string> out;
  if (!fs::exists(dir)) return out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind("iter_", 0) == 0) out.push_back(e.path().filename().string());
  return out;
}

}  // namespace

TEST_CASE("SIGTERM with checkpoint.dir empty says no checkpoint is saved and exits 0", "[e2e][signals]") {
  Proc p = spawn(args(""), "sig_nodir");
  REQUIRE(wait_for(p, p.out, "iter 2/"));
  ::kill(p.pid, SIGTERM);
  CHECK(wait_exit(p) == 0);
  const std::string out = read_file(p.out);
  CHECK(out.find("SIGTERM received at iteration") != std::string::npos);
  CHECK(out.find("no checkpoint saved (checkpoint.dir is empty)") != std::string::npos);
  CHECK(out.find("checkpoint saved") == out.find("no checkpoint saved") + 3);  // never claims a save
  CHECK(read_file(p.err).find("SIGTERM: stopping after the current iteration") != std::string::npos);
}

TEST_CASE("the first SIGINT saves and exits 0, a second exits at once", "[e2e][signals]") {
  const fs::path ck1 = temp_dir() / "sigint1";
  Proc p = spawn(args(ck1.string()), "sigint1");
  REQUIRE(wait_for(p, p.out, "iter 2/"));
  ::kill(p.pid, SIGINT);
  CHECK(wait_exit(p) == 0);
  CHECK(read_file(p.err).find("press Ctrl-C again") != std::string::npos);
  const std::string out = read_file(p.out);
  CHECK(out.find("SIGINT received at iteration") != std::string::npos);
  REQUIRE(iter_dirs(ck1).size() == 1);
  CHECK(fs::exists(ck1 / iter_dirs(ck1)[0] / "DONE"));

  const fs::path ck2 = temp_dir() / "sigint2";
  Proc q = spawn(args(ck2.string()), "sigint2");
  REQUIRE(wait_for(q, q.out, "iter 2/"));
  ::kill(q.pid, SIGINT);
  REQUIRE(wait_for(q, q.err, "press Ctrl-C again"));  // the first one was handled
  ::kill(q.pid, SIGINT);
  CHECK(wait_exit(q) == 130);
  CHECK(read_file(q.err).find("second SIGINT: exiting now without saving a checkpoint") != std::string::npos);
}

TEST_CASE("a stop signal during start-up ends the run cleanly before iteration 1", "[e2e][signals]") {
  const fs::path ck = temp_dir() / "sig_startup";
  for (int sig : {SIGTERM, SIGINT, SIGUSR1}) {
    INFO("signal " << sig);
    Proc p = spawn(args(ck.string()), "sig_startup", 0, sig);
    CHECK(wait_exit(p) == 0);
    const std::string out = read_file(p.out);
    CHECK(out.find("received during start-up: exiting before iteration 1") != std::string::npos);
    CHECK(out.find("iter 1/") == std::string::npos);
    CHECK(read_file(p.err).find("internal error") == std::string::npos);
    CHECK(iter_dirs(ck).empty());
  }
}

namespace {
// The child processes of `pid` (mpirun's ranks), from /proc.
std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  std::istringstream ss(read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children"));
  for (pid_t c; ss >> c;) out.push_back(c);
  return out;
}
}  // namespace

TEST_CASE("under mpirun with 2 ranks a stop signal saves one complete checkpoint; without a dir none",
          "[e2e][signals][mpi]") {
  // SIGTERM to every rank (as SLURM's scancel sends it): both stop after the same iteration, exit 0.
  const fs::path ck = temp_dir() / "sig_mpi";
  Proc p = spawn(args(ck.string()), "sig_mpi", 2);
  REQUIRE(wait_for(p, p.out, "iter 2/"));
  const std::vector<pid_t> ranks = children(p.pid);
  REQUIRE(ranks.size() == 2);
  for (pid_t r : ranks) ::kill(r, SIGTERM);
  CHECK(wait_exit(p) == 0);
  REQUIRE(iter_dirs(ck).size() == 1);
  const fs::path saved = ck / iter_dirs(ck)[0];
  CHECK(fs::exists(saved / "DONE"));
  CHECK(fs::exists(saved / "shard_r00000.json"));
  CHECK(fs::exists(saved / "shard_r00001.json"));
  CHECK(read_file(p.out).find("SIGTERM received at iteration") != std::string::npos);

  // SIGTERM to mpirun: Open MPI forwards it to the ranks, which save and exit 0 (mpirun itself then
  // exits 1 by its own rule, so only the checkpoint is checked).
  const fs::path ck2 = temp_dir() / "sig_mpirun";
  Proc m = spawn(args(ck2.string()), "sig_mpirun", 2);
  REQUIRE(wait_for(m, m.out, "iter 2/"));
  ::kill(m.pid, SIGTERM);
  wait_exit(m);
  REQUIRE(iter_dirs(ck2).size() == 1);
  CHECK(fs::exists(ck2 / iter_dirs(ck2)[0] / "DONE"));

  // SIGUSR1 to mpirun (forwarded), no checkpoint.dir.
  Proc q = spawn(args(""), "sig_mpi_nodir", 2);
  REQUIRE(wait_for(q, q.out, "iter 2/"));
  ::kill(q.pid, SIGUSR1);
  const int code = wait_exit(q);
  INFO(read_file(q.err));
  CHECK(code == 0);
  CHECK(read_file(q.out).find("no checkpoint saved (checkpoint.dir is empty)") != std::string::npos);
}
