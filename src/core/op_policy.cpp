#include "core/op_policy.h"

#include <atomic>

#include "core/check.h"

namespace mt::ops {

namespace {
std::atomic<bool> g_deterministic{true};
std::atomic<AttentionBackend> g_attention_backend{AttentionBackend::Auto};
std::atomic<int64_t> g_attention_bwd_workspace_mib{1024};
}  // namespace

void set_deterministic(bool on) { g_deterministic = on; }  // read by the backends where they choose

bool deterministic() { return g_deterministic; }

void set_attention_backend(AttentionBackend backend) { g_attention_backend = backend; }

AttentionBackend attention_backend() { return g_attention_backend; }

void set_attention_bwd_workspace_mib(int64_t mib) {
  MT_CHECK(mib >= 1, "training.attention_bwd_workspace_mib must be >= 1, got ", mib);
  g_attention_bwd_workspace_mib = mib;
}

int64_t attention_bwd_workspace_mib() { return g_attention_bwd_workspace_mib; }

}  // namespace mt::ops
