#!/usr/bin/env bash
# The shipped CPU config with every storage format (issue 20): configs/tiny_cpu.toml with FP32,
# FP8 and FP4 states (block-scaled, zero-free v), nearest and stochastic rounding, all at once,
# same data and seed. Prints each run's final validation loss and the largest |w| of its
# token embedding and LM head (from the final checkpoint).
#   scripts/tiny_cpu_formats.sh [TRAIN_BIN] [RUNS_DIR] [THREADS_PER_RUN] [--set KEY=VALUE ...]
set -euo pipefail
train=${1:-target/release/train}
runs=${2:-runs/tiny_formats}
threads=${3:-1}
shift $(( $# >= 3 ? 3 : $# ))
mkdir -p "$runs"
cells=(
  "fp32_states fp32 fp32 nearest"
  "fp8_nearest fp8 fp8 nearest"
  "fp8_sr fp8 fp8 stochastic"
  "fp4_nearest fp4 fp4 nearest"
  "fp4_sr fp4 fp4 stochastic"
)
pids=()
for c in "${cells[@]}"; do
  read -r name m v r <<<"$c"
  RAYON_NUM_THREADS=$threads "$train" --config configs/tiny_cpu.toml --set train.device=\"cpu\" \
    --set "run.dir=\"$runs\"" --set "run.name=\"$name\"" --set run.plots=false \
    --set "optim.states.m_format=\"$m\"" --set "optim.states.v_format=\"$v\"" \
    --set "optim.states.m_rounding=\"$r\"" --set "optim.states.v_rounding=\"$r\"" "$@" \
    >"$runs/$name.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
python3 - "$runs" <<'PY'
import array, json, pathlib, struct, sys

def max_abs(path, names):
    raw = path.read_bytes()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name in names:
        meta = header[name]
        assert meta["dtype"] == "F32", meta
        a, b = meta["data_offsets"]
        xs = array.array("f")
        xs.frombytes(raw[8 + n + a:8 + n + b])
        out[name] = max(abs(x) for x in xs)
    return out

runs = pathlib.Path(sys.argv[1])
print("| run | final val loss | max abs embedding | max abs lm_head |")
print("|---|---|---|---|")
for run in sorted(p for p in runs.iterdir() if p.is_dir()):
    s = json.loads((run / "summary.json").read_text())
    ckpt = sorted((run / "checkpoints").glob("step_*"))[-1] / "model.safetensors"
    w = max_abs(ckpt, ["model.embed_tokens.weight", "lm_head.weight"])
    print(f"| {run.name} | {s['final_val_loss']:.4f} | {w['model.embed_tokens.weight']:.4f} | {w['lm_head.weight']:.4f} |")
PY
exit $status
