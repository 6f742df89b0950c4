// BatchLoader: one producer thread fills a bounded queue with the next `prefetch` iterations'
// micro-batches of this rank; next() pops one iteration. Sample assignment (dataset.h): iteration
// k covers global samples [start + k*G, start + (k+1)*G); micro-batch i of DP rank r holds
// start + k*G + i*M*dp + r*M + [0, M) (Megatron's MegatronPretrainingSampler), so it depends only
// on consumed_samples, never on timing: a loader built with the consumed_samples of a checkpoint
// continues exactly where the saved run was. An exception in the thread (a bad token id, a read
// error) is stored and re-thrown by the next() that would have returned the failed batch.
#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/check.h"
#include "data/dataset.h"

namespace mt::data {

struct BatchLoader::Impl {
  std::shared_ptr<SampleDataset> ds;
  int global_batch = 0, micro_batch = 0, dp_rank = 0, dp_size = 1, num_micro = 0, seq_length = 0;
  int64_t start = 0;
  size_t prefetch = 1;

  std::mutex mu;
  std::condition_variable produced, consumed;
  std::deque<std::vector<MicroBatch>> queue;
  std::exception_ptr error;
  bool stop = false;
  int64_t consumed_iters = 0;
  std::thread worker;

  std::vector<MicroBatch> make(int64_t k) const {
    std::vector<MicroBatch> batch(static_cast<size_t>(num_micro));
    const int L = seq_length;
    std::vector<int32_t> sample(static_cast<size_t>(L) + 1);
    for (int i = 0; i < num_micro; ++i) {
      MicroBatch& mb = batch[static_cast<size_t>(i)];
      mb.first_sample = start + k * global_batch + int64_t{i} * micro_batch * dp_size + int64_t{dp_rank} * micro_batch;
      mb.rows = micro_batch;
      mb.seq_length = L;
      mb.tokens.resize(static_cast<size_t>(micro_batch) * L);
      mb.labels.resize(static_cast<size_t>(micro_batch) * L);
      for (int j = 0; j < micro_batch; ++j) {
        ds->get(mb.first_sample + j, sample.data());
        std::copy(sample.begin(), sample.end() - 1, mb.tokens.begin() + int64_t{j} * L);
        std::copy(sample.begin() + 1, sample.end(), mb.labels.begin() + int64_t{j} * L);
      }
    }
    return batch;
  }

  void run() {
    for (int64_t k = 0;; ++k) {
      {
        std::unique_lock<std::mutex> lock(mu);
        consumed.wait(lock, [&] { return stop || queue.size() < prefetch; });
        if (stop) return;
      }
      std::vector<MicroBatch> batch;
      try {
        batch = make(k);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        error = std::current_exception();
        produced.notify_all();
        return;
      }
      {
        std::lock_guard<std::mutex> lock(mu);
        queue.push_back(std::move(batch));
      }
      produced.notify_all();
    }
  }
};

BatchLoader::BatchLoader(std::shared_ptr<SampleDataset> ds, int global_batch, int micro_batch, int dp_rank,
                         int dp_size, int64_t consumed_samples, int prefetch)
    : impl_(std::make_unique<Impl>()) {
  MT_INTERNAL_ASSERT(ds != nullptr, "BatchLoader without a dataset");
  MT_CHECK(micro_batch > 0 && dp_size > 0 && global_batch > 0 && global_batch % (micro_batch * dp_size) == 0,
           "training.global_batch_size = ", global_batch, " must be a positive multiple of micro_batch_size (",
           micro_batch, ") x data-parallel size (", dp_size, ")");
  MT_INTERNAL_ASSERT(dp_rank >= 0 && dp_rank < dp_size && consumed_samples >= 0, "dp_rank ", dp_rank, " of ",
                     dp_size, ", consumed_samples ", consumed_samples);
  Impl& m = *impl_;
  m.ds = std::move(ds);
  m.global_batch = global_batch;
  m.micro_batch = micro_batch;
  m.dp_rank = dp_rank;
  m.dp_size = dp_size;
  m.num_micro = global_batch / (micro_batch * dp_size);
  m.seq_length = m.ds->seq_length();
  m.start = consumed_samples;
  m.prefetch = static_cast<size_t>(std::max(prefetch, 1));
  m.worker = std::thread([this] { impl_->run(); });
}

BatchLoader::~BatchLoader() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->consumed.notify_all();
  if (impl_->worker.joinable()) impl_->worker.join();
}

std::vector<MicroBatch> BatchLoader::next() {
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.mu);
  m.produced.wait(lock, [&] { return !m.queue.empty() || m.error; });
  if (m.queue.empty()) std::rethrow_exception(m.error);
  std::vector<MicroBatch> batch = std::move(m.queue.front());
  m.queue.pop_front();
  ++m.consumed_iters;
  lock.unlock();
  m.consumed.notify_all();
  return batch;
}

int64_t BatchLoader::consumed_samples() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->start + impl_->consumed_iters * impl_->global_batch;
}

}  // namespace mt::data
