// Per-op GPU time (MT_OP_PROFILE): each CUDA op records a pair of CUDA events around its launches on
// the current stream; at process exit the times are gathered per op name and shape and printed,
// largest first by median x calls (to stderr for MT_OP_PROFILE=1, else appended to the file it names).
// Event records do not synchronize, so the step keeps its overlap; the ops' sum against the step's
// wall time shows how long the GPU waited for the host. Off (one branch per op) unless the variable
// is set.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda/cuda_context.h"
#include "cuda/cuda_ops.h"

namespace mt::ops::cuda {

namespace {

struct Record {
  std::string key;
  cudaEvent_t start, end;
};

struct Profile {
  std::mutex mu;
  std::vector<Record> records;
  std::vector<cudaEvent_t> pool;
  std::string dest;
};

Profile* g_profile = nullptr;

// A key without its trailing shape ("op [a,b]" -> "op"): the idle report sums over shapes.
std::string op_name(const std::string& key) {
  const size_t at = key.rfind(" [");
  return at == std::string::npos ? key : key.substr(0, at);
}

void report() {
  Profile& p = *g_profile;
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.records.empty()) return;
  cudaDeviceSynchronize();
  std::map<std::string, std::vector<float>> times;
  double total = 0;
  for (const Record& r : p.records) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, r.start, r.end) != cudaSuccess) continue;
    times[r.key].push_back(ms);
    total += ms;
  }
  float span = 0;
  cudaEventElapsedTime(&span, p.records.front().start, p.records.back().end);
  // The median call stands for the op: the first calls of a run also time one-off host work between
  // their two events (library handles, heuristics, cuDNN plans compiled by NVRTC, lazy module loads).
  struct Row {
    std::string key;
    size_t calls;
    double total, median, est;
  };
  std::vector<Row> rows;
  double est_total = 0;
  for (auto& [key, v] : times) {
    std::vector<float> sorted = v;
    std::sort(sorted.begin(), sorted.end());
    const double med = sorted[sorted.size() / 2];
    double sum = 0;
    for (float t : v) sum += t;
    rows.push_back({key, v.size(), sum, med, med * static_cast<double>(v.size())});
    est_total += med * static_cast<double>(v.size());
  }
  std::sort(rows.begin(), rows.end(), [](const Row& a, const Row& b) { return a.est > b.est; });
  FILE* f = p.dest == "1" ? stderr : std::fopen(p.dest.c_str(), "a");
  if (!f) f = stderr;
  std::fprintf(f,
               "op profile: %zu op calls, %.3f ms of op time (%.3f ms as median x calls), %.3f ms from the first "
               "op's start to the last's end\n",
               p.records.size(), total, est_total, static_cast<double>(span));
  std::fprintf(f, "%12s %8s %10s %12s %6s  %s\n", "median*calls", "calls", "median ms", "total ms", "%", "op");
  for (const Row& r : rows)
    std::fprintf(f, "%12.3f %8zu %10.4f %12.3f %6.2f  %s\n", r.est, r.calls, r.median, r.total,
                 100.0 * r.est / est_total, r.key.c_str());
  // Where the GPU waited for the host: the time from an op's predecessor's end (in issue order) to its start,
  // booked to the op that waited and the op before it (a host synchronization, or launches slower than the GPU,
  // between the two).
  std::map<std::string, std::pair<double, size_t>> idle;
  double idle_total = 0;
  for (size_t i = 1; i < p.records.size(); ++i) {
    float gap = 0;
    if (cudaEventElapsedTime(&gap, p.records[i - 1].end, p.records[i].start) != cudaSuccess || gap <= 0.002f) continue;
    auto& [ms, n] = idle[op_name(p.records[i].key) + "  <-  " + op_name(p.records[i - 1].key)];
    ms += gap, ++n, idle_total += gap;
  }
  std::vector<std::pair<double, std::string>> by_idle;
  for (auto& [key, v] : idle) by_idle.emplace_back(v.first, key);
  std::sort(by_idle.rbegin(), by_idle.rend());
  std::fprintf(f, "GPU idle between ops: %.3f ms in all (gaps over 2 us), by op  <-  the op before it, largest first:\n",
               idle_total);
  std::fprintf(f, "%12s %8s  %s\n", "idle ms", "gaps", "op");
  for (size_t i = 0; i < by_idle.size() && i < 40; ++i)
    std::fprintf(f, "%12.3f %8zu  %s\n", by_idle[i].first, idle[by_idle[i].second].second, by_idle[i].second.c_str());
  if (f != stderr) std::fclose(f);
  cudaGetLastError();
}

cudaEvent_t take_event(Profile& p) {
  if (!p.pool.empty()) {
    cudaEvent_t e = p.pool.back();
    p.pool.pop_back();
    return e;
  }
  cudaEvent_t e = nullptr;
  cudaEventCreate(&e);
  return e;
}

}  // namespace

bool op_profile_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MT_OP_PROFILE");
    if (!v || !*v || std::strcmp(v, "0") == 0) return false;
    g_profile = new Profile();  // lives for the process; reported at exit
    g_profile->dest = v;
    std::atexit(report);
    return true;
  }();
  return on;
}

OpTimer::OpTimer(const char* op, int64_t a, int64_t b, int64_t c) {
  if (!op_profile_enabled()) return;
  char buf[320];
  if (c >= 0) std::snprintf(buf, sizeof buf, "%s [%lld,%lld,%lld]", op, (long long)a, (long long)b, (long long)c);
  else if (b >= 0) std::snprintf(buf, sizeof buf, "%s [%lld,%lld]", op, (long long)a, (long long)b);
  else std::snprintf(buf, sizeof buf, "%s [%lld]", op, (long long)a);
  std::string key = buf;
  Profile& p = *g_profile;
  std::lock_guard<std::mutex> lock(p.mu);
  Record r{std::move(key), take_event(p), take_event(p)};
  cudaEventRecord(r.start, ::mt::cuda::current_stream());
  p.records.push_back(std::move(r));
  index_ = static_cast<int64_t>(p.records.size()) - 1;
}

OpTimer::~OpTimer() {
  if (index_ < 0) return;
  Profile& p = *g_profile;
  std::lock_guard<std::mutex> lock(p.mu);
  cudaEventRecord(p.records[static_cast<size_t>(index_)].end, ::mt::cuda::current_stream());
}

}  // namespace mt::ops::cuda
