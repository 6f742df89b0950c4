// detail::write_file_durable with several writer threads (ckpt_util.h): the file holds exactly the concatenated
// chunks whatever the thread count, with ranges that split chunks, chunks smaller than a range, empty chunks and
// a last range shorter than the others; a file that cannot be created is an error naming it.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "checkpoint/ckpt_util.h"
#include "core/check.h"
#include "test/catch.h"

using namespace mt::ckpt::detail;
namespace fs = std::filesystem;

TEST_CASE("write_file_durable: several writer threads write the same bytes as one", "[checkpoint][durable]") {
  char tmpl[] = "/tmp/mt_test_durable_XXXXXX";
  REQUIRE(::mkdtemp(tmpl) != nullptr);
  const fs::path dir = tmpl;
  // 5.3 MiB in chunks of odd sizes (one empty): ranges of >= 1 MiB cut through chunks.
  const std::vector<size_t> sizes = {3, (1u << 20) + 17, 0, 777777, (2u << 20) + 4093, 1, (1u << 20) - 5, 333333};
  std::vector<std::vector<uint8_t>> bufs;
  std::string expect;
  uint32_t x = 2463534242u;
  for (size_t n : sizes) {
    bufs.emplace_back(n);
    for (uint8_t& b : bufs.back()) {
      x ^= x << 13, x ^= x >> 17, x ^= x << 5;
      b = static_cast<uint8_t>(x);
    }
    expect.append(bufs.back().begin(), bufs.back().end());
  }
  std::vector<Chunk> chunks;
  for (const auto& b : bufs) chunks.push_back({b.data(), b.size()});
  for (int threads : {1, 2, 3, 4, 7, 64}) {
    INFO(threads << " threads");
    const fs::path p = dir / ("f" + std::to_string(threads));
    write_file_durable(p.string(), chunks, threads);
    std::ifstream f(p, std::ios::binary);
    const std::string got{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
    CHECK(got.size() == expect.size());
    CHECK(got == expect);
  }
  // Empty and tiny files.
  write_file_durable((dir / "empty").string(), {}, 4);
  CHECK(fs::file_size(dir / "empty") == 0);
  write_file_durable((dir / "tiny").string(), std::string("abc"));
  CHECK(fs::file_size(dir / "tiny") == 3);
  CHECK_THROWS_WITH(write_file_durable((dir / "no" / "such").string(), chunks, 4),
                    Catch::Contains((dir / "no" / "such").string()));
  fs::remove_all(dir);
}
