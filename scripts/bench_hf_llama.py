#!/usr/bin/env python3
"""Training throughput of Hugging Face transformers' LlamaForCausalLM with a lowbit model
shape, for a side-by-side with `train --device cuda` (tokens/s and peak GPU memory).

Same shape (preset), micro-batch, sequence length and weight dtype; AdamW(fused=True) with
FP32 states; random token ids (throughput does not depend on the text). `--compile` wraps the
model in torch.compile (default mode). FP32 runs use PyTorch's default full-FP32 matmuls.
Prints one JSON row: {"system": "transformers_eager" | "torch_compile", "dtype", "batch", "seq",
"tokens_per_s", "peak_memory_gib", ...}.
`--profile N` profiles N more steps with torch.profiler (CUPTI) after the timed ones and prints
to stderr the CUDA kernels by time per step and the matrix products (aten::mm/addmm/bmm) by
input shape, for comparison with lowbit's kernels (`scripts/ncu_top_kernels.py`).
Usage: python3 scripts/bench_hf_llama.py --preset llama100m --batch 128 --seq 256 --dtype bf16 --steps 15 [--compile] [--tf32] [--profile 2]
"""
import argparse
import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from torch_timing import PRESETS, timed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--preset", default="llama100m", choices=sorted(PRESETS))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "f32"])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--vocab", type=int, default=32100)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--tf32", action="store_true", help="FP32 matmuls with TF32 inputs (allow_tf32)")
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="profile N more steps (tables on stderr)")
    a = ap.parse_args()
    h, i, heads, layers = PRESETS[a.preset]
    cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=h, intermediate_size=i, num_attention_heads=heads,
                      num_key_value_heads=heads, num_hidden_layers=layers, max_position_embeddings=1024,
                      rms_norm_eps=1e-6, tie_word_embeddings=False)
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    torch.backends.cuda.matmul.allow_tf32 = a.tf32
    model = LlamaForCausalLM(cfg).to("cuda", dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)
    fwd = torch.compile(model) if a.compile else model
    x = torch.randint(0, a.vocab, (a.batch, a.seq + 1), device="cuda")

    def step():
        out = fwd(input_ids=x[:, :-1], labels=x[:, 1:].contiguous())
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    secs, peak_gib = timed(step, a.steps)
    print(json.dumps({"system": "transformers_compile" if a.compile else "transformers_eager",
                      "impl": "transformers LlamaForCausalLM", "attn": model.config._attn_implementation,
                      "preset": a.preset, "params": sum(p.numel() for p in model.parameters()),
                      "dtype": a.dtype, "matmul_precision": "tf32" if a.tf32 else "fp32", "batch": a.batch, "seq": a.seq,
                      "tokens_per_s": a.steps * a.batch * a.seq / secs,
                      "peak_memory_gib": peak_gib}))
    if a.profile:
        profile(step, a.profile)


def profile(step, n):
    """Kernels by CUDA time and matrix products by input shape over `n` steps, on stderr."""
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
        for _ in range(n):
            step()
        torch.cuda.synchronize()
    print(f"# torch.profiler over {n} steps (totals; divide by {n} for per step)", file=sys.stderr)
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=40, max_name_column_width=90), file=sys.stderr)
    mm = [e for e in prof.key_averages(group_by_input_shape=True) if e.key in ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul")]
    mm.sort(key=lambda e: -e.device_time_total)
    print("# matrix products by input shape: op, shapes, calls, device ms", file=sys.stderr)
    for e in mm[:40]:
        print(f"{e.key}\t{e.input_shapes}\t{e.count}\t{e.device_time_total / 1e3:.2f}", file=sys.stderr)


if __name__ == "__main__":
    main()
