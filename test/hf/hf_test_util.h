// Helpers of the conversion tests: a temporary folder, the one-rank world, and ways to break a
// safetensors file (edit its header in place, or rewrite it with other tensors).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "checkpoint/safetensors.h"
#include "runtime/mpi_communicator.h"
#include "test/catch.h"

namespace hf_test {

inline mt::Communicator& world() {
  static std::unique_ptr<mt::Communicator> w = [] {
    mt::mpi_init(nullptr, nullptr);
    return mt::make_world_communicator();
  }();
  return *w;
}

struct TempDir {
  std::string path;
  TempDir() {
    char tmpl[] = "/tmp/mt_test_hf_XXXXXX";
    REQUIRE(::mkdtemp(tmpl) != nullptr);
    path = tmpl;
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

// Rewrites the JSON header of a safetensors file in place (the new header padded with spaces to the
// old length, which it must not exceed), leaving the data section as it is.
inline void edit_header(const std::string& path, const std::function<void(nlohmann::json&)>& f) {
  std::fstream io(path, std::ios::in | std::ios::out | std::ios::binary);
  uint64_t n = 0;
  io.read(reinterpret_cast<char*>(&n), 8);
  std::string h(n, ' ');
  io.read(h.data(), static_cast<std::streamsize>(n));
  nlohmann::json j = nlohmann::json::parse(h);
  f(j);
  std::string out = j.dump();
  REQUIRE(out.size() <= n);
  out.append(n - out.size(), ' ');
  io.seekp(8);
  io.write(out.data(), static_cast<std::streamsize>(n));
}

struct OwnedTensor {
  std::string name;
  mt::DType dtype;
  mt::Shape shape;
  std::vector<uint8_t> bytes;
};

// Reads every tensor of a safetensors file, lets f change the list, writes the file again.
inline void rewrite_tensors(const std::string& path, const std::function<void(std::vector<OwnedTensor>&)>& f) {
  std::vector<OwnedTensor> ts;
  {
    mt::st::File file(path);
    for (const auto& t : file.tensors())
      ts.push_back({t.name, t.dtype, t.shape, std::vector<uint8_t>(file.data(t), file.data(t) + (t.end - t.begin))});
  }
  f(ts);
  std::vector<mt::st::WriteTensor> w;
  for (const auto& t : ts) w.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
  mt::st::write_file(path, w);
}

}  // namespace hf_test
