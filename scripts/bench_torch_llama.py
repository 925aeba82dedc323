#!/usr/bin/env python3
"""Training throughput of a plain PyTorch LLaMA with a lowbit model shape: the comparator of
`train bench training` (issue 28), eager and under torch.compile.

The model is what a PyTorch user writes for speed (as nanoGPT / torchtitan do): a fused
q/k/v `Linear` and a fused gate/up `Linear`, `F.rms_norm`, RoPE (HF rotate_half),
`F.scaled_dot_product_attention(is_causal=True)` (cuDNN / flash on Hopper), an untied LM head
with its rows padded to a multiple of `--pad-vocab` (64, as llm.c pads its vocabulary and
nanoGPT its 50257 -> 50304; T5's 32100 rows give a 2-byte-aligned row stride that sends the
head's products to slow `align2` kernels) and `F.cross_entropy` over the true vocabulary's
columns as llm.c (the padding never enters the loss; in eager mode the slice's backward
writes a zero-filled gradient of the padded width, which torch.compile fuses away), no
biases; weights in `--dtype`; AdamW(fused=True) with FP32 states,
no gradient clipping; random token ids (throughput does not depend on the text). Same
presets as lowbit (`crates/model/src/config.rs`, T5 vocabulary 32100).

Prints one JSON row: {"system": "torch_eager" | "torch_llama_compile", "dtype", "batch",
"seq", "tokens_per_s", "peak_memory_gib", "mfu", ...}. MFU uses the PaLM convention as
`train bench training` does: 6 * N_matmul + 12 * L * T * d FLOPs per token (the LM head
counts, the embedding lookup does not) against the H200 SXM's dense peak of the products' type,
as `train bench training` (crates/cli/src/bench_training.rs): 989 TFLOP/s BF16, 494 TF32, 67 FP32.
Usage: python3 scripts/bench_torch_llama.py --preset llama100m --batch 128 --seq 256 --dtype bf16 --steps 15 [--compile]
       [--mode reduce-overhead] [--tf32] [--profile 3]  (the top CUDA kernels of 3 more steps on stderr)
`--mode` is torch.compile's: `default`, `reduce-overhead` (the step's kernels replayed as CUDA
graphs: no launch gaps, what a careful user tries for a small model) or
`max-autotune-no-cudagraphs` (Triton GEMM templates autotuned against cuBLAS).
"""
import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

from torch_timing import PRESETS, timed

PEAK = {"bf16": 989e12, "tf32": 494e12, "fp32": 67e12}


class Block(nn.Module):
    def __init__(self, h, inter, heads):
        super().__init__()
        self.heads, self.inter = heads, inter
        self.norm1 = nn.Parameter(torch.ones(h))
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        self.norm2 = nn.Parameter(torch.ones(h))
        self.gate_up = nn.Linear(h, 2 * inter, bias=False)
        self.down = nn.Linear(inter, h, bias=False)

    def forward(self, x, cos, sin):
        b, t, h = x.shape
        d = h // self.heads
        q, k, v = self.qkv(F.rms_norm(x, (h,), self.norm1, 1e-6)).view(b, t, 3, self.heads, d).unbind(2)
        q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        q, k = rope(q, cos, sin), rope(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h)
        x = x + self.o(a)
        g, u = self.gate_up(F.rms_norm(x, (h,), self.norm2, 1e-6)).split(self.inter, dim=-1)
        return x + self.down(F.silu(g) * u)


def rope(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-x2, x1), dim=-1) * sin


class Llama(nn.Module):
    def __init__(self, vocab, h, inter, heads, layers, seq, pad_vocab=1):
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, h)
        self.blocks = nn.ModuleList(Block(h, inter, heads) for _ in range(layers))
        self.norm = nn.Parameter(torch.ones(h))
        self.head = nn.Linear(h, -(-vocab // pad_vocab) * pad_vocab, bias=False)
        d = h // heads
        inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2).float() / d))
        ang = torch.outer(torch.arange(seq).float(), inv)
        ang = torch.cat((ang, ang), dim=-1)
        self.register_buffer("cos", ang.cos(), persistent=False)
        self.register_buffer("sin", ang.sin(), persistent=False)

    def forward(self, ids, targets):
        x = self.embed(ids)
        cos, sin = self.cos.to(x.dtype), self.sin.to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(F.rms_norm(x, (x.shape[-1],), self.norm, 1e-6))[..., : self.vocab]
        return F.cross_entropy(logits.float().reshape(-1, self.vocab), targets.reshape(-1))


def flops_per_token(vocab, h, inter, layers, seq):
    """6 * N_matmul + 12 * L * T * d (PaLM, appendix B), N_matmul: the projections and the LM head."""
    n_matmul = layers * (4 * h * h + 3 * h * inter) + vocab * h
    return 6 * n_matmul + 12 * layers * seq * h


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama100m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--vocab", type=int, default=32100)
    ap.add_argument("--pad-vocab", type=int, default=64,
                    help="the head's rows padded to a multiple of this (1: none, the comparator before 2026-12-06)")
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--mode", default="default",
                    choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune"],
                    help="torch.compile's mode (with --compile)")
    ap.add_argument("--warmup", type=int, default=5,
                    help="untimed steps first (compilation, CUDA graph capture; 3 before 2026-12-06)")
    ap.add_argument("--tf32", action="store_true", help="FP32 matmuls with TF32 inputs (allow_tf32)")
    ap.add_argument("--profile", metavar="STEPS", type=int, default=0,
                    help="after timing, profile STEPS more steps and print the top CUDA kernels to stderr (ms per step)")
    a = ap.parse_args()
    if a.pad_vocab < 1:
        ap.error("--pad-vocab must be >= 1 (1: no padding)")
    h, inter, heads, layers = PRESETS[a.preset]
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    torch.backends.cudnn.allow_tf32 = a.tf32
    torch.manual_seed(0)
    model = Llama(a.vocab, h, inter, heads, layers, a.seq, a.pad_vocab).to("cuda", dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model, mode=a.mode) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")
    ids, targets = x[:, :-1].contiguous(), x[:, 1:].contiguous()

    def step():
        fwd(ids, targets).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    secs, peak_gib = timed(step, a.steps, a.warmup)
    tps = a.steps * a.batch * a.seq / secs
    peak = PEAK["bf16" if a.dtype == "bf16" else "tf32" if a.tf32 else "fp32"]
    print(json.dumps({"system": "torch_llama_compile" if a.compile else "torch_llama_eager",
                      "impl": "plain PyTorch LLaMA (scripts/bench_torch_llama.py)", "preset": a.preset,
                      # the model's parameters: the head's padding rows are not counted
                      "params": sum(p.numel() for p in model.parameters()) - (model.head.weight.shape[0] - a.vocab) * h,
                      "dtype": a.dtype,
                      "compile_mode": a.mode if a.compile else None, "pad_vocab": a.pad_vocab,
                      "matmul_precision": "tf32" if a.tf32 else "fp32", "batch": a.batch, "micro_batch": a.batch,
                      "seq": a.seq, "tokens_per_s": tps, "peak_memory_gib": peak_gib,
                      "mfu": tps * flops_per_token(a.vocab, h, inter, layers, a.seq) / peak}))
    if a.profile:
        profile(step, a.profile)


def profile(step, steps):
    """The top 25 CUDA kernels of `steps` steps by total time, per step, as a markdown table on
    stderr (the JSON row on stdout stays alone there)."""
    import sys
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    rows.sort(key=lambda e: -e.device_time_total)
    total = sum(e.device_time_total for e in rows)
    print(f"| kernel | launches/step | ms/step | share |  (total {total / steps / 1e3:.1f} ms/step)", file=sys.stderr)
    print("|---|---:|---:|---:|", file=sys.stderr)
    for e in rows[:25]:
        print(f"| {e.key[:90]} | {e.count / steps:.0f} | {e.device_time_total / steps / 1e3:.2f} | "
              f"{100 * e.device_time_total / total:.1f}% |", file=sys.stderr)


if __name__ == "__main__":
    main()
