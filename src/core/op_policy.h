// Process-wide choices the ops make (set once by the trainer from the config, read by the backends where
// they pick an algorithm): plain values in the lowest layer, so that the CUDA kernels read them without
// the tensor layer (docs/ARCHITECTURE.md).
#pragma once

#include <cstdint>

namespace mt::ops {

// Determinism policy, process-wide (default on): every op gives bit-identical results run to run. Off lets a
// backend use faster non-deterministic algorithms (CUDA: cuDNN's attention backward accumulating dQ with fp32
// atomics). CPU ops are deterministic either way.
void set_deterministic(bool on);
bool deterministic();

// Attention backend policy, process-wide (training.attention_backend; default Auto). CPU ops always run the
// reference. CUDA: Auto = cuDNN's fused attention for bf16/fp16 where it runs the shape (T % 128 == 0, a graph
// cuDNN builds), else our kernels; Cudnn = cuDNN or an error naming training.attention_backend (fp32, a shape or a
// cuDNN it cannot run); Own = our flash kernels only.
enum class AttentionBackend { Auto, Cudnn, Own };
void set_attention_backend(AttentionBackend backend);
AttentionBackend attention_backend();
// Workspace cap of cuDNN's deterministic attention backward, MiB (training.attention_bwd_workspace_mib, default
// 1024): its B H T Tk 2-byte workspace runs in chunks of the most samples that fit, else KV groups of one sample,
// else single query heads (core/attention_chunks.h).
void set_attention_bwd_workspace_mib(int64_t mib);
int64_t attention_bwd_workspace_mib();

}  // namespace mt::ops
