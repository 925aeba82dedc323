#!/usr/bin/env bash
# Exact resume on the GPU with the fused kernels: a fixed-seed run of 10 steps (LLaMA-20M,
# BF16, FP8 states SR + resets, checkpoints at steps 5 and 10), then its step-10 checkpoint
# removed and the run resumed from step 5; the losses and stall rows of steps 6-10 must be
# identical to the uninterrupted run's, bit for bit (they are printed with all digits). The
# rows are read in the default order (shuffled, in memory); further arguments are added to
# both runs, e.g. `--set data.in_memory_max_tokens=0 --set data.shuffle_buffer=500` (the
# streaming shuffle, whose buffer the step-5 checkpoint holds).
# Usage (on the GPU machine): scripts/check_resume_gpu.sh [TRAIN_BINARY] [RUNS_DIR] [--set k=v ...]
set -euo pipefail
BIN=${1:-target/release/train}
DIR=${2:-runs}
ARGS=(--config configs/llama100m_fp8_sr_reset.toml --device cuda --set model.preset=llama20m
  --set train.max_steps=10 --set train.checkpoint_every=5 --set train.keep_checkpoints=3
  --set train.micro_batch=32 --set train.grad_accum=2 --set optim.warmup_steps=3
  --set optim.states.m_reset_every=4 --set optim.states.v_reset_every=4
  --set 'data.train=["data/c4-sample/en-train.*.json.gz"]'
  --set 'data.validation=["data/c4-sample/en-validation.*.json.gz"]'
  --set data.val_tokens=65536 --set run.plots=false --set run.dir="$DIR" --set run.name=resume_gpu "${@:3}")
rm -rf "$DIR/resume_gpu"
"$BIN" "${ARGS[@]}" > /dev/null
cp "$DIR/resume_gpu/metrics.jsonl" "$DIR/straight_metrics.jsonl"
cp "$DIR/resume_gpu/stalls.jsonl" "$DIR/straight_stalls.jsonl"
rm -rf "$DIR/resume_gpu/checkpoints/step_0000010"
"$BIN" --resume "$DIR/resume_gpu" > /dev/null
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
def rows(path, key):
    return {r["step"]: (r[key] if key else r) for r in map(json.loads, open(path))
            if (key is None or key in r) and r["step"] > 5}
ok = True
for name, key in (("metrics", "loss"), ("stalls", None)):
    a = rows(f"{d}/straight_{name}.jsonl", key)
    b = rows(f"{d}/resume_gpu/{name}.jsonl", key)
    same = a == b and len(a) == 5
    ok &= same
    print(f"{name}: steps 6-10 {'identical' if same else 'DIFFER'}")
    if name == "metrics":
        for s in sorted(a):
            print(f"  step {s}: {a[s]!r} / {b.get(s)!r}")
sys.exit(0 if ok else 1)
PY
