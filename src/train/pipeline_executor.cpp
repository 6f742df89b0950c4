#include "train/pipeline_executor.h"

#include <map>
#include <memory>
#include <utility>

#include "parallel/pipeline_schedule.h"
#include "tensor/scalar_read.h"

namespace mt {

namespace {
using Key = std::pair<int, int>;  // (micro-batch, chunk)

StepContext step_for(const data::MicroBatch& mb, uint64_t seed, bool training) {
  StepContext s;
  s.training = training;
  s.dropout_seed = seed;
  s.first_sample = mb.first_sample;
  return s;
}
}  // namespace

PipelineExecutor::PipelineExecutor(std::vector<const GPTModel*> chunks, const ModelContext& ctx)
    : chunks_(std::move(chunks)), ctx_(&ctx) {}

bool PipelineExecutor::first_virtual(int chunk) const { return chunk == 0 && ctx_->ps->pp_rank == 0; }
bool PipelineExecutor::last_virtual(int chunk) const {
  return chunk == static_cast<int>(chunks_.size()) - 1 && ctx_->ps->pp_rank == ctx_->ps->pp_size - 1;
}

Tensor PipelineExecutor::activation_buffer(const data::MicroBatch& mb) const {
  const ParallelState& ps = *ctx_->ps;
  int64_t rows = static_cast<int64_t>(mb.rows) * mb.seq_length;
  if (ps.sequence_parallel) rows /= ps.tp_size;
  return ctx_->empty({rows, ctx_->model->hidden_size});
}

Tensor PipelineExecutor::train(const std::vector<data::MicroBatch>& mbs, uint64_t seed, double dloss) {
  const ParallelState& ps = *ctx_->ps;
  const int p = ps.pp_size, s = ps.pp_rank, v = static_cast<int>(chunks_.size());
  const std::vector<pp::Action> actions = pp::pipeline_schedule(p, s, static_cast<int>(mbs.size()), v);
  std::map<Key, GPTModel::MicroState> states;
  std::map<Key, Tensor> act_in, act_out, grad_in, grad_out;
  std::map<Key, std::shared_ptr<Work>> arriving;  // receives in flight, by the key they fill
  // Sends of the last batch: the tensors stay alive until their transfer is waited for.
  std::vector<std::pair<std::shared_ptr<Work>, Tensor>> sending;
  auto take = [&](std::map<Key, Tensor>& from, const Key& key) {
    if (auto w = arriving.find(key); w != arriving.end()) {
      w->second->wait();
      arriving.erase(w);
    }
    Tensor t = from.at(key);
    from.erase(key);
    return t;
  };
  auto drain_sends = [&] {
    for (auto& s : sending) s.first->wait();
    sending.clear();
  };
  // The summed token losses stay on the device until the iteration is done: no micro-batch waits for the device.
  Tensor loss = Tensor::zeros({1}, DType::F64, ctx_->device);
  for (size_t i = 0; i < actions.size();) {
    const pp::Action& a = actions[i];
    const Key key{a.microbatch, a.chunk};
    const data::MicroBatch& mb = mbs[a.microbatch];
    const StepContext step = step_for(mb, seed, true);
    if (a.kind == pp::ActionKind::Forward) {
      Tensor in;
      if (!first_virtual(a.chunk)) in = take(act_in, key);
      Tensor out = chunks_[a.chunk]->forward(states[key], mb.tokens.data(), mb.labels.data(), mb.rows, mb.seq_length,
                                            in, step, &loss);
      if (!last_virtual(a.chunk)) act_out[key] = out;
      ++i;
      continue;
    }
    if (a.kind == pp::ActionKind::Backward) {
      Tensor dout;
      if (!last_virtual(a.chunk)) dout = take(grad_in, key);
      Tensor dx = chunks_[a.chunk]->backward(states[key], dout, dloss, step);
      states.erase(key);
      if (!first_virtual(a.chunk)) grad_out[key] = dx;
      ++i;
      continue;
    }
    // A batch of sends and receives, issued together.
    std::vector<P2POp> ops;
    std::vector<std::pair<std::map<Key, Tensor>*, Key>> sent;
    std::vector<Key> received;
    for (; i < actions.size() && actions[i].batch == a.batch && actions[i].batch >= 0; ++i) {
      const pp::Action& c = actions[i];
      const Key k{c.microbatch, c.chunk};
      const int peer = pp::peer_of(c, p, s), tag = pp::message_tag(c, p, s, v);
      switch (c.kind) {
        case pp::ActionKind::SendForward:
          ops.push_back({P2POp::Kind::Send, &act_out.at(k), peer, tag});
          sent.push_back({&act_out, k});
          break;
        case pp::ActionKind::SendBackward:
          ops.push_back({P2POp::Kind::Send, &grad_out.at(k), peer, tag});
          sent.push_back({&grad_out, k});
          break;
        case pp::ActionKind::RecvForward:
          act_in[k] = activation_buffer(mbs[c.microbatch]);
          ops.push_back({P2POp::Kind::Recv, &act_in[k], peer, tag});
          received.push_back(k);
          break;
        case pp::ActionKind::RecvBackward:
          grad_in[k] = activation_buffer(mbs[c.microbatch]);
          ops.push_back({P2POp::Kind::Recv, &grad_in[k], peer, tag});
          received.push_back(k);
          break;
        default: MT_INTERNAL_ASSERT(false, "compute action inside a communication batch");
      }
    }
    MT_INTERNAL_ASSERT(!ops.empty(), "empty communication batch");
    drain_sends();
    std::shared_ptr<Work> work = ps.pp->batch_p2p_async(ops);
    for (const Key& k : received) arriving[k] = work;
    for (auto& [map, k] : sent) {
      sending.emplace_back(work, map->at(k));
      map->erase(k);
    }
  }
  drain_sends();
  MT_INTERNAL_ASSERT(states.empty() && act_in.empty() && grad_in.empty() && arriving.empty(),
                     "pipeline schedule left work behind");
  return loss;
}

double PipelineExecutor::evaluate(const std::vector<data::MicroBatch>& mbs) {
  const ParallelState& ps = *ctx_->ps;
  const int p = ps.pp_size, s = ps.pp_rank, v = static_cast<int>(chunks_.size());
  Tensor loss = Tensor::zeros({1}, DType::F64, ctx_->device);
  for (size_t m = 0; m < mbs.size(); ++m) {
    const StepContext step = step_for(mbs[m], 0, false);
    for (int c = 0; c < v; ++c) {
      const int mi = static_cast<int>(m);
      Tensor in;
      if (!first_virtual(c)) {
        in = activation_buffer(mbs[m]);
        pp::Action r{pp::ActionKind::RecvForward, mi, c, 0};
        ps.pp->batch_p2p({{P2POp::Kind::Recv, &in, pp::peer_of(r, p, s), pp::message_tag(r, p, s, v)}});
      }
      GPTModel::MicroState st;
      Tensor out = chunks_[c]->forward(st, mbs[m].tokens.data(), mbs[m].labels.data(), mbs[m].rows,
                                       mbs[m].seq_length, in, step, &loss);
      if (!last_virtual(c)) {
        pp::Action snd{pp::ActionKind::SendForward, mi, c, 0};
        ps.pp->batch_p2p({{P2POp::Kind::Send, &out, pp::peer_of(snd, p, s), pp::message_tag(snd, p, s, v)}});
      }
    }
  }
  return read_scalars({loss})[0];  // waits for the device
}

}  // namespace mt
