#include "train/metrics.h"

#include <cmath>
#include <filesystem>

#include "core/check.h"
#include "core/log.h"

namespace mt {

int64_t model_flops_per_token(int64_t n, const ModelConfig& m) {
  return 6 * n + 12 * static_cast<int64_t>(m.num_layers) * m.hidden_size * m.seq_length;
}

MetricsWriter::MetricsWriter(const Config& cfg, const DerivedConfig& d, int64_t fpt, bool gpu, bool write)
    : cfg_(&cfg), d_(&d), flops_per_token_(fpt), gpu_(gpu) {
  const std::string& path = cfg.logging.metrics_file;
  if (!write || path.empty()) return;
  std::filesystem::path p(path);
  if (p.has_parent_path()) std::filesystem::create_directories(p.parent_path());
  file_ = std::fopen(path.c_str(), "a");
  MT_CHECK(file_ != nullptr, "logging.metrics_file: cannot open '", path, "' for appending");
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

namespace {
std::string hms(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) seconds = 0;
  long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%02ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  return buf;
}

// A JSON number, or null where the value is not finite (a skipped iteration's loss or gradient norm):
// the metrics file stays strict JSON, one object per line.
std::string json_number(double v) { return std::isfinite(v) ? fmt::format("{:.17g}", v) : "null"; }
}  // namespace

void MetricsWriter::train(const IterationRecord& r, double mem_gib) {
  const double tok_s = static_cast<double>(d_->tokens_per_iteration) / (r.ms_per_iter / 1e3);
  const double tflops = tok_s * static_cast<double>(flops_per_token_) / d_->world_size / 1e12;
  const double mfu = tflops * 1e12 / kPeakFlopsPerGpu;
  const double eta = (cfg_->training.train_iters - r.iteration) * r.ms_per_iter / 1e3;
  std::string line = fmt::format("iter {}/{} | samples {} | lr {:.3e} | loss {:.6f} | grad norm {:.4f} | {:.1f} ms/iter | {:.0f} tok/s",
                                 r.iteration, cfg_->training.train_iters, r.consumed_samples, r.lr, r.loss,
                                 r.grad_norm, r.ms_per_iter, tok_s);
  if (gpu_) line += fmt::format(" | {:.1f} TFLOP/s/GPU | MFU {:.1f}% | mem {:.2f} GiB", tflops, 100 * mfu, mem_gib);
  if (gpu_ && d_->world_size > 1) line += fmt::format(" | comm exposed {:.1f} ms", r.comm_exposed_ms);
  if (r.skipped) line += fmt::format(" | skipped {}", r.skipped);
  if (d_->precision == Precision::FP16) line += fmt::format(" | loss scale {:g}", r.loss_scale);
  line += " | ETA " + hms(eta);
  log::info("{}", line);
  if (!file_) return;
  std::string json = fmt::format(
      "{{\"iteration\": {}, \"consumed_samples\": {}, \"loss\": {}, \"grad_norm\": {}, \"lr\": {:.9g}, "
      "\"tokens_per_s\": {:.6g}, \"ms_per_iter\": {:.6g}, \"skipped\": {}",
      r.iteration, r.consumed_samples, json_number(r.loss), json_number(r.grad_norm), r.lr, tok_s, r.ms_per_iter,
      r.skipped);
  if (gpu_)
    json += fmt::format(", \"tflops_per_gpu\": {:.6g}, \"mfu\": {:.6g}, \"mem_gib\": {:.6g}, \"comm_exposed_ms\": {:.6g}",
                        tflops, mfu, mem_gib, r.comm_exposed_ms);
  if (d_->precision == Precision::FP16) json += fmt::format(", \"loss_scale\": {:.17g}", r.loss_scale);
  json += "}\n";
  std::fputs(json.c_str(), file_);
  std::fflush(file_);
}

void MetricsWriter::eval(int64_t iteration, double val_loss) {
  log::info("validation at iter {} | val loss {:.6f} | val ppl {:.3f}", iteration, val_loss, std::exp(val_loss));
  if (!file_) return;
  std::fputs(fmt::format("{{\"iteration\": {}, \"val_loss\": {}}}\n", iteration, json_number(val_loss)).c_str(), file_);
  std::fflush(file_);
}

}  // namespace mt
