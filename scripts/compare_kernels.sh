#!/usr/bin/env bash
# The fused CUDA kernels against the composed candle ops in training: the same fixed-seed run
# (LLaMA-20M, BF16, FP8 states SR + resets, bundled sample) with model.kernels = fused and
# = composed; prints both loss curves and fails when a loss differs by more than 1e-2.
# Usage (on the GPU machine): scripts/compare_kernels.sh [TRAIN_BINARY] [STEPS] [RUNS_DIR]
set -euo pipefail
BIN=${1:-target/release/train}
STEPS=${2:-20}
DIR=${3:-runs}
for k in fused composed; do
  "$BIN" --config configs/llama100m_fp8_sr_reset.toml --device cuda \
    --set model.preset=llama20m --set model.kernels=$k --set train.max_steps="$STEPS" \
    --set train.micro_batch=32 --set train.grad_accum=1 --set optim.warmup_steps=5 \
    --set 'data.train=["data/c4-sample/en-train.*.json.gz"]' \
    --set 'data.validation=["data/c4-sample/en-validation.*.json.gz"]' \
    --set data.val_tokens=65536 --set train.checkpoint_every=0 --set run.plots=false \
    --set run.dir="$DIR" --set run.name=compare_$k > /dev/null
done
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
loss = {k: [r["loss"] for r in map(json.loads, open(f"{d}/compare_{k}/metrics.jsonl")) if "loss" in r]
        for k in ("fused", "composed")}
diff = max(abs(a - b) for a, b in zip(loss["fused"], loss["composed"]))
print("step | fused | composed")
for i, (a, b) in enumerate(zip(loss["fused"], loss["composed"]), 1):
    print(f"{i} | {a:.4f} | {b:.4f}")
print(f"max |difference| {diff:.2e} over {len(loss['fused'])} steps (limit 1e-2)")
sys.exit(0 if diff <= 1e-2 else 1)
PY
