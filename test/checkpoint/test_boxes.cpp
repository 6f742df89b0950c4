// Checkpoint internals: box intersection, the tiling check, strided N-d copies, directory names.
#include <numeric>
#include <vector>

#include "checkpoint/ckpt_util.h"
#include "test/catch.h"

using namespace mt;
using mt::ckpt::detail::Box;
namespace d = mt::ckpt::detail;

TEST_CASE("box intersection", "[checkpoint][box]") {
  Box r;
  CHECK(d::box_intersect({{0, 0}, {4, 4}}, {{2, 3}, {4, 4}}, &r));
  CHECK(r.off == Shape{2, 3});
  CHECK(r.len == Shape{2, 1});
  CHECK_FALSE(d::box_intersect({{0, 0}, {4, 4}}, {{4, 0}, {4, 4}}, &r));  // touching, not overlapping
  CHECK(d::box_intersect({{}, {}}, {{}, {}}, &r));                          // scalars: one element
  CHECK(d::box_volume({{}, {}}) == 1);
}

TEST_CASE("tiling check finds overlaps, gaps and boxes outside", "[checkpoint][box]") {
  const Box dom{{0, 0}, {8, 6}};
  std::vector<Box> ok = {{{0, 0}, {4, 3}}, {{0, 3}, {4, 3}}, {{4, 0}, {4, 2}}, {{4, 2}, {4, 4}}};
  CHECK(d::tiling_problem(dom, ok) == "");
  auto overlap = ok;
  overlap[3] = {{4, 1}, {4, 5}};
  CHECK_THAT(d::tiling_problem(dom, overlap), Catch::Contains("overlap"));
  auto gap = ok;
  gap.pop_back();
  CHECK_THAT(d::tiling_problem(dom, gap), Catch::Contains("gap"));
  auto outside = ok;
  outside[0] = {{0, 0}, {9, 3}};
  CHECK_THAT(d::tiling_problem(dom, outside), Catch::Contains("outside"));
  // Same volume but one box twice and one missing: caught as an overlap.
  auto twice = ok;
  twice[1] = twice[0];
  CHECK_THAT(d::tiling_problem(dom, twice), Catch::Contains("overlap"));
  // Scalars: one box tiles, two replicas overlap.
  CHECK(d::tiling_problem({{}, {}}, {{{}, {}}}) == "");
  CHECK_THAT(d::tiling_problem({{}, {}}, {{{}, {}}, {{}, {}}}), Catch::Contains("overlap"));
  // Zero-sized tensor: no elements, nothing to cover.
  CHECK(d::tiling_problem({{0, 0}, {0, 5}}, {{{0, 0}, {0, 5}}}) == "");
}

TEST_CASE("copy_box copies any sub-box between row-major boxes", "[checkpoint][box]") {
  // Global 3-d tensor [4, 5, 6], value = flat global index.
  const Shape g{4, 5, 6};
  auto value = [&](int64_t a, int64_t b, int64_t c) { return static_cast<int>((a * 5 + b) * 6 + c); };
  auto fill = [&](const Box& box) {
    std::vector<int> v(static_cast<size_t>(d::box_volume(box)));
    size_t i = 0;
    for (int64_t a = 0; a < box.len[0]; ++a)
      for (int64_t b = 0; b < box.len[1]; ++b)
        for (int64_t c = 0; c < box.len[2]; ++c) v[i++] = value(box.off[0] + a, box.off[1] + b, box.off[2] + c);
    return v;
  };
  const std::vector<std::pair<Box, Box>> cases = {
      {{{0, 0, 0}, {4, 5, 6}}, {{1, 1, 1}, {2, 3, 4}}},  // src whole, dst inner
      {{{1, 0, 0}, {2, 5, 6}}, {{0, 0, 0}, {4, 5, 6}}},  // contiguous rows (merged run)
      {{{0, 2, 0}, {4, 2, 6}}, {{0, 0, 3}, {4, 5, 3}}},  // strided both sides
      {{{0, 0, 5}, {4, 5, 1}}, {{2, 0, 0}, {2, 5, 6}}},  // single column
  };
  for (const auto& [sb, db] : cases) {
    Box region;
    REQUIRE(d::box_intersect(sb, db, &region));
    std::vector<int> src = fill(sb), dst(static_cast<size_t>(d::box_volume(db)), -1);
    d::copy_box(src.data(), sb, dst.data(), db, region, sizeof(int));
    size_t i = 0;
    for (int64_t a = 0; a < db.len[0]; ++a)
      for (int64_t b = 0; b < db.len[1]; ++b)
        for (int64_t c = 0; c < db.len[2]; ++c, ++i) {
          Shape p{db.off[0] + a, db.off[1] + b, db.off[2] + c};
          bool in = true;
          for (int k = 0; k < 3; ++k) in = in && p[k] >= region.off[k] && p[k] < region.off[k] + region.len[k];
          CHECK(dst[i] == (in ? value(p[0], p[1], p[2]) : -1));
        }
  }
}

TEST_CASE("checkpoint directory names", "[checkpoint]") {
  int64_t it = -1;
  CHECK(d::iter_dir_name(100) == "iter_0000100");
  CHECK(d::iter_dir_name(123456789) == "iter_123456789");
  CHECK(d::parse_iter_dir_name("iter_0000100", &it));
  CHECK(it == 100);
  CHECK(d::parse_iter_dir_name("iter_123456789", &it));
  CHECK(it == 123456789);
  CHECK_FALSE(d::parse_iter_dir_name("iter_100", &it));
  CHECK_FALSE(d::parse_iter_dir_name("iter_0000100.tmp-abc", &it));
  CHECK(d::parse_leftover_dir_name("iter_0000100.tmp-abc", &it));
  CHECK(d::parse_leftover_dir_name("iter_0000007.old-abc", &it));
  CHECK(it == 7);
  CHECK_FALSE(d::parse_leftover_dir_name("iter_0000100", &it));
  CHECK_FALSE(d::parse_leftover_dir_name("latest.tmp-abc", &it));
}
