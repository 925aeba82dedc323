#!/usr/bin/env bash
# Data-parallel throughput, 1 GPU against 2 (NCCL), at the same per-GPU micro-batch:
# LLaMA-100M, BF16 model, FP8 states SR + resets (configs/llama100m_fp8_sr_reset.toml on the
# bundled text sample), micro-batch 128 x 256 per GPU, 30 steps; tokens/s is the median of
# steps 6-30 (all ranks' tokens); peak memory and optimizer state bytes are rank 0's
# (summary.json: `peak_memory_bytes`, `state_bytes_per_rank`, its shard with ZeRO-1).
# Usage (on a 2-GPU machine): scripts/bench_data_parallel.sh [TRAIN_BINARY] [OUT_JSON] [ZEROS]
#   ZEROS: the train.zero settings to run with 2 GPUs (default "0 1")
set -euo pipefail
BIN=${1:-target/release/train}
OUT=${2:-bench/data_parallel_h200x2.json}
ZEROS=${3:-0 1}
DIR=$(mktemp -d)
ARGS=(--config configs/llama100m_fp8_sr_reset.toml --device cuda --set train.max_steps=30
  --set train.micro_batch=128 --set train.checkpoint_every=0
  --set optim.warmup_steps=5 --set data.val_tokens=32768 --set run.plots=false --set run.dir="$DIR"
  --set 'data.train=["data/c4-sample/en-train.*.json.gz"]'
  --set 'data.validation=["data/c4-sample/en-validation.*.json.gz"]')
# grad_accum = GPUs: one micro-batch of 128 per GPU and step (the global batch is
# micro_batch x grad_accum whatever the GPU count)
"$BIN" "${ARGS[@]}" --set train.grad_accum=1 --set run.name=g1z0 > /dev/null
for z in $ZEROS; do
  "$BIN" "${ARGS[@]}" --set train.grad_accum=2 --set train.zero="$z" --set run.name="g2z$z" --gpus 2 > /dev/null
done
python3 - "$DIR" "$OUT" <<'PY'
import json, os, statistics, sys
d, out = sys.argv[1:]
rows = []
for run in sorted(os.listdir(d)):
    gpus, zero = int(run[1]), int(run[3])
    s = json.load(open(f"{d}/{run}/summary.json"))
    tps = [r["tokens_per_s"] for r in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "tokens_per_s" in r and r["step"] > 5]
    state = s["state_bytes_per_rank"]
    rows.append({"gpus": gpus, "zero": zero, "tokens_per_s": round(statistics.median(tps)),
                 "optimizer_state_bytes_per_gpu": state, "peak_memory_gib": round(s["peak_memory_bytes"] / 2**30, 2)})
one = rows[0]["tokens_per_s"]
for r in rows:
    print(f"gpus {r['gpus']} zero {r['zero']}: {r['tokens_per_s']:,} tokens/s ({r['tokens_per_s'] / one:.2f}x), "
          f"states {r['optimizer_state_bytes_per_gpu']:,} B/GPU, peak {r['peak_memory_gib']} GiB")
json.dump(rows, open(out, "w"), indent=1)
PY
