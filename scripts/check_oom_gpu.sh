#!/usr/bin/env bash
# The GPU out of memory (issue 53), on the GPU machine:
# 1. at start: a micro-batch whose activations exceed the device's free memory is refused before
#    anything is written (exit 1, the GiB, "lower train.micro_batch", no run folder);
# 2. mid-run: once a LLaMA-20M run (fused kernels) has written its step-100 checkpoint, another
#    process takes every free byte of the GPU (PyTorch, in chunks); the run must stop with exit 1
#    and "The GPU ran out of memory ... train --resume", or, if it holds all it needs, go on;
#    either way, with the memory given back, `train --resume` finishes the run and its last
#    steps' losses equal an uninterrupted run's bit for bit.
# Usage: scripts/check_oom_gpu.sh [TRAIN_BINARY] [RUNS_DIR]; exit 0 when every check holds.
set -uo pipefail
BIN=${1:-target/release/train}
DIR=${2:-runs}
ARGS=(--config configs/llama100m_fp8_sr_reset.toml --device cuda --set model.preset=llama20m
  --set train.max_steps=1500 --set train.checkpoint_every=100 --set train.keep_checkpoints=20
  --set train.micro_batch=32 --set optim.warmup_steps=10
  --set 'data.train=["data/c4-sample/en-train.*.json.gz"]'
  --set 'data.validation=["data/c4-sample/en-validation.*.json.gz"]'
  --set data.val_tokens=65536 --set run.plots=false --set run.dir="$DIR")
fail() {
  echo "FAIL: $*"
  exit 1
}
rm -rf "$DIR"/oom_start "$DIR"/oom_ref "$DIR"/oom_mid /tmp/oom_go /tmp/oom_ready

out=$("$BIN" "${ARGS[@]}" --set train.micro_batch=1000000 --set run.name=oom_start 2>&1)
rc=$?
[ "$rc" -eq 1 ] || fail "oversize micro-batch: exit $rc, expected 1: $out"
grep -q "lower train.micro_batch" <<<"$out" || fail "oversize micro-batch: no way on: $out"
[ ! -e "$DIR/oom_start" ] || fail "oversize micro-batch: a run folder was made"
echo "at start: exit 1, no run folder: $(grep -o 'this config needs.*' <<<"$out" | head -1)"

"$BIN" "${ARGS[@]}" --set run.name=oom_ref > /dev/null 2>&1 || fail "the reference run failed"

# The hog: CUDA ready before the run starts, takes everything free when /tmp/oom_go appears.
python3 - <<'PY' &
import os, time, torch
torch.cuda.init(); torch.empty(1, device="cuda")
open("/tmp/oom_ready", "w").close()
while not os.path.exists("/tmp/oom_go"):
    time.sleep(0.001)
held, chunk = [], 1 << 30
while chunk >= 1 << 20:
    try:
        held.append(torch.empty(chunk, dtype=torch.uint8, device="cuda"))
    except torch.OutOfMemoryError:
        chunk //= 2
print(f"hog: took {sum(t.numel() for t in held) / 2**30:.1f} GiB; free now {torch.cuda.mem_get_info()[0] / 2**20:.0f} MiB", flush=True)
time.sleep(3600)
PY
hog=$!
for _ in $(seq 600); do [ -e /tmp/oom_ready ] && break; sleep 0.1; done
"$BIN" "${ARGS[@]}" --set run.name=oom_mid > "$DIR/oom_mid.log" 2>&1 &
run=$!
for _ in $(seq 6000); do [ -e "$DIR/oom_mid/checkpoints/step_0000100" ] && break; sleep 0.01; done
touch /tmp/oom_go
wait "$run"
rc=$?
kill "$hog"
wait "$hog" 2> /dev/null
if [ "$rc" -eq 1 ]; then
  grep -q "The GPU ran out of memory" "$DIR/oom_mid.log" || fail "mid-run: exit 1 without the way on: $(tail -3 "$DIR/oom_mid.log")"
  echo "mid-run: exit 1 at step $(tail -1 "$DIR/oom_mid/metrics.jsonl" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])'):"
  grep -o "Error.*" "$DIR/oom_mid.log" | tail -1 | cut -c1-600
  "$BIN" --resume "$DIR/oom_mid" > /dev/null 2>&1 || fail "the resume after the memory came back failed"
elif [ "$rc" -eq 0 ]; then
  echo "mid-run: the run held what it needed and finished (exit 0)"
else
  fail "mid-run: exit $rc: $(tail -5 "$DIR/oom_mid.log")"
fi
python3 - "$DIR" <<'PY'
import json, sys
d = sys.argv[1]
def losses(run):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{run}/metrics.jsonl")) if "loss" in r and r["step"] > 1400}
a, b = losses("oom_ref"), losses("oom_mid")
same = a == b and 1500 in a
print(f"steps 1401-1500 after the resume: {'identical to the uninterrupted run' if same else 'DIFFER'}; step 1500: {a.get(1500)!r} / {b.get(1500)!r}")
sys.exit(0 if same else 1)
PY
