#!/usr/bin/env bash
# Training-step benchmark on one GPU, in one run: lowbit (`train bench training`, fused and
# composed kernels, BF16, BF16-mixed and FP32 models), a plain PyTorch LLaMA (scripts/bench_torch_llama.py,
# eager and torch.compile: the comparator) and transformers' LlamaForCausalLM (eager and
# torch.compile) on the same shape: LLaMA-100M, batch 128 x 256, FP8 states SR + resets for
# lowbit (configs/llama100m_fp8_sr_reset.toml on the bundled text sample).
# Usage (on the GPU machine): scripts/bench_training.sh [TRAIN_BINARY] [OUT_DIR] [WHAT]
#   WHAT: any of lowbit, composed, f32, torch, hf, compile, scales (default: all); torch: the
#   plain PyTorch LLaMA eager and compiled, BF16 and FP32; HF rows: eager BF16, FP32 (full FP32
#   and TF32 matmuls), torch.compile BF16 and FP32; scales: lowbit and the compiled plain
#   PyTorch LLaMA at LLaMA-20M (batch 128) and LLaMA-350M (lowbit at batch 64, the
#   comparator's, and at 128 in micro-batches of 64)
# Writes OUT_DIR/training_rows.jsonl (one JSON row per system and dtype) and prints the table.
set -euo pipefail
BIN=${1:-target/release/train}
OUT=${2:-bench}
WHAT=${3:-lowbit,composed,f32,torch,hf,compile,scales}
mkdir -p "$OUT"
ROWS=$OUT/training_rows.jsonl
DATA=(--set 'data.train=["data/c4-sample/en-train.*.json.gz"]' --set 'data.validation=["data/c4-sample/en-validation.*.json.gz"]')
has() { [[ ",$WHAT," == *",$1,"* ]]; }
echo "# $(date -u +%Y-%m-%d) $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
if has lowbit; then
  "$BIN" bench training --batch 128 --seq 256 --dtype bf16 "${DATA[@]}" --json "$ROWS"
  "$BIN" bench training --batch 128 --micro-batch 64 --seq 256 --dtype bf16 "${DATA[@]}" --json "$ROWS"
  # mixed precision (FP32 weights and update, BF16 products and activations): beside BF16 and FP32
  "$BIN" bench training --batch 128 --seq 256 --dtype bf16-mixed "${DATA[@]}" --json "$ROWS"
fi
if has composed; then
  "$BIN" bench training --batch 128 --micro-batch 64 --seq 256 --dtype bf16 --warmup 2 --steps 4 "${DATA[@]}" --set model.kernels=composed --json "$ROWS"
  "$BIN" bench training --batch 128 --micro-batch 64 --seq 256 --dtype f32 --warmup 1 --steps 2 "${DATA[@]}" --set model.kernels=composed --json "$ROWS"
fi
if has f32; then
  "$BIN" bench training --batch 128 --seq 256 --dtype f32 "${DATA[@]}" --json "$ROWS"
  "$BIN" bench training --batch 128 --seq 256 --dtype f32 "${DATA[@]}" --set model.matmul_precision=tf32 --json "$ROWS"
fi
TORCH="$(dirname "$0")/bench_torch_llama.py"
if has torch; then
  for c in "" --compile; do
    python3 "$TORCH" --preset llama100m --batch 128 --seq 256 --dtype bf16 --steps 15 $c | tee -a "$ROWS"
    python3 "$TORCH" --preset llama100m --batch 128 --seq 256 --dtype f32 --steps 6 $c | tee -a "$ROWS"
  done
fi
if has scales; then
  "$BIN" bench training --preset llama20m --batch 128 --seq 256 --dtype bf16 "${DATA[@]}" --json "$ROWS"
  python3 "$TORCH" --preset llama20m --batch 128 --seq 256 --dtype bf16 --steps 30 --compile | tee -a "$ROWS"
  "$BIN" bench training --preset llama350m --batch 64 --micro-batch 64 --seq 256 --dtype bf16 --warmup 3 --steps 6 "${DATA[@]}" --json "$ROWS"
  "$BIN" bench training --preset llama350m --batch 128 --micro-batch 64 --seq 256 --dtype bf16 --warmup 3 --steps 6 "${DATA[@]}" --json "$ROWS"
  python3 "$TORCH" --preset llama350m --batch 64 --seq 256 --dtype bf16 --steps 10 --compile | tee -a "$ROWS"
fi
HF="$(dirname "$0")/bench_hf_llama.py"
if has hf; then
  python3 "$HF" --preset llama100m --batch 128 --seq 256 --dtype bf16 --steps 15 | tee -a "$ROWS"
  python3 "$HF" --preset llama100m --batch 128 --seq 256 --dtype f32 --steps 10 | tee -a "$ROWS"
  python3 "$HF" --preset llama100m --batch 128 --seq 256 --dtype f32 --steps 10 --tf32 | tee -a "$ROWS"
fi
if has compile; then
  python3 "$HF" --preset llama100m --batch 128 --seq 256 --dtype bf16 --steps 15 --compile | tee -a "$ROWS"
  python3 "$HF" --preset llama100m --batch 128 --seq 256 --dtype f32 --steps 10 --compile | tee -a "$ROWS"
fi
