#!/usr/bin/env bash
# Long-run study of the optimizer-state formats (issue 31: the paper's formats and the two
# scale kinds), the chosen runs at once on one GPU: configs/long_run/llama20m_f32model.toml
# (LLaMA-20M, FP32 weights, 3000 steps, AdamW eps 1e-6) with one seed, per run:
#   fp32_states                  FP32 states (the reference)
#   fp4_b128_<scale>_<rounding>  FP4 (E2M1 m, unsigned E2M2 v without zero), 128-blocks
#   fp8_tensor_<scale>_<rounding> FP8 E4M3, one scale per tensor, zero kept (the paper's FP8)
#   fp8_tensor_zf_<scale>_<rounding> the same with a zero-free v
#   fp8_b128_<scale>_<rounding>  FP8 E4M3, 128-blocks, zero-free v (lowbit's block format)
# with <scale> amax | pow2 and <rounding> nearest | sr, and on the paper's FP8 (per tensor,
# amax, zero kept) with SR, the reset rules: fp8_tensor_reset_mv (m and v every K* = "auto"),
# fp8_tensor_reset_v (v every K*, m never: Table 6's asymmetric), the same keeping the v of
# zero-gradient elements (fp8_tensor_reset_v_keep: v_reset_idle = "keep"),
# fp8_tensor_reset_adaptive.
#   scripts/long_run_stability.sh TRAIN_BIN RUNS_DIR SEED [RUN ...]   (no RUN: all 21)
# Then: python3 scripts/long_run_table.py RUNS_DIR bench/paper_formats_h200 (one folder per
# seed under a common parent works: RUNS_DIR/seed0/<run>, ...).
# Needs data/local/corpus (scripts/link_shared_corpus.sh --copy).
set -euo pipefail
train=${1:?usage: $0 TRAIN_BIN RUNS_DIR SEED [RUN ...]}
runs=${2:?usage: $0 TRAIN_BIN RUNS_DIR SEED [RUN ...]}
seed=${3:?usage: $0 TRAIN_BIN RUNS_DIR SEED [RUN ...]}
shift 3
config=configs/long_run/llama20m_f32model.toml
# name | m format | v format | block | scale | rounding | v_zero | m reset | v reset | rule | v_reset_idle
cells=("fp32_states fp32 fp32 128 default nearest exclude 0 0 periodic reset")
for scale in amax pow2; do
  for r in nearest sr; do
    rounding=$([ $r = sr ] && echo stochastic || echo nearest)
    cells+=("fp4_b128_${scale}_$r fp4 fp4 128 $scale $rounding exclude 0 0 periodic reset"
            "fp8_tensor_${scale}_$r fp8 fp8 0 $scale $rounding keep 0 0 periodic reset"
            "fp8_tensor_zf_${scale}_$r fp8 fp8 0 $scale $rounding exclude 0 0 periodic reset"
            "fp8_b128_${scale}_$r fp8 fp8 128 $scale $rounding exclude 0 0 periodic reset")
  done
done
cells+=("fp8_tensor_reset_mv fp8 fp8 0 amax stochastic keep auto auto periodic reset"
        "fp8_tensor_reset_v fp8 fp8 0 amax stochastic keep 0 auto periodic reset"
        "fp8_tensor_reset_v_keep fp8 fp8 0 amax stochastic keep 0 auto periodic keep"
        "fp8_tensor_reset_adaptive fp8 fp8 0 amax stochastic keep 0 0 adaptive reset")
selected=("$@")
q() { [[ $1 == auto ]] && echo '"auto"' || echo "$1"; }  # a reset period as a TOML value
mkdir -p "$runs"
pids=()
for c in "${cells[@]}"; do
  read -r name m v block scale rounding zero m_reset v_reset rule idle <<<"$c"
  if (( ${#selected[@]} )) && [[ ! " ${selected[*]} " == *" $name "* ]]; then continue; fi
  RAYON_NUM_THREADS=1 "$train" --config "$config" \
    --set "run.dir=\"$runs\"" --set "run.name=\"$name\"" --set "train.seed=$seed" \
    --set "optim.states.m_format=\"$m\"" --set "optim.states.v_format=\"$v\"" \
    --set "optim.states.block_size=$block" --set "optim.states.scale=\"$scale\"" \
    --set "optim.states.m_rounding=\"$rounding\"" --set "optim.states.v_rounding=\"$rounding\"" \
    --set "optim.states.v_zero=\"$zero\"" --set "optim.states.m_reset_every=$(q "$m_reset")" \
    --set "optim.states.v_reset_every=$(q "$v_reset")" --set "optim.states.reset=\"$rule\"" \
    --set "optim.states.v_reset_idle=\"$idle\"" >"$runs/$name.log" 2>&1 &
  pids+=($!)
done
(( ${#pids[@]} )) || { echo "no run matches: $*" >&2; exit 2; }
status=0
for p in "${pids[@]}"; do wait "$p" || status=1; done
tail -n 3 "$runs"/*.log
exit $status
