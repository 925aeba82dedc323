#!/usr/bin/env python3
"""Check that a lowbit checkpoint is a working Hugging Face LLaMA export.

Loads CHECKPOINT_DIR (model.safetensors + config.json, as `train` writes into
runs/NAME/checkpoints/step_NNNNNNN/) with transformers' LlamaForCausalLM.from_pretrained,
computes the mean masked next-token cross-entropy on the token batch in BATCH.json and
compares it with the loss `train` computed on the same batch with the same weights.

BATCH.json is the `export_check.json` that `train` writes into every checkpoint folder
(default when BATCH.json is omitted):
    {"input_ids": [[...], ...], "targets": [[...], ...], "mask": [[1.0, ...], ...],
     "loss": 10.37, "dtype": "float32" | "bfloat16"}

It also checks that config.json carries the tokenizer's special ids (`bos_token_id`,
`eos_token_id`, `pad_token_id`: keys present, eos an integer; T5: null, 1, 0), that
generation stops: with the LM head's EOS row made to dominate, a greedy `generate` of up to
8 new tokens ends after one token, that EOS; and that the folder's tokenizer
(tokenizer.json, tokenizer_config.json, special_tokens_map.json) loads with
AutoTokenizer.from_pretrained, names config.json's EOS, and encodes a text that decodes back
to it (printed).

Exit status: 0 when |loss_hf - loss| <= rtol * |loss| (default rtol 1e-4 for float32
weights, 2e-2 for bfloat16, where the two implementations round activations differently),
generation stops at EOS and the tokenizer round-trips, 1 beyond the tolerance, when
generation does not stop or the tokenizer does not round-trip or names another EOS, 2 when
the checkpoint does not load cleanly (missing, unexpected or mis-shaped tensors, config.json
without the special ids, or no tokenizer AutoTokenizer loads).

Usage:
    python3 scripts/check_hf_export.py runs/NAME/checkpoints/step_0000200 [BATCH.json]
        [--rtol 1e-4] [--device cuda|cpu]
Needs torch and transformers.
"""
import argparse
import json
import math
import os
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="checkpoint folder with model.safetensors and config.json")
    ap.add_argument("batch", nargs="?", help="BATCH.json (default: CHECKPOINT/export_check.json)")
    ap.add_argument("--rtol", type=float, default=None, help="relative tolerance (default by dtype)")
    ap.add_argument("--device", default=None, help="cuda or cpu (default: cuda if available)")
    a = ap.parse_args()

    import torch
    from transformers import LlamaForCausalLM

    batch_path = a.batch or os.path.join(a.checkpoint, "export_check.json")
    with open(batch_path) as f:
        batch = json.load(f)
    for key in ("input_ids", "targets", "mask", "loss"):
        if key not in batch:
            print(f"{batch_path}: missing {key!r}", file=sys.stderr)
            return 2
    ours = batch["loss"]
    if ours is None or not math.isfinite(ours):
        print(f"{batch_path}: the stored loss is not finite ({ours}); nothing to compare", file=sys.stderr)
        return 1
    dtype_name = batch.get("dtype", "float32")
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    rtol = a.rtol if a.rtol is not None else (1e-4 if dtype == torch.float32 else 2e-2)
    device = a.device or ("cuda" if torch.cuda.is_available() else "cpu")

    # Full FP32 matmuls (no TF32), so FP32 weights compare at 1e-4.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")

    model, info = LlamaForCausalLM.from_pretrained(
        a.checkpoint, output_loading_info=True, attn_implementation="eager"
    )
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        print(f"{a.checkpoint}: the checkpoint does not load cleanly: {bad}", file=sys.stderr)
        return 2
    model = model.to(device=device, dtype=dtype).eval()
    with open(os.path.join(a.checkpoint, "config.json")) as f:
        config = json.load(f)
    missing = [k for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k not in config]
    if missing or not isinstance(config.get("eos_token_id"), int):
        print(f"{a.checkpoint}/config.json: special ids missing {missing} or eos_token_id not an "
              f"integer ({config.get('eos_token_id')!r})", file=sys.stderr)
        return 2

    ids = torch.tensor(batch["input_ids"], dtype=torch.long, device=device)
    tgt = torch.tensor(batch["targets"], dtype=torch.long, device=device)
    mask = torch.tensor(batch["mask"], dtype=torch.float32, device=device)
    if ids.shape != tgt.shape or ids.shape != mask.shape:
        print(f"{batch_path}: input_ids {tuple(ids.shape)}, targets {tuple(tgt.shape)} and mask "
              f"{tuple(mask.shape)} differ in shape", file=sys.stderr)
        return 2
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()
        nll = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1), reduction="none"
        )
        m = mask.reshape(-1)
        theirs = float((nll * m).sum() / m.sum().clamp_min(torch.finfo(torch.float32).tiny))

    rel = abs(theirs - ours) / max(abs(ours), 1e-12)
    ok = rel <= rtol
    print(
        f"{a.checkpoint}: transformers loss {theirs:.7f}, train loss {ours:.7f}, "
        f"relative difference {rel:.2e} ({'within' if ok else 'BEYOND'} {rtol:g}; "
        f"{dtype_name} weights, batch {tuple(ids.shape)}, {device})"
    )
    stops = generation_stops_at_eos(torch, model, ids[:1, :4], config["eos_token_id"])
    try:
        round_trips = tokenizer_round_trips(a.checkpoint, config["eos_token_id"])
    except (OSError, ValueError) as e:
        print(f"{a.checkpoint}: AutoTokenizer cannot load the tokenizer: {e}", file=sys.stderr)
        return 2
    return 0 if ok and stops and round_trips else 1


def generation_stops_at_eos(torch, model, prompt, eos: int) -> bool:
    """Greedy `generate` (up to 8 new tokens) after the LM head's EOS row is scaled up and
    its bias-free logit made the largest by copying the final hidden state's direction:
    transformers must take `eos_token_id` from config.json and stop after one token."""
    with torch.no_grad():
        hidden = model.model(input_ids=prompt).last_hidden_state[0, -1].float()
        head = model.lm_head.weight
        head[eos] = (hidden / hidden.norm().clamp_min(1e-6) * 1e4).to(head.dtype)
        out = model.generate(prompt, max_new_tokens=8, do_sample=False)
    new = out[0, prompt.shape[1]:].tolist()
    stops = new == [eos]
    print(f"generate after EOS made the most likely token: new tokens {new} "
          f"({'stops at' if stops else 'does NOT stop at'} eos {eos})")
    return stops


def tokenizer_round_trips(folder: str, eos: int) -> bool:
    """AutoTokenizer.from_pretrained(folder), as a hub upload or lm-eval-harness loads it: its
    EOS must be config.json's `eos`, and a text must encode (without special tokens) to ids
    that decode back to it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    text = "The quick brown fox jumps over the lazy dog, 42 times."
    ids = tok(text, add_special_tokens=False)["input_ids"]
    back = tok.decode(ids)
    ok = back == text and tok.eos_token_id == eos
    print(f"AutoTokenizer: {type(tok).__name__}, eos {tok.eos_token!r} = {tok.eos_token_id} (config.json: {eos}), "
          f"model_max_length {tok.model_max_length}; {text!r} -> {len(ids)} ids {ids[:8]}... -> {back!r} "
          f"({'round-trips' if back == text else 'does NOT round-trip'})")
    return ok


if __name__ == "__main__":
    sys.exit(main())
