#!/usr/bin/env bash
# Optimizer benchmark on one GPU, in one run: lowbit's fused step (every format x rounding,
# copy bandwidth, SR/nearest) and PyTorch's fused AdamW on the same shapes.
# Usage (on the GPU machine): scripts/bench_optimizer.sh [TRAIN_BINARY] [OUT.md]
set -euo pipefail
BIN=${1:-target/release/train}
OUT=${2:-bench/optimizer_$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '_' | tr -cd '[:alnum:]_').md}
mkdir -p "$(dirname "$OUT")"
{
  echo "# Optimizer step benchmark"
  echo
  echo "Measured $(date -u +%Y-%m-%d) on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)."
  echo
  "$BIN" bench optimizer --preset llama100m
  echo
  echo "### PyTorch fused AdamW (FP32 states), same shapes"
  echo
  echo '```'
  python3 "$(dirname "$0")/bench_torch_adamw.py" --preset llama100m
  echo '```'
} | tee "$OUT"
