// A simulator of all p pipeline stages running their action lists (tests only; no model, no MPI).
//
// Each stage runs its list in order. Forward / Backward take f_cost / b_cost time units. A batch
// (adjacent communication actions with one batch id) is posted when the stage reaches it and
// completes, as Communicator::batch_p2p, when every one of its messages has met its counterpart: a
// send meets the first unmatched receive of the peer's currently posted batch that names this stage as
// its peer (peer_of) with the same tag (message_tag), and the other way round. Messages take no time:
// a message completes when the later of its two batches is posted, a batch when its last message
// completes. A state where no stage can move and some have actions left is a deadlock.
//
// The transport only matches peers and tags; the simulator then checks that each matched pair is
// really the same message (activation of micro-batch mb from virtual stage u to u+1, or gradient from
// u to u-1) and reports the first mismatch in `error`.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "core/check.h"
#include "parallel/pipeline_schedule.h"

namespace mt::pp::sim {

struct Span {
  double start = -1, end = -1;  // -1: never ran
};

struct Message {
  int from = 0, to = 0, tag = 0;
  Action send, recv;
};

struct Result {
  bool deadlock = false;
  std::string error;  // deadlock or mismatched message; empty when the run is clean
  double makespan = 0;
  std::vector<std::vector<std::vector<Span>>> fwd, bwd;  // [stage][chunk][microbatch]
  std::vector<Message> messages;                          // in completion order
};

inline bool is_send(ActionKind k) { return k == ActionKind::SendForward || k == ActionKind::SendBackward; }
inline bool is_comm(ActionKind k) { return k != ActionKind::Forward && k != ActionKind::Backward; }

namespace detail {

struct StageState {
  size_t pc = 0;          // next action
  double t = 0;           // local clock
  bool posted = false;    // a batch [pc, end) is posted
  size_t end = 0;
  std::vector<char> matched;       // per op of the posted batch
  std::vector<double> match_time;  // per op
};

inline bool same_message(const Message& msg, int p) {
  const Action &s = msg.send, &r = msg.recv;
  const int su = s.chunk * p + msg.from, ru = r.chunk * p + msg.to;  // virtual stages
  if (s.microbatch != r.microbatch) return false;
  if (s.kind == ActionKind::SendForward) return r.kind == ActionKind::RecvForward && ru == su + 1;
  if (s.kind == ActionKind::SendBackward) return r.kind == ActionKind::RecvBackward && ru == su - 1;
  return false;
}

}  // namespace detail

// lists[s] is stage s's action list; m and v size the timing tables (actions outside them are an error).
inline Result simulate(const std::vector<std::vector<Action>>& lists, int m, int v, double f_cost, double b_cost) {
  const int p = static_cast<int>(lists.size());
  Result res;
  res.fwd.assign(p, std::vector<std::vector<Span>>(v, std::vector<Span>(m)));
  res.bwd = res.fwd;
  std::vector<detail::StageState> st(p);
  auto fail = [&](const std::string& e) {
    if (res.error.empty()) res.error = e;
  };

  // Match op i of stage a's posted batch against stage b's posted batch.
  auto try_match = [&](int a, size_t i) {
    const Action& op = lists[a][st[a].pc + i];
    const int b = peer_of(op, p, a), tag = message_tag(op, p, a, v);
    if (!st[b].posted) return;
    for (size_t j = 0; j < st[b].matched.size(); ++j) {
      const Action& other = lists[b][st[b].pc + j];
      if (st[b].matched[j] || is_send(other.kind) == is_send(op.kind)) continue;
      if (peer_of(other, p, b) != a || message_tag(other, p, b, v) != tag) continue;
      const double t = std::max(st[a].t, st[b].t);
      st[a].matched[i] = st[b].matched[j] = 1;
      st[a].match_time[i] = st[b].match_time[j] = t;
      Message msg = is_send(op.kind) ? Message{a, b, tag, op, other} : Message{b, a, tag, other, op};
      if (!detail::same_message(msg, p))
        fail(str_cat("stage ", msg.from, " ", to_string(msg.send), " met stage ", msg.to, " ", to_string(msg.recv),
                     " (tag ", tag, ")"));
      res.messages.push_back(msg);
      return;
    }
  };

  for (bool progress = true; progress;) {
    progress = false;
    for (int a = 0; a < p; ++a) {
      auto& s = st[a];
      const auto& list = lists[a];
      while (s.pc < list.size()) {
        const Action& act = list[s.pc];
        if (!is_comm(act.kind)) {
          if (act.microbatch < 0 || act.microbatch >= m || act.chunk < 0 || act.chunk >= v) {
            fail(str_cat("stage ", a, ": ", to_string(act), " is out of range"));
            return res;
          }
          const bool fwd = act.kind == ActionKind::Forward;
          const double cost = fwd ? f_cost : b_cost;
          (fwd ? res.fwd : res.bwd)[a][act.chunk][act.microbatch] = Span{s.t, s.t + cost};
          s.t += cost;
          ++s.pc;
          progress = true;
          continue;
        }
        if (!s.posted) {
          s.end = s.pc;
          while (s.end < list.size() && is_comm(list[s.end].kind) && list[s.end].batch == act.batch) ++s.end;
          s.posted = true;
          s.matched.assign(s.end - s.pc, 0);
          s.match_time.assign(s.end - s.pc, 0.0);
          for (size_t i = 0; i < s.matched.size(); ++i) try_match(a, i);
          progress = true;
        }
        if (std::find(s.matched.begin(), s.matched.end(), 0) != s.matched.end()) break;  // wait
        for (double t : s.match_time) s.t = std::max(s.t, t);
        s.pc = s.end;
        s.posted = false;
        s.matched.clear();
        s.match_time.clear();
        progress = true;
      }
    }
  }

  std::string stuck;
  for (int a = 0; a < p; ++a) {
    res.makespan = std::max(res.makespan, st[a].t);
    if (st[a].pc == lists[a].size()) continue;
    stuck += str_cat(" stage ", a, " waits in [");
    for (size_t i = st[a].pc; i < st[a].end; ++i)
      stuck += str_cat(i == st[a].pc ? "" : " ", to_string(lists[a][i]), st[a].matched[i - st[a].pc] ? "(done)" : "");
    stuck += "];";
  }
  if (!stuck.empty()) {
    res.deadlock = true;
    fail("deadlock:" + stuck);
  }
  return res;
}

}  // namespace mt::pp::sim
