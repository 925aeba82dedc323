#!/usr/bin/env bash
# The peak learning rate for LLaMA-20M in a setting near the paper's proportions (issue 50,
# part 1): BF16 model, 128 x 256 tokens per step, 5000 steps (164M tokens: 4.0 passes over
# the ~41M tokens of the two offline corpora, shuffled), warmup 10% and cosine to 10% as the
# paper, AdamW (0.9, 0.999, eps 1e-6), with FP32 states and with the paper's FP8 states
# (E4M3, one amax scale per tensor, zero kept, round-to-nearest), each at every lr given; all
# runs at once on one GPU; validation on the offline corpus's validation shard (~254k tokens,
# the set the h200 tables and issue 49's check use). Prints one line per run: final
# validation loss and passes made.
# Usage (on the GPU machine): scripts/lr_sweep_gpu.sh TRAIN_BINARY RUNS_DIR LR...
#   the token shards of ../shared/data/corpus and corpus-extra in data/local/tok/{corpus,extra}
#   (`train data tokenize`, docs/data.md).
set -euo pipefail
BIN=$1
DIR=$2
shift 2
mkdir -p "$DIR"
common=(--device cuda --set model.preset=llama20m
  --set 'data.train=["data/local/tok/corpus/en-train.*.tokens.zst", "data/local/tok/extra/en-train.*.tokens.zst"]'
  --set 'data.validation=["data/local/tok/corpus/en-validation.*.tokens.zst"]' --set data.val_tokens=250000
  --set train.micro_batch=128 --set train.grad_accum=1
  --set train.max_steps=5000 --set optim.warmup_steps=500 --set train.eval_every=1000
  --set train.checkpoint_every=0 --set run.plots=false --set run.tensorboard=false --set run.dir="$DIR")
pids=()
for lr in "$@"; do
  for cell in fp32_plain fp8_plain; do
    name=${cell}_lr$lr
    "$BIN" --config configs/llama100m_$cell.toml "${common[@]}" --set optim.lr=$lr --set run.name=$name \
      > "$DIR/$name.out" 2> "$DIR/$name.err" &
    pids+=($!)
  done
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
for s in "$DIR"/*/summary.json; do
  python3 -c "import json,sys; s=json.load(open(sys.argv[1])); print(f\"{sys.argv[1].split('/')[-2]}: final validation loss {s['final_val_loss']:.4f}, {s['epochs']:.2f} passes of {s['tokens_per_epoch']} tokens, {s['tokens_per_s']:.0f} tokens/s\")" "$s"
done
exit $status
