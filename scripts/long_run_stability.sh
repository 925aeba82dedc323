#!/usr/bin/env bash
# Long-run stability of the optimizer-state formats (issue 20), all runs at once on one GPU:
# configs/long_run/llama20m_f32model.toml (LLaMA-20M, FP32 weights, 3000 steps, same data and
# seed) with FP32 states, the block-scaled storage formats (fp8 = E4M3, fp4 = E2M1 m /
# unsigned E2M2 v, blocks of 128) under nearest and SR with a zero-free v, the same with
# `v_zero = "keep"` (the zero-point fault), and the precision-only formats of the paper's
# cells (e8m3; e8m2 v with e8m1 or e8m2 m).
#   scripts/long_run_stability.sh [TRAIN_BIN] [RUNS_DIR] [--set KEY=VALUE ...]
# Then: python3 scripts/long_run_table.py RUNS_DIR bench/long_run_h200
# Needs data/local/corpus (scripts/link_shared_corpus.sh --copy).
set -euo pipefail
train=${1:-target/release/train}
runs=${2:-runs/long_run}
shift $(( $# >= 2 ? 2 : $# ))
config=configs/long_run/llama20m_f32model.toml
mkdir -p "$runs"
# name | m format | v format | rounding | v_zero
cells=(
  "fp32_states fp32 fp32 nearest exclude"
  "fp8_nearest fp8 fp8 nearest exclude"
  "fp8_sr fp8 fp8 stochastic exclude"
  "fp4_nearest fp4 fp4 nearest exclude"
  "fp4_sr fp4 fp4 stochastic exclude"
  "fp8_nearest_keep fp8 fp8 nearest keep"
  "fp4_sr_keep fp4 fp4 stochastic keep"
  "e8m3_nearest e8m3 e8m3 nearest exclude"
  "e8m1_e8m2_nearest e8m1 e8m2 nearest exclude"
  "e8m2_e8m2_nearest e8m2 e8m2 nearest exclude"
)
pids=()
for c in "${cells[@]}"; do
  read -r name m v r z <<<"$c"
  RAYON_NUM_THREADS=1 "$train" --config "$config" \
    --set "run.dir=\"$runs\"" --set "run.name=\"$name\"" \
    --set "optim.states.m_format=\"$m\"" --set "optim.states.v_format=\"$v\"" \
    --set "optim.states.m_rounding=\"$r\"" --set "optim.states.v_rounding=\"$r\"" \
    --set "optim.states.v_zero=\"$z\"" "$@" >"$runs/$name.log" 2>&1 &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
tail -n 3 "$runs"/*.log
exit $status
