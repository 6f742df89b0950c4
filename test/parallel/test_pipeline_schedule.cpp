// Pipeline schedules (src/parallel/pipeline_schedule.h) checked without a model: literal lists worked
// out by hand from Megatron-Core's algorithm, structural invariants of every stage's list, and a
// simulation of all stages with batch_p2p semantics (schedule_sim.h) for deadlock freedom, message
// matching, cross-stage data dependencies, in-flight micro-batches and the bubble.
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "parallel/schedule_sim.h"  // test/parallel
#include "catch.h"

using namespace mt::pp;

namespace {

// "F0.0 [SF0.0 RB0.0] B0.0 ...": one batch_p2p in brackets.
std::string describe(const std::vector<Action>& list) {
  std::string out;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    const bool comm = sim::is_comm(a.kind);
    const bool opens = comm && (i == 0 || !sim::is_comm(list[i - 1].kind) || list[i - 1].batch != a.batch);
    const bool closes = comm && (i + 1 == list.size() || !sim::is_comm(list[i + 1].kind) || list[i + 1].batch != a.batch);
    if (i > 0) out += ' ';
    if (opens) out += '[';
    out += to_string(a);
    if (closes) out += ']';
  }
  return out;
}

std::vector<std::vector<Action>> all_stages(int p, int m, int v) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p; ++s) lists.push_back(pipeline_schedule(p, s, m, v));
  return lists;
}

// Megatron's bound on forwards whose backward is still pending, computed here independently.
int expected_in_flight(int p, int s, int m, int v) {
  if (v == 1) return std::min(p - s, m);
  return std::min((p - s - 1) * 2 + (v - 1) * p + 1, m * v);
}

int max_in_flight_of(const std::vector<Action>& list) {
  int now = 0, most = 0;
  for (const Action& a : list) {
    if (a.kind == ActionKind::Forward) most = std::max(most, ++now);
    if (a.kind == ActionKind::Backward) --now;
  }
  return most;
}

// The invariants of one stage's list on its own.
void check_list(const std::vector<Action>& list, int p, int s, int m, int v) {
  INFO("p=" << p << " s=" << s << " m=" << m << " v=" << v << ": " << describe(list));
  // Batch ids: -1 on compute; one id per run of adjacent communication actions, never reused.
  std::set<int> batches;
  for (size_t i = 0; i < list.size(); ++i) {
    const Action& a = list[i];
    if (!sim::is_comm(a.kind)) {
      REQUIRE(a.batch == -1);
      continue;
    }
    REQUIRE(a.batch >= 0);
    if (i == 0 || !sim::is_comm(list[i - 1].kind) || list[i - 1].batch != a.batch) REQUIRE(batches.insert(a.batch).second);
  }
  // Positions of every (kind, chunk, micro-batch).
  std::map<std::tuple<ActionKind, int, int>, std::vector<int>> pos;
  for (int i = 0; i < int(list.size()); ++i) {
    const Action& a = list[i];
    REQUIRE(a.microbatch >= 0);
    REQUIRE(a.microbatch < m);
    REQUIRE(a.chunk >= 0);
    REQUIRE(a.chunk < v);
    pos[{a.kind, a.chunk, a.microbatch}].push_back(i);
  }
  auto at = [&](ActionKind k, int c, int mb) { return pos[{k, c, mb}]; };
  for (int c = 0; c < v; ++c) {
    const bool first = s == 0 && c == 0, last = s == p - 1 && c == v - 1;
    for (int mb = 0; mb < m; ++mb) {
      INFO("micro-batch " << mb << " chunk " << c);
      const auto f = at(ActionKind::Forward, c, mb), b = at(ActionKind::Backward, c, mb);
      REQUIRE(f.size() == 1);
      REQUIRE(b.size() == 1);
      REQUIRE(f[0] < b[0]);
      const auto rf = at(ActionKind::RecvForward, c, mb), sf = at(ActionKind::SendForward, c, mb);
      const auto rb = at(ActionKind::RecvBackward, c, mb), sb = at(ActionKind::SendBackward, c, mb);
      REQUIRE(rf.size() == (first ? 0u : 1u));
      REQUIRE(sb.size() == (first ? 0u : 1u));
      REQUIRE(sf.size() == (last ? 0u : 1u));
      REQUIRE(rb.size() == (last ? 0u : 1u));
      if (!first) REQUIRE(rf[0] < f[0]);
      if (!first) REQUIRE(b[0] < sb[0]);
      if (!last) REQUIRE((f[0] < sf[0] && sf[0] < b[0]));  // the activation leaves before the backward
      if (!last) REQUIRE((f[0] < rb[0] && rb[0] < b[0]));
    }
  }
  REQUIRE(max_in_flight_of(list) == expected_in_flight(p, s, m, v));
  REQUIRE(max_in_flight(p, s, m, v) == expected_in_flight(p, s, m, v));
}

// Whole-pipeline checks by simulation. Compute costs: a micro-batch's whole-model forward is 1 and
// backward `b_ratio` (2 by default), so one chunk costs 1/v and b_ratio/v. Returns the simulated
// bubble fraction: idle time / makespan of a stage (all stages are busy equally long).
double check_pipeline(int p, int m, int v, double b_ratio = 2.0) {
  INFO("p=" << p << " m=" << m << " v=" << v << " backward/forward " << b_ratio);
  const auto lists = all_stages(p, m, v);
  size_t sends = 0;
  for (int s = 0; s < p; ++s) {
    check_list(lists[s], p, s, m, v);
    for (const Action& a : lists[s]) sends += sim::is_send(a.kind);
  }
  const double f = 1.0 / v, b = b_ratio / v;
  const sim::Result r = sim::simulate(lists, m, v, f, b);
  INFO(r.error);
  REQUIRE(!r.deadlock);
  REQUIRE(r.error.empty());
  // Each send met exactly one receive (each batch completed only once all its ops met one), and on a
  // link the tags of one iteration are distinct.
  REQUIRE(r.messages.size() == sends);
  std::set<std::tuple<int, int, int>> link_tags;
  for (const auto& msg : r.messages) {
    REQUIRE(msg.tag >= 0);
    REQUIRE(msg.tag < 32767);
    REQUIRE(link_tags.insert({msg.from, msg.to, msg.tag}).second);
  }
  // Data dependencies across virtual stages u = chunk * p + stage, in simulated time.
  const int vs = p * v;
  auto fwd = [&](int u, int mb) { return r.fwd[u % p][u / p][mb]; };
  auto bwd = [&](int u, int mb) { return r.bwd[u % p][u / p][mb]; };
  const double eps = 1e-9;
  for (int mb = 0; mb < m; ++mb) {
    for (int u = 0; u < vs; ++u) {
      INFO("micro-batch " << mb << " virtual stage " << u);
      REQUIRE(fwd(u, mb).start >= 0);
      REQUIRE(bwd(u, mb).start >= 0);
      if (u > 0) REQUIRE(fwd(u, mb).start >= fwd(u - 1, mb).end - eps);
      if (u + 1 < vs) REQUIRE(bwd(u, mb).start >= bwd(u + 1, mb).end - eps);
      if (u + 1 < vs) REQUIRE(bwd(u + 1, mb).start >= fwd(u + 1, mb).end - eps);
    }
    REQUIRE(bwd(vs - 1, mb).start >= fwd(vs - 1, mb).end - eps);
  }
  const double busy = (1 + b_ratio) * m;  // per stage: m*v chunks of (1 + b_ratio)/v
  return (r.makespan - busy) / r.makespan;
}

}  // namespace

TEST_CASE("1F1B list for p=2, m=3 is Megatron's", "[pipeline_schedule]") {
  CHECK(describe(pipeline_schedule(2, 0, 3, 1)) ==
        "F0.0 [SF0.0] F1.0 [SF1.0 RB0.0] B0.0 F2.0 [SF2.0 RB1.0] B1.0 [RB2.0] B2.0");
  CHECK(describe(pipeline_schedule(2, 1, 3, 1)) ==
        "[RF0.0] F0.0 B0.0 [SB0.0 RF1.0] F1.0 B1.0 [SB1.0 RF2.0] F2.0 B2.0 [SB2.0]");
}

TEST_CASE("interleaved list for p=2, v=2, m=2 is Megatron's", "[pipeline_schedule]") {
  // Stage 0 warms up with all 4 steps ((2-0-1)*2 + (2-1)*2 = 4 = m*v); stage 1 with 2.
  CHECK(describe(pipeline_schedule(2, 0, 2, 2)) ==
        "F0.0 [SF0.0] F1.0 [RF0.1 SF1.0] F0.1 [RF1.1 SF0.1] F1.1 [SF1.1] [RB0.1] B0.1 [SB0.1 RB1.1] B1.1 "
        "[SB1.1 RB0.0] B0.0 [RB1.0] B1.0");
  CHECK(describe(pipeline_schedule(2, 1, 2, 2)) ==
        "[RF0.0] F0.0 [RF1.0 SF0.0] F1.0 [RF0.1 SF1.0] F0.1 B0.1 [SB0.1 RF1.1] F1.1 B1.1 [SB1.1 RB0.0] B0.0 "
        "[SB0.0 RB1.0] B1.0 [SB1.0]");
}

TEST_CASE("a single stage is plain gradient accumulation", "[pipeline_schedule]") {
  CHECK(describe(pipeline_schedule(1, 0, 3, 1)) == "F0.0 B0.0 F1.0 B1.0 F2.0 B2.0");
  CHECK(describe(pipeline_schedule(1, 0, 1, 1)) == "F0.0 B0.0");
}

TEST_CASE("interleaved forward order follows Megatron's schedule table", "[pipeline_schedule]") {
  // p=2, v=3, m=4: forward step k is micro-batch (k / 6) * 2 + k % 2 of chunk (k / 2) % 3.
  // Stage 0 warms up with (2-0-1)*2 + (3-1)*2 = 6 forwards, then 1F1B starts with backward step 0
  // (micro-batch 0 of chunk 2) and backward step 1 (micro-batch 1 of chunk 2).
  CHECK(format_schedule(2, 4, 3).substr(0, 58) ==
        "stage 0: F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F2.0 B0.2 F3.0 B1.2");
  const auto list = pipeline_schedule(3, 2, 6, 2);  // last stage: warmup (2-1)*3 = 3
  std::vector<std::string> compute;
  for (const Action& a : list)
    if (!sim::is_comm(a.kind)) compute.push_back(to_string(a));
  const std::vector<std::string> head = {"F0.0", "F1.0", "F2.0", "F0.1", "B0.1", "F1.1", "B1.1", "F2.1", "B2.1",
                                         "F3.0", "B0.0"};
  CHECK(std::vector<std::string>(compute.begin(), compute.begin() + head.size()) == head);
}

TEST_CASE("every schedule is complete, ordered and deadlock-free", "[pipeline_schedule]") {
  for (int p : {1, 2, 3, 4, 8})
    for (int v : {1, 2, 3}) {
      if (v > 1 && p == 1) continue;
      if (v == 1)
        for (int m = 1; m <= 2 * p + 3; ++m) check_pipeline(p, m, v);
      else
        for (int m = p; m <= 4 * p; m += p) check_pipeline(p, m, v);
    }
}

TEST_CASE("in-flight micro-batches meet Megatron's bound exactly", "[pipeline_schedule]") {
  auto per_stage = [](int p, int m, int v) {
    std::vector<int> out;
    for (int s = 0; s < p; ++s) out.push_back(max_in_flight_of(pipeline_schedule(p, s, m, v)));
    return out;
  };
  CHECK(per_stage(4, 8, 1) == std::vector<int>{4, 3, 2, 1});
  CHECK(per_stage(4, 2, 1) == std::vector<int>{2, 2, 2, 1});
  CHECK(per_stage(4, 8, 2) == std::vector<int>{11, 9, 7, 5});  // (3-s)*2 + 4 warmup, + 1
  CHECK(per_stage(2, 2, 3) == std::vector<int>{6, 5});         // stage 0: warmup 2+4 = 6 = m*v, all of them
  CHECK(per_stage(1, 5, 1) == std::vector<int>{1});
}

TEST_CASE("simulated bubble equals (p-1)/(v*m+p-1) where the schedule is ideal", "[pipeline_schedule]") {
  // Ideal means makespan = (m + (p-1)/v) * (forward + backward of a micro-batch). It holds for 1F1B
  // with every m (m < p too: then it is all forwards, then all backwards) and for interleaved with
  // every valid m (a multiple of p, so m >= p), with backward = 2 x forward and backward = forward.
  for (double b_ratio : {2.0, 1.0})
    for (int p : {1, 2, 3, 4, 8})
      for (int v : {1, 2, 3}) {
        if (v > 1 && p == 1) continue;
        for (int m = (v == 1 ? 1 : p); m <= 4 * p; m += (v == 1 ? 1 : p)) {
          INFO("p=" << p << " m=" << m << " v=" << v << " backward/forward " << b_ratio);
          CHECK(std::abs(check_pipeline(p, m, v, b_ratio) - bubble_fraction(p, m, v)) < 1e-9);
        }
      }
  CHECK(bubble_fraction(4, 8, 1) == Approx(3.0 / 11));
  CHECK(bubble_fraction(4, 8, 2) == Approx(3.0 / 19));
  CHECK(bubble_fraction(1, 8, 1) == 0.0);
}

TEST_CASE("peers and tags agree on both sides of a message", "[pipeline_schedule]") {
  // p=4, v=2: stage 3 chunk 0 sends micro-batch 1 forward to stage 0 chunk 1.
  const Action send{ActionKind::SendForward, 1, 0, 0}, recv{ActionKind::RecvForward, 1, 1, 0};
  CHECK(peer_of(send, 4, 3) == 0);
  CHECK(peer_of(recv, 4, 0) == 3);
  CHECK(message_tag(send, 4, 3, 2) == message_tag(recv, 4, 0, 2));
  // Its gradient goes back from stage 0 chunk 1 to stage 3 chunk 0.
  const Action gsend{ActionKind::SendBackward, 1, 1, 0}, grecv{ActionKind::RecvBackward, 1, 0, 0};
  CHECK(peer_of(gsend, 4, 0) == 3);
  CHECK(peer_of(grecv, 4, 3) == 0);
  CHECK(message_tag(gsend, 4, 0, 2) == message_tag(grecv, 4, 3, 2));
  CHECK(message_tag(gsend, 4, 0, 2) != message_tag(send, 4, 3, 2));
  // Inside a chunk: stage 1 -> stage 2.
  const Action s12{ActionKind::SendForward, 3, 1, 0}, r12{ActionKind::RecvForward, 3, 1, 0};
  CHECK(peer_of(s12, 4, 1) == 2);
  CHECK(peer_of(r12, 4, 2) == 1);
  CHECK(message_tag(s12, 4, 1, 2) == message_tag(r12, 4, 2, 2));
  const Action f{ActionKind::Forward, 0, 0, -1};
  CHECK_THROWS_AS(peer_of(f, 4, 0), mt::InternalError);
}

TEST_CASE("format_schedule shows the compute order per stage", "[pipeline_schedule]") {
  CHECK(format_schedule(2, 3, 1) ==
        "stage 0: F0.0 F1.0 B0.0 F2.0 B1.0 B2.0\n"
        "stage 1: F0.0 B0.0 F1.0 B1.0 F2.0 B2.0\n");
}

TEST_CASE("schedule inputs are validated", "[pipeline_schedule]") {
  using Catch::Contains;
  CHECK_THROWS_WITH(pipeline_schedule(4, 0, 6, 2),
                    "the interleaved schedule needs the number of micro-batches (6) to be a multiple of "
                    "parallel.pipeline (4): change training.global_batch_size or micro_batch_size");
  CHECK_THROWS_AS(pipeline_schedule(4, 0, 6, 2), mt::Error);
  CHECK_THROWS_WITH(pipeline_schedule(2, 0, 0, 1), Contains("at least one micro-batch"));
  CHECK_THROWS_WITH(pipeline_schedule(0, 0, 4, 1), Contains("parallel.pipeline (0)"));
  CHECK_THROWS_WITH(pipeline_schedule(2, 0, 4, 0), Contains("parallel.virtual_pipeline (0)"));
  CHECK_THROWS_WITH(pipeline_schedule(1, 0, 4, 2), Contains("needs parallel.pipeline > 1"));
  CHECK_THROWS_WITH(pipeline_schedule(2, 0, 8192, 2), Contains("= 16384 <= 16383"));
  CHECK_THROWS_WITH(bubble_fraction(4, 6, 2), Contains("multiple of parallel.pipeline (4)"));
  CHECK_NOTHROW(pipeline_schedule(2, 1, 16383, 1));
  CHECK_NOTHROW(pipeline_schedule(1, 0, 100000, 1));  // no messages, no tag limit
  CHECK_THROWS_AS(pipeline_schedule(2, 2, 4, 1), mt::InternalError);
}

TEST_CASE("the simulator reports a deadlock", "[pipeline_schedule]") {
  // Stage 0 waits for a gradient before sending the activation it depends on.
  const std::vector<std::vector<Action>> lists = {
      {{ActionKind::Forward, 0, 0, -1}, {ActionKind::RecvBackward, 0, 0, 0}, {ActionKind::SendForward, 0, 0, 1},
       {ActionKind::Backward, 0, 0, -1}},
      {{ActionKind::RecvForward, 0, 0, 0}, {ActionKind::Forward, 0, 0, -1}, {ActionKind::Backward, 0, 0, -1},
       {ActionKind::SendBackward, 0, 0, 1}}};
  const auto r = sim::simulate(lists, 1, 1, 1, 2);
  CHECK(r.deadlock);
  CHECK(r.error == "deadlock: stage 0 waits in [RB0.0]; stage 1 waits in [RF0.0];");
  // The same two messages in one batch each side complete (batch_p2p starts all its transfers).
  const std::vector<std::vector<Action>> ok = {
      {{ActionKind::Forward, 0, 0, -1}, {ActionKind::SendForward, 0, 0, 0}, {ActionKind::RecvBackward, 0, 0, 0},
       {ActionKind::Backward, 0, 0, -1}},
      {{ActionKind::RecvForward, 0, 0, 0}, {ActionKind::Forward, 0, 0, -1}, {ActionKind::Backward, 0, 0, -1},
       {ActionKind::SendBackward, 0, 0, 1}}};
  const auto r2 = sim::simulate(ok, 1, 1, 1, 2);
  CHECK(!r2.deadlock);
  CHECK(r2.makespan == 6.0);  // F 0-1, stage 1 F 1-2 B 2-4, stage 0 B 4-6
}
