// Per-op GPU time (MT_OP_PROFILE): each CUDA op records a pair of CUDA events around its launches on
// the current stream; at process exit the elapsed times are summed per op name and shape and printed,
// largest first (to stderr for MT_OP_PROFILE=1, else appended to the file it names). Event records
// do not synchronize, so the step keeps its overlap; the sum over ops against the step's wall time
// shows how long the GPU waited for the host. Off (one branch per op) unless the variable is set.
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

void report() {
  Profile& p = *g_profile;
  std::lock_guard<std::mutex> lock(p.mu);
  if (p.records.empty()) return;
  cudaDeviceSynchronize();
  struct Sum {
    double ms = 0;
    long calls = 0;
  };
  std::map<std::string, Sum> sums;
  double total = 0;
  for (const Record& r : p.records) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, r.start, r.end) != cudaSuccess) continue;
    Sum& s = sums[r.key];
    s.ms += ms;
    ++s.calls;
    total += ms;
  }
  float span = 0;
  cudaEventElapsedTime(&span, p.records.front().start, p.records.back().end);
  std::vector<std::pair<std::string, Sum>> rows(sums.begin(), sums.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  FILE* f = p.dest == "1" ? stderr : std::fopen(p.dest.c_str(), "a");
  if (!f) f = stderr;
  std::fprintf(f, "op profile: %zu op calls, %.3f ms of op time, %.3f ms from the first op's start to the last's end\n",
               p.records.size(), total, static_cast<double>(span));
  std::fprintf(f, "%12s %8s %10s %6s  %s\n", "total ms", "calls", "ms/call", "%", "op");
  for (const auto& [key, s] : rows)
    std::fprintf(f, "%12.3f %8ld %10.4f %6.2f  %s\n", s.ms, s.calls, s.ms / static_cast<double>(s.calls),
                 100.0 * s.ms / total, key.c_str());
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
  std::string key = op;
  key += " [";
  key += std::to_string(a);
  if (b >= 0) key += "," + std::to_string(b);
  if (c >= 0) key += "," + std::to_string(c);
  key += "]";
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
