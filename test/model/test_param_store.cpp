// Parameter layout metadata: tensor-parallel boxes tile the global tensor, and seeded
// initialization gives every TP layout exactly the slices of the single-rank weights.
#include <cstring>

#include "catch.h"
#include "params/param_store.h"

using namespace mt;

namespace {
ParamSpec spec(const std::string& name, Shape shape, int pdim, int chunks) {
  ParamSpec s;
  s.name = name;
  s.global_shape = std::move(shape);
  s.partition_dim = pdim;
  s.partition_chunks = chunks;
  return s;
}
}  // namespace

TEST_CASE("param boxes: column split with two chunks ([gate; up])", "[params]") {
  Shape local;
  auto boxes = param_boxes(spec("fc1", {8, 3}, 0, 2), 1, 2, &local);
  REQUIRE(local == Shape{4, 3});
  REQUIRE(boxes.size() == 2);
  CHECK(boxes[0].global_offset == Shape{2, 0});  // gate rows 2..3
  CHECK(boxes[1].global_offset == Shape{6, 0});  // up rows 6..7
  CHECK(boxes[1].local_row_begin == 2);
  auto row = param_boxes(spec("fc2", {3, 8}, 1, 1), 1, 4, &local);
  CHECK(local == Shape{3, 2});
  CHECK(row[0].global_offset == Shape{0, 2});
}

TEST_CASE("TP slices of seeded init equal the single-rank tensor", "[params][init]") {
  for (int tp : {2, 4}) {
    for (auto s : {spec("a.weight", {8, 6}, 0, 1), spec("b.weight", {8, 6}, 0, 2), spec("c.weight", {6, 8}, 1, 1),
                   spec("d.bias", {8}, 0, 2)}) {
      ParamStore full(0, 1);
      Param* pf = full.add(s);
      full.allocate(DType::F64, Device::CPU);
      full.initialize(9, 0.02, 2);
      const Shape& g = s.global_shape;
      const int64_t cols = g.size() > 1 ? g[1] : 1;
      for (int r = 0; r < tp; ++r) {
        ParamStore part(r, tp);
        Param* pp = part.add(s);
        part.allocate(DType::F64, Device::CPU);
        part.initialize(9, 0.02, 2);
        // Every local element equals the global element its box maps it to.
        const double* lv = pp->value.data<double>();
        const double* gv = pf->value.data<double>();
        for (const ParamBox& b : pp->boxes) {
          const int64_t bcols = b.shape.size() > 1 ? b.shape[1] : 1;
          const int64_t lcols = pp->local_shape.size() > 1 ? pp->local_shape[1] : 1;
          for (int64_t i = 0; i < b.shape[0]; ++i)
            for (int64_t j = 0; j < bcols; ++j) {
              const int64_t gi = (b.global_offset[0] + i) * cols + (g.size() > 1 ? b.global_offset[1] + j : 0);
              const int64_t li = (b.local_row_begin + i) * lcols + j;
              REQUIRE(lv[li] == gv[gi]);
            }
        }
      }
    }
  }
}

TEST_CASE("param values and grads are views into one flat buffer each", "[params]") {
  ParamStore st(0, 1);
  Param* a = st.add(spec("a", {2, 3}, -1, 1));
  Param* b = st.add(spec("b", {4}, -1, 1));
  st.allocate(DType::F32, Device::CPU);
  CHECK(st.local_numel() == 10);
  CHECK(static_cast<char*>(b->value.raw()) - static_cast<char*>(a->value.raw()) == 6 * 4);
  CHECK(static_cast<char*>(b->grad.raw()) - static_cast<char*>(st.flat_grads().raw()) == 6 * 4);
  CHECK_THROWS_AS(st.add(spec("a", {1}, -1, 1)), InternalError);
}
