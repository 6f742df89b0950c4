// Helpers for tests that signal or kill a running megatrain: start it in the background (optionally
// under mpirun, optionally with a signal already pending), wait for a line in its output, collect
// its exit status, list mpirun's ranks.
#pragma once

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "catch.h"
#include "common/run_binary.h"

namespace mt::test {

struct Proc {
  pid_t pid = -1;
  fs::path out, err;
};

// In a forked child: runs `words` with the signals as a terminal's shell leaves them for a command, at their defaults
// and unblocked, whatever the test runner left ignored (a background job ignores SIGINT) or blocked (masks are
// inherited: a blocked SIGUSR1 never reaches mpirun, which does not unblock it). With pending_sig, that signal is
// then blocked and raised: it is pending when the command starts.
[[noreturn]] inline void exec_from_shell(std::vector<std::string>& words, int pending_sig = 0) {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1, SIGQUIT, SIGHUP, SIGTTOU, SIGTTIN}) ::signal(sig, SIG_DFL);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
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

// Starts the command `words` with stdout/stderr in files named after tag. With pending_sig, that signal is blocked
// and raised before exec: it is pending when the command starts. With own_group, the command leads a process group
// of its own, as a shell starts a job: kill(-pid, SIGINT) is then what a terminal's Ctrl-C sends.
inline Proc spawn_words(std::vector<std::string> words, const std::string& tag, int pending_sig = 0,
                        bool own_group = false) {
  Proc p{-1, temp_dir() / (tag + ".stdout"), temp_dir() / (tag + ".stderr")};
  p.pid = ::fork();
  REQUIRE(p.pid >= 0);
  if (p.pid == 0) {
    if (own_group) ::setpgid(0, 0);
    const int o = ::open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = ::open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(o, 1);
    ::dup2(e, 2);
    exec_from_shell(words, pending_sig);
  }
  if (own_group) ::setpgid(p.pid, p.pid);  // also from here, so it holds before the caller signals the group
  return p;
}

// `words` followed by ARGS split at spaces.
inline std::vector<std::string> with_args(std::vector<std::string> words, const std::string& args) {
  std::istringstream ss(args);
  for (std::string w; ss >> w;) words.push_back(w);
  return words;
}

// Starts "[mpirun -np NP] megatrain ARGS" (ARGS split at spaces).
inline Proc spawn(const std::string& args, const std::string& tag, int np = 0, int pending_sig = 0) {
  std::vector<std::string> words;
  if (np > 0) words = {"mpirun", "-np", std::to_string(np)};
  words.push_back(megatrain_bin());
  return spawn_words(with_args(words, args), tag, pending_sig);
}

// Starts "scripts/launch_mpirun.sh -n NP -- ARGS" on this build's megatrain (MEGATRAIN_BIN), leading a process group
// of its own as a job started from a terminal does.
inline Proc spawn_launcher(const std::string& args, const std::string& tag, int np) {
  return spawn_words(with_args({"env", "MEGATRAIN_BIN=" + megatrain_bin(), source_path("scripts/launch_mpirun.sh"), "-n",
                                std::to_string(np), "--"},
                               args),
                     tag, 0, true);
}

// A command on a terminal of its own: a session leader whose controlling terminal (and stdin, stdout, stderr) is a
// new pseudo-terminal, as a shell in a terminal window starts it. `master` is the terminal's other end: what the
// command writes is read there, and "\x03" written there is Ctrl-C typed at the keyboard (the terminal sends SIGINT
// to its foreground process group, not to a job that runs in a process group of its own).
struct TermProc {
  pid_t pid = -1;
  int master = -1;
  std::string out;  // everything read from the terminal so far
};

inline TermProc spawn_on_terminal(std::vector<std::string> words) {
  TermProc t;
  t.master = ::posix_openpt(O_RDWR | O_NOCTTY);
  REQUIRE(t.master >= 0);
  REQUIRE(::grantpt(t.master) == 0);
  REQUIRE(::unlockpt(t.master) == 0);
  const std::string slave = ::ptsname(t.master);
  t.pid = ::fork();
  REQUIRE(t.pid >= 0);
  if (t.pid == 0) {
    ::setsid();
    const int fd = ::open(slave.c_str(), O_RDWR);  // the first terminal a session leader opens becomes its own
    if (fd < 0) ::_exit(126);
    ::dup2(fd, 0);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::close(t.master);
    exec_from_shell(words);
  }
  return t;
}

// Reads the terminal until `text` has appeared (true), or until the terminal closes / `seconds` pass (false).
inline bool read_terminal_until(TermProc& t, const std::string& text, int seconds = 120) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
  while (std::chrono::steady_clock::now() < end) {
    if (t.out.find(text) != std::string::npos) return true;
    pollfd pfd{t.master, POLLIN, 0};
    if (::poll(&pfd, 1, 50) > 0) {
      char buf[4096];
      const ssize_t n = ::read(t.master, buf, sizeof buf);
      if (n <= 0) return t.out.find(text) != std::string::npos;  // closed: every process of the session is gone
      t.out.append(buf, static_cast<size_t>(n));
    }
  }
  return false;
}

// Whether a live process (not a zombie) has `needle` in its command line (/proc/PID/cmdline, NULs as spaces).
inline bool any_process_with(const std::string& needle) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator("/proc", ec)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name.find_first_not_of("0123456789") != std::string::npos) continue;
    const std::string stat = read_file(e.path() / "stat");
    const size_t paren = stat.rfind(')');
    if (paren == std::string::npos || paren + 2 >= stat.size() || stat[paren + 2] == 'Z') continue;
    std::string cmd = read_file(e.path() / "cmdline");
    std::replace(cmd.begin(), cmd.end(), '\0', ' ');
    if (cmd.find(needle) != std::string::npos) return true;
  }
  return false;
}

// Waits until `file` contains `text` (true) or the process ended / 120 s passed (false).
inline bool wait_for(const Proc& p, const fs::path& file, const std::string& text) {
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
inline int wait_exit(const Proc& p) {
  int status = 0;
  for (int i = 0; i < 18000; ++i) {
    if (::waitpid(p.pid, &status, WNOHANG) == p.pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ::kill(p.pid, SIGKILL);
  ::waitpid(p.pid, &status, 0);
  return -1;
}

// The child processes of `pid` (mpirun's ranks), from /proc.
inline std::vector<pid_t> children(pid_t pid) {
  std::vector<pid_t> out;
  std::istringstream ss(read_file("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children"));
  for (pid_t c; ss >> c;) out.push_back(c);
  return out;
}

// Which of mpirun's `ranks` is world rank `rank` (OMPI_COMM_WORLD_RANK in its environment); -1 if none.
inline pid_t rank_pid(const std::vector<pid_t>& ranks, int rank) {
  const std::string want = "OMPI_COMM_WORLD_RANK=" + std::to_string(rank);
  for (pid_t r : ranks) {
    std::istringstream env(read_file("/proc/" + std::to_string(r) + "/environ"));
    for (std::string var; std::getline(env, var, '\0');)
      if (var == want) return r;
  }
  return -1;
}


}  // namespace mt::test
