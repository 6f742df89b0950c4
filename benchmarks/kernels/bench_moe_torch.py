#!/usr/bin/env python3
"""The MoE layer of ../shared/reference/torch_moe.py alone (router, softmax top-k, aux loss, sort, gather,
torch._grouped_mm SwiGLU experts, weighted index_add), forward + backward under bf16 autocast at the shapes of
its configs (one micro-batch of 8 x 2048 tokens), eager and torch.compile'd: the per-layer time that
test/cuda/test_cuda_moe_bench.cpp's "BENCH ... moe layer" line compares with.
usage: bench_moe_torch.py REFERENCE_DIR (holding torch_moe.py and torch_gpt.py)"""
import json, sys, time
import torch
sys.path.insert(0, sys.argv[1] if len(sys.argv) > 1 else "../shared/reference")
import torch_moe

def bench(name, compile_):
    c = torch_moe.CONFIGS[name]
    torch.manual_seed(0)
    m = torch_moe.MoE(c).cuda()
    nn = torch.nn
    nn.init.normal_(m.router.weight, std=0.02)
    f = torch.compile(m) if compile_ else m
    x = torch.randn(c["mbs"] * c["seq"], c["hidden"], device="cuda", requires_grad=True)
    g = torch.randn_like(x)
    def step():
        with torch.autocast("cuda", torch.bfloat16):
            y, aux = f(x)
        (y.float() * g).sum().add(aux).backward()
    t0 = time.time()
    for _ in range(3): step()
    torch.cuda.synchronize()
    warm = time.time() - t0
    ts = []
    for _ in range(10):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); step(); b.record(); torch.cuda.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    print(json.dumps(dict(config=name, compiled=compile_, moe_layer_fwd_bwd_ms=round(ts[len(ts) // 2], 3),
                          warm_s=round(warm, 1))), flush=True)

if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    for comp in (False, True):  # eager first (seconds), then compiled
        for name in ("moe-8x-top2", "moe-64x-top8"):
            try: bench(name, comp)
            except Exception as e: print(json.dumps(dict(config=name, compiled=comp, error=str(e)[:300])), flush=True)
