#include "train/metrics.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "config/config_validate_moe.h"
#include "core/check.h"
#include "core/log.h"
#include "model/moe/moe_options.h"

namespace mt {

int64_t model_flops_per_token(int64_t n, const ModelConfig& m, const DerivedConfig& d) {
  const int64_t attention_width = static_cast<int64_t>(m.num_attention_heads) * d.head_dim;  // hidden unless kv_channels
  return 6 * (n + active_expert_params(m)) + 12 * static_cast<int64_t>(m.num_layers) * attention_width * m.seq_length;
}

bool is_expert_param(const std::string& name) { return name.find(".mlp.experts.") != std::string::npos; }

int64_t expert_params(const ModelConfig& m) {
  const int64_t C = m.hidden_size, F = m.moe_ffn_hidden_size;
  return C * F * (moe_options(m).swiglu ? 3 : 2);
}

int64_t active_expert_params(const ModelConfig& m) {
  int64_t layers = 0;
  for (int i = 0; i < m.num_layers; ++i) layers += is_moe_layer(m, i) ? 1 : 0;
  return layers * m.moe_router_topk * expert_params(m);
}

MetricsWriter::MetricsWriter(const Config& cfg, const DerivedConfig& d, int64_t fpt, bool gpu, bool write)
    : cfg_(&cfg), d_(&d), flops_per_token_(fpt), gpu_(gpu), write_(write) {
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
  // MoE: the worst layer's load (busiest expert / mean), the layers' mean aux and z losses, the dropped share
  double moe_load = 0, moe_aux = 0, moe_z = 0;
  int64_t moe_dropped = 0, moe_slots = 0;
  for (const MoELayerMetrics& m : r.moe) {
    moe_load = std::max(moe_load, m.load());
    moe_aux += m.aux_loss / static_cast<double>(r.moe.size());
    moe_z += m.z_loss / static_cast<double>(r.moe.size());
    moe_dropped += m.dropped;
    moe_slots += m.slots;
  }
  const bool capacity = cfg_->model.moe_expert_capacity_factor > 0;
  const double dropped_share = moe_slots > 0 ? static_cast<double>(moe_dropped) / static_cast<double>(moe_slots) : 0.0;
  if (!r.moe.empty()) {
    line += fmt::format(" | moe: load max/mean {:.2f}", moe_load);
    if (cfg_->model.moe_aux_loss_coeff > 0 && cfg_->model.moe_router_load_balancing_type != "none")
      line += fmt::format(" aux {:.4g}", moe_aux);
    if (cfg_->model.moe_z_loss_coeff > 0) line += fmt::format(" z {:.4g}", moe_z);
    if (capacity) line += fmt::format(" dropped {:.2f}%", 100 * dropped_share);
  }
  line += " | ETA " + hms(eta);
  log::info("{}", line);
  if (tb_) {
    Scalars sc = {{"lm loss", r.loss},
                  {"learning-rate", r.lr},
                  {"grad-norm", r.grad_norm},
                  {"consumed-samples", static_cast<double>(r.consumed_samples)},
                  {"iteration-time", r.ms_per_iter / 1e3},
                  {"tokens-per-sec", tok_s},
                  {"skipped-iterations", static_cast<double>(r.skipped)}};
    if (gpu_) {
      sc.insert(sc.end(), {{"throughput", tflops}, {"mfu", mfu}, {"mem-max-allocated-bytes", mem_gib * (1 << 30)}});
      if (d_->world_size > 1) sc.emplace_back("comm-exposed-ms", r.comm_exposed_ms);
    }
    if (d_->precision == Precision::FP16) sc.emplace_back("loss-scale", r.loss_scale);
    if (!r.moe.empty()) {
      sc.insert(sc.end(), {{"moe/load-max-mean", moe_load}, {"moe/aux-loss", moe_aux}, {"moe/z-loss", moe_z}});
      if (capacity) sc.emplace_back("moe/dropped-share", dropped_share);
      for (const MoELayerMetrics& m : r.moe) sc.emplace_back(fmt::format("moe/layer{}/load-max-mean", m.layer), m.load());
    }
    tb_->add_scalars(r.iteration, sc);
  }
  if (!file_ || !first_record(Kind::Train, r.iteration)) return;
  std::string json = fmt::format(
      "{{\"iteration\": {}, \"consumed_samples\": {}, \"loss\": {}, \"grad_norm\": {}, \"lr\": {:.9g}, "
      "\"tokens_per_s\": {:.6g}, \"ms_per_iter\": {:.6g}, \"skipped\": {}",
      r.iteration, r.consumed_samples, json_number(r.loss), json_number(r.grad_norm), r.lr, tok_s, r.ms_per_iter,
      r.skipped);
  if (gpu_)
    json += fmt::format(", \"tflops_per_gpu\": {:.6g}, \"mfu\": {:.6g}, \"mem_gib\": {:.6g}, "
                        "\"comm_exposed_ms\": {:.6g}, \"cuda_mallocs\": {}",
                        tflops, mfu, mem_gib, r.comm_exposed_ms, r.cuda_mallocs);
  if (d_->precision == Precision::FP16) json += fmt::format(", \"loss_scale\": {:.17g}", r.loss_scale);
  if (!r.moe.empty()) {
    json += fmt::format(", \"moe_load_max_mean\": {}, \"moe_aux_loss\": {}, \"moe_z_loss\": {}, \"moe_dropped\": {}, "
                        "\"moe_layers\": [",
                        json_number(moe_load), json_number(moe_aux), json_number(moe_z), moe_dropped);
    for (size_t i = 0; i < r.moe.size(); ++i) {
      const MoELayerMetrics& m = r.moe[i];
      json += fmt::format("{}{{\"layer\": {}, \"tokens_max\": {}, \"tokens_mean\": {}, \"load_max_mean\": {}, "
                          "\"dropped\": {}, \"aux_loss\": {}, \"z_loss\": {}}}",
                          i ? ", " : "", m.layer, json_number(m.tokens_max), json_number(m.tokens_mean),
                          json_number(m.load()), m.dropped, json_number(m.aux_loss), json_number(m.z_loss));
    }
    json += "]";
  }
  json += "}\n";
  std::fputs(json.c_str(), file_);
  std::fflush(file_);
}

void MetricsWriter::eval(int64_t iteration, double val_loss) {
  log::info("validation at iter {} | val loss {:.6f} | val ppl {:.3f}", iteration, val_loss, std::exp(val_loss));
  note_val(iteration, val_loss);
  if (tb_) tb_->add_scalars(iteration, {{"lm loss validation", val_loss}, {"lm loss validation ppl", std::exp(val_loss)}});
  if (!file_ || !first_record(Kind::Val, iteration)) return;
  std::fputs(fmt::format("{{\"iteration\": {}, \"val_loss\": {}}}\n", iteration, json_number(val_loss)).c_str(), file_);
  std::fflush(file_);
}

void MetricsWriter::test(int64_t iteration, double test_loss) {
  log::info("test at iter {} | test loss {:.6f} | test ppl {:.3f}", iteration, test_loss, std::exp(test_loss));
  if (tb_) tb_->add_scalars(iteration, {{"lm loss test", test_loss}, {"lm loss test ppl", std::exp(test_loss)}});
  if (!file_ || !first_record(Kind::Test, iteration)) return;
  std::fputs(fmt::format("{{\"iteration\": {}, \"test_loss\": {}}}\n", iteration, json_number(test_loss)).c_str(), file_);
  std::fflush(file_);
}

void MetricsWriter::add_scalars(int64_t step, const Scalars& scalars) {
  if (tb_) tb_->add_scalars(step, scalars);
}

bool MetricsWriter::first_record(Kind kind, int64_t iteration) { return written_.insert({kind, iteration}).second; }

void MetricsWriter::note_val(int64_t iteration, double val_loss) {
  if (std::isfinite(val_loss) && (best_val_.first < 0 || val_loss < best_val_.second)) best_val_ = {iteration, val_loss};
}

void MetricsWriter::start(int64_t iteration, bool keep_later) {
  if (!write_) return;
  // keep_later: no event file, whose SessionLog START at iteration + 1 would make TensorBoard drop the run's later steps.
  if (!cfg_->logging.tensorboard_dir.empty() && keep_later)
    log::info("logging.tensorboard_dir: no events written by training.skip_train (the log and the metrics file "
              "have the losses)");
  if (!cfg_->logging.tensorboard_dir.empty() && !keep_later) {
    tb_ = std::make_unique<TensorBoardWriter>(cfg_->logging.tensorboard_dir, iteration + 1);
    log::info("TensorBoard event file: {}", tb_->path());
  }
  if (!file_) return;
  // Keep the records up to `iteration`, one per (kind, iteration); drop the rest.
  const std::string& path = cfg_->logging.metrics_file;
  std::fclose(file_);
  file_ = nullptr;
  std::vector<std::string> kept;
  int64_t dropped = 0;
  {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      const bool ok = j.is_object() && j.contains("iteration") && j["iteration"].is_number_integer();
      const int64_t it = ok ? j["iteration"].get<int64_t>() : -1;
      const Kind kind = j.contains("val_loss") ? Kind::Val : j.contains("test_loss") ? Kind::Test : Kind::Train;
      if (!ok || (it > iteration && !keep_later) || !first_record(kind, it)) {
        ++dropped;  // unreadable (cut by a crash), past the start, or a duplicate
        continue;
      }
      if (kind == Kind::Val && j["val_loss"].is_number()) note_val(it, j["val_loss"].get<double>());
      kept.push_back(line);
    }
  }
  if (dropped > 0 && !keep_later) {
    const std::string tmp = path + ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      for (const std::string& l : kept) out << l << '\n';
      MT_CHECK(out.good(), "logging.metrics_file: cannot write '", tmp, "'");
    }
    std::filesystem::rename(tmp, path);
    log::warn("logging.metrics_file {}: removed {} record(s) past iteration {} or repeated (this run starts at "
              "iteration {}; {} record(s) kept)",
              path, dropped, iteration, iteration + 1, kept.size());
  }
  file_ = std::fopen(path.c_str(), "a");
  MT_CHECK(file_ != nullptr, "logging.metrics_file: cannot open '", path, "' for appending");
}

void log_run_summary(const RunSummary& s) {
  const int64_t ran = s.last_iteration - s.first_iteration;
  log::info("run summary: {} | iteration {}/{} ({} in this run) | wall time {} | {} tokens in this run, {} in all",
            s.how_ended, s.last_iteration, s.train_iters, ran, hms(s.wall_seconds), s.tokens_this_run, s.tokens_total);
  std::string losses = ran > 0 ? fmt::format("last train loss {:.6f}", s.last_loss) : "no training step in this run";
  losses += s.best_val.first >= 0
                ? fmt::format(" | best validation loss {:.6f} at iteration {}", s.best_val.second, s.best_val.first)
                : " | no validation loss";
  if (s.has_test) losses += fmt::format(" | test loss {:.6f}", s.test_loss);
  log::info("run summary: {}", losses);
  log::info("run summary: last checkpoint {}", s.last_checkpoint.empty() ? "none (checkpoint.dir is \"\")" : s.last_checkpoint);
}

}  // namespace mt
