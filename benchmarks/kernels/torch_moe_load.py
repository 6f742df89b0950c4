#!/usr/bin/env python3
"""torch_moe.py's run() (../shared/reference/torch_moe.py, imported, not edited) with the routing load printed:
same model, data, optimizer and timing (its JSON line unchanged), plus, outside the timed window, one eager no-grad
forward of the current batch at iterations 0 (init), 5 (end of warm-up), 25 (end of the timed steps) and 40 (15 more
steps, untimed: megatrain's benchmark times iterations 21-40) that prints, per layer, max / mean tokens per expert
(the same top-k of the same router as the model's forward, recomputed from each MoE module's input by a hook).
usage: torch_moe_load.py CONFIG...  (torch_moe.py found in $TORCH_MOE_DIR, ../ref or ../shared/reference, relative to
the working directory: run_gpu_bench.sh runs its reference from the repository root, so this file can stand in for it)"""
import json, os, sys
for d in (os.environ.get("TORCH_MOE_DIR", ""), "../ref", "../shared/reference"):
    if d and os.path.exists(os.path.join(d, "torch_moe.py")):
        sys.path.insert(0, os.path.abspath(d))
        break
import torch
import torch_moe as R


def loads(m, c, idx):
    out = []
    def hook(mod, inp, _):
        x = inp[0].reshape(-1, inp[0].shape[-1])
        probs = mod.router(x).float().softmax(-1)
        _, top = probs.topk(mod.k, -1)
        cnt = torch.bincount(top.flatten(), minlength=mod.E).float()
        out.append(round((cnt.max() / cnt.mean()).item(), 2))
    hs = [b.moe.register_forward_hook(hook) for b in m.blocks]
    with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
        m(idx[:, :-1], idx[:, 1:])
    for h in hs: h.remove()
    return out


def run(name, steps=20, warm=5, extra=15):
    c = R.CONFIGS[name]; torch.manual_seed(0)
    m = R.MoEGPT(c).cuda()
    N = sum(p.numel() for p in m.parameters())
    expert = sum(b.moe.w13.numel() + b.moe.w2.numel() for b in m.blocks)
    n_active = N - expert + expert * c["topk"] // c["experts"]
    opt = torch.optim.AdamW(m.parameters(), lr=3e-4, fused=True)
    f = torch.compile(m)
    B, T = c["mbs"], c["seq"]
    data = torch.randint(0, c["vocab"], (steps + warm + extra + 1, B, T + 1), device="cuda")
    def step(i):
        with torch.autocast("cuda", torch.bfloat16):
            loss = f(data[i, :, :-1], data[i, :, 1:])
        loss.backward(); torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0); opt.step(); opt.zero_grad(set_to_none=True)
        return loss
    load = {0: loads(m, c, data[0])}
    for i in range(warm): step(i)
    torch.cuda.synchronize()
    load[warm] = loads(m, c, data[warm])
    torch.cuda.reset_peak_memory_stats()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for i in range(warm, warm + steps): loss = step(i)
    e1.record(); torch.cuda.synchronize()
    dt = e0.elapsed_time(e1) / 1000 / steps
    peak = torch.cuda.max_memory_allocated() / 2**30
    load[warm + steps] = loads(m, c, data[warm + steps])
    for i in range(warm + steps, warm + steps + extra): loss2 = step(i)
    load[warm + steps + extra] = loads(m, c, data[warm + steps + extra])
    tok = B * T / dt
    fpt = 6 * n_active + 12 * c["layers"] * c["hidden"] * T
    print(json.dumps(dict(config=name, compiled=True, params_M=round(N / 1e6, 1), active_M=round(n_active / 1e6, 1),
                          step_ms=round(dt * 1e3, 2), tokens_per_s=round(tok), tflops_per_gpu=round(tok * fpt / 1e12, 1),
                          mfu_pct=round(100 * tok * fpt / 1e12 / R.PEAK, 1), peak_mem_GiB=round(peak, 1),
                          loss=round(loss.item(), 3), loss_40=round(loss2.item(), 3),
                          load_max_over_mean={str(k): v for k, v in load.items()})), flush=True)
    del m, opt, f; torch.cuda.empty_cache()


if __name__ == "__main__":
    torch.backends.cuda.matmul.allow_tf32 = True
    for a in sys.argv[1:]: run(a)
