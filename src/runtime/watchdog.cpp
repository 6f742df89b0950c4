#include "runtime/watchdog.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "core/log.h"

namespace mt::watchdog {

namespace {

using Clock = std::chrono::steady_clock;

struct Op {
  const char* op;
  std::string group;
  int64_t bytes;
  std::function<bool()> done;
  Clock::time_point started;
};

std::string describe(const Op& o) {
  return fmt::format("{} of {:.2f} MiB on group '{}'", o.op, static_cast<double>(o.bytes) / 1048576.0, o.group);
}

struct State {
  std::mutex mu;
  std::condition_variable cv;
  std::thread thread;
  bool stopping = false;
  double timeout_s = 0;
  std::string coords;
  std::map<uint64_t, Op> in_flight;
  uint64_t next_id = 1;
  std::string last_completed = "none";
  int64_t last_iteration = 0;
  bool in_iteration = false;
  Clock::time_point last_progress = Clock::now();
  std::vector<std::function<void()>> aborts;
};

std::atomic<bool> g_enabled{false};
State& state() {
  static State* s = new State();  // never destroyed: the thread may outlive static destruction
  return *s;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

[[noreturn]] void fire(State& s, const std::string& what, double waited) {
  // A fatal error, reported like main() reports one: a line on stderr.
  const std::string line = fmt::format(
      "megatrain: error: watchdog: {}: {} has not completed after {:.1f} s (training.collective_timeout_s = {:g}); "
      "last completed iteration {}; last completed collective: {}. Aborting the communicators and exiting (a peer "
      "of this group is stuck or dead: look for its own watchdog line)\n",
      s.coords, what, waited, s.timeout_s, s.last_iteration, s.last_completed);
  spdlog::default_logger()->flush();
  std::fputs(line.c_str(), stderr);
  std::fflush(stderr);
  // ncclCommAbort may itself block on a broken peer: give the aborts a few seconds, then exit.
  std::vector<std::function<void()>> aborts = s.aborts;
  std::thread([aborts] {
    for (const auto& a : aborts) a();
  }).detach();
  std::this_thread::sleep_for(std::chrono::seconds(aborts.empty() ? 0 : 5));
  std::_Exit(kExitCode);
}

void run(State& s) {
  std::unique_lock<std::mutex> lock(s.mu);
  while (!s.stopping) {
    s.cv.wait_for(lock, std::chrono::milliseconds(50));
    if (s.stopping) break;
    const auto now = Clock::now();
    for (auto it = s.in_flight.begin(); it != s.in_flight.end();) {
      Op& o = it->second;
      if (o.done && o.done()) {
        s.last_completed = describe(o);
        s.last_progress = now;
        it = s.in_flight.erase(it);
        continue;
      }
      const double waited = seconds(now - o.started);
      if (waited > s.timeout_s) fire(s, describe(o), waited);
      ++it;
    }
    const double idle = seconds(now - s.last_progress);
    if (s.in_iteration && s.in_flight.empty() && idle > s.timeout_s)
      fire(s, fmt::format("iteration {} (no collective in flight: this rank is stuck outside communication)",
                          s.last_iteration + 1),
           idle);
  }
}

}  // namespace

void start(double timeout_s, const std::string& coords) {
  State& s = state();
  stop();
  if (timeout_s <= 0) return;
  std::lock_guard<std::mutex> lock(s.mu);
  s.timeout_s = timeout_s;
  s.coords = coords;
  s.stopping = false;
  s.last_progress = Clock::now();
  s.thread = std::thread(run, std::ref(s));
  g_enabled = true;
}

void stop() {
  State& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.thread.joinable()) return;
    s.stopping = true;
    g_enabled = false;
  }
  s.cv.notify_all();
  s.thread.join();
  s.in_flight.clear();
}

bool enabled() { return g_enabled.load(std::memory_order_relaxed); }

void iteration_begin(int64_t iteration) {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.in_iteration = true;
  s.last_iteration = iteration - 1;
  s.last_progress = Clock::now();
}

void iteration_end(int64_t iteration) {
  if (!enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.in_iteration = false;
  s.last_iteration = iteration;
  s.last_progress = Clock::now();
}

void on_abort(std::function<void()> fn) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  s.aborts.push_back(std::move(fn));
}

uint64_t begin(const char* op, const std::string& group, int64_t bytes, std::function<bool()> done) {
  if (!enabled()) return 0;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  const uint64_t id = s.next_id++;
  s.in_flight.emplace(id, Op{op, group, bytes, std::move(done), Clock::now()});
  s.last_progress = Clock::now();
  return id;
}

void end(uint64_t id) {
  if (id == 0 || !enabled()) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.in_flight.find(id);
  if (it == s.in_flight.end()) return;
  s.last_completed = describe(it->second);
  s.last_progress = Clock::now();
  s.in_flight.erase(it);
}

}  // namespace mt::watchdog
