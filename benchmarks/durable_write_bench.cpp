// Write rate of ckpt::detail::write_file_durable (the checkpoint shard writer) with 1 and 4 threads: one file of GB
// gigabytes, written twice each way. Build without CMake (three sources):
//   g++ -std=c++20 -O2 -Isrc -I. benchmarks/durable_write_bench.cpp src/checkpoint/ckpt_util.cpp src/tensor/tensor.cpp \
//       src/core/allocator.cpp -o /tmp/wb -pthread && /tmp/wb GB [PATH]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>
#include "checkpoint/ckpt_util.h"
int main(int argc, char** argv) {
  const double gb = argc > 1 ? std::atof(argv[1]) : 4;
  const std::string path = argc > 2 ? argv[2] : "/tmp/wb.bin";
  const size_t n = static_cast<size_t>(gb * 1e9), chunk = size_t(256) << 20;
  std::vector<char> buf(n);
  for (size_t i = 0; i < n; i += 4096) buf[i] = static_cast<char>(i >> 12);
  std::vector<mt::ckpt::detail::Chunk> chunks;
  for (size_t off = 0; off < n; off += chunk) chunks.push_back({buf.data() + off, std::min(chunk, n - off)});
  for (int threads : {1, 4, 1, 4}) {
    auto t0 = std::chrono::steady_clock::now();
    mt::ckpt::detail::write_file_durable(path, chunks, threads);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("threads %d: %.2f GB in %.2f s = %.2f GB/s\n", threads, n / 1e9, s, n / 1e9 / s);
    std::remove(path.c_str());
  }
}
