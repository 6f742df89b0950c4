"""PyTorch SDPA (flash) causal attention timings, bf16, the shapes of test_cuda_attention.cpp's
"[.bench]" case, for the ratio against megatrain's kernels in the same device call.
Usage: python3 benchmarks/kernels/bench_sdpa.py"""
import torch
import torch.nn.functional as F

SHAPES = [(4, 2048, 16, 16, 128), (4, 2048, 32, 8, 128), (8, 1024, 12, 12, 64), (1, 8192, 16, 16, 128)]


def median_ms(fn, reps=20):
    fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


for B, T, H, G, D in SHAPES:
    q = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(B, G, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(B, G, T, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    do = torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        kw = dict(is_causal=True, enable_gqa=G != H)
        fwd = median_ms(lambda: F.scaled_dot_product_attention(q, k, v, **kw))
        o = F.scaled_dot_product_attention(q, k, v, **kw)
        bwd = median_ms(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    flops = 4.0 * B * H * T * T * D / 2
    print(f"BENCH torch sdpa bf16 B={B} T={T} H={H} G={G} D={D}: fwd {fwd:.3f} ms ({flops / fwd * 1e-9:.0f} TFLOP/s), "
          f"bwd {bwd:.3f} ms ({2.5 * flops / bwd * 1e-9:.0f} TFLOP/s)")
