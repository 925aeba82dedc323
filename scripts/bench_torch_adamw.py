#!/usr/bin/env python3
"""Time PyTorch's fused AdamW (FP32 states) on the parameter shapes of a LLaMA preset.

The baseline for `train bench optimizer`: same shapes, same device, FP32 or BF16 weights,
FP32 m and v (torch.optim.AdamW(fused=True)). Prints one JSON line per weight dtype.
Usage: python3 scripts/bench_torch_adamw.py [--preset llama100m] [--iters 20]
"""
import argparse
import json
import time

import torch

PRESETS = {  # hidden, intermediate, layers (docs/numerics.md / GaLore C4 configs)
    "llama60m": (512, 1376, 8),
    "llama100m": (640, 1708, 12),
    "llama130m": (768, 2048, 12),
    "llama350m": (1024, 2736, 24),
}


def shapes(preset, vocab=32100):
    h, i, layers = PRESETS[preset]
    out = [(vocab, h)]
    for _ in range(layers):
        out += [(h, h)] * 4 + [(i, h), (i, h), (h, i), (h,), (h,)]
    return out + [(h,), (vocab, h)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama100m", choices=sorted(PRESETS))
    ap.add_argument("--iters", type=int, default=20, help="steps per timed window (median of 7 windows)")
    a = ap.parse_args()
    for dtype in (torch.float32, torch.bfloat16):
        params = [torch.nn.Parameter(torch.randn(s, device="cuda", dtype=dtype) * 0.02) for s in shapes(a.preset)]
        for p in params:
            p.grad = torch.randn_like(p) * 1e-3
        opt = torch.optim.AdamW(params, lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, fused=True)
        for _ in range(3):
            opt.step()
        windows = []
        for _ in range(7):  # as `train bench optimizer`: median of 7 windows
            torch.cuda.synchronize()
            t = time.perf_counter()
            for _ in range(a.iters):
                opt.step()
            torch.cuda.synchronize()
            windows.append((time.perf_counter() - t) / a.iters)
        secs = sorted(windows)[3]
        n = sum(p.numel() for p in params)
        wb = 4 if dtype == torch.float32 else 2
        moved = n * (2 * wb + wb + 16)  # weights r/w, grad (weight dtype) read, m and v FP32 r/w
        print(json.dumps({"impl": "torch.optim.AdamW(fused=True)", "torch": torch.__version__, "preset": a.preset,
                          "params": n, "weights": str(dtype).replace("torch.", ""), "states": "fp32",
                          "step_ms": secs * 1e3, "gb_per_s": moved / secs / 1e9}))


if __name__ == "__main__":
    main()
