#!/usr/bin/env bash
# Issue 50's runs at the `h200-shuffled` scale on one GPU machine, in the order given, until a
# deadline: the tables (reproduce/<table>-h200-shuffled-*) and the departure ablations
# (reproduce/departures/<name>/: the same table runner with one --set, so their records never
# replace the table's). Every `train reproduce` call reads the committed results (--merge) and
# writes the merged results and reports to OUT; a run finished before the deadline is kept, and
# a run that would not finish by it (at the longest run its call finished, before that the
# results file's last command's run length) is not started (`train reproduce --deadline`), so
# the command ends early instead of losing it. A
# device command returns at most 8 files, so the ablations' folders are packed into
# OUT/departures.tar at the end (`tar xf OUT/departures.tar -C reproduce`), and this command's
# runs' logs (train.log, metrics.jsonl, stalls.jsonl: per-step loss and stalled fractions) into
# OUT/train-logs.tar, for reading (not committed). FORCE=1 reruns runs already recorded
# (`train reproduce --force`), e.g. to get their logs.
# Copy OUT/* but train-logs.tar over reproduce/ and commit it before the next command.
# Usage (on the GPU machine, from the repository root, token shards in data/local/tok/, see
# docs/reproduce.md): scripts/reproduce_h200_shuffled.sh TRAIN OUT DEADLINE_S STEP...
#   main[:SEEDS]         main table (bf16-model), seeds as --seed-list (default 0-2), seed by seed
#   policies[:SEEDS]     Table 6's own cells (v-only and adaptive resets), seed by seed
#   fp32model[:SEEDS]    Table 2 (FP32 model)
#   probe[:SEEDS]        the simulated-stalling probe (section 3.3, stall-probe; default seed 0),
#                        seed by seed; its figure is drawn into OUT
#   soap[:SEEDS]         Table 7: SOAP with BF16 / FP8 states, with and without resets (default
#                        0-1), seed by seed; its AdamW FP32 cell is the main table's run
#   soap_fp8_sr          Table 7's FP8 SOAP cells (plain, resets) with stochastic rounding of m, v,
#                        L and R (the table's cells round to nearest)
#   soap_fp8_block128    Table 7's FP8 SOAP cells with 128-element scale blocks (m, v, L, R)
#   soap_fp8_precond_fp32  Table 7's FP8 SOAP cells with L and R in FP32 (optim.soap.precond_format)
#   embed_head_fp32      FP8 plain with the embedding's and the head's states in FP32
#   v_zero_exclude       FP8 plain with a zero-free v (optim.states.v_zero = "exclude")
#   v_only_keep          FP8 SR + v-only resets keeping the v of idle elements
#   v_only_continue      FP8 SR + v-only resets, bias correction continued
#   fp4_period_K         FP4 SR + resets of m and v every K steps
#   fp8_period_K         FP8 SR + resets of m and v every K steps (Fig. 4)
#   fp4_m_only, fp4_v_only  FP4 SR + resets of m only / v only every 200 steps (the paper's
#                        FP4 period), the other state never reset
#   fp4_m_only_continue  fp4_m_only with the bias-correction counter kept counting over resets
#   fp32_m_only          FP32 states with m reset every 200 steps (v never): fp4_m_only's
#                        control without quantization
#   fp32_period_K        FP32 states with m and v reset every K steps (K = 0: never, the
#                        table's FP32 cell again, a same-card baseline)
#   fp4_same_card        the table's FP4 SR and FP4 SR + resets cells again, on this command's
#                        card: the baseline for fp4_m_only / fp4_v_only run beside it, and
#                        whether the card repeats the table's (or departures/fp4_period_200's) bits
#   fp4_per_tensor       A.10: FP4 SR with and without resets, one scale per tensor
#   model_60m[:CELLS], model_100m[:CELLS]  Table 4: the model-scale cells (default all of
#                        Table 4's; CELLS as --cells) at the paper's lr for 60M/100M (1e-3)
#   batch_B              steps vs tokens per step: FP32 states, FP8 plain and FP8 SR + resets at
#                        B x 256 tokens per step (B = 32 .. 512; micro-batches of at most 128)
#                        for the scale's 78.6M tokens (2400 x 128 / B steps, warmup 10%)
# Each ablation runs the seeds in ABLATION_SEEDS (default 0-2).
set -uo pipefail
TRAIN=$1
OUT=$2
DEADLINE=$(($(date +%s) + $3))
shift 3
seeds=${ABLATION_SEEDS:-0-2}
force=()
[ "${FORCE:-0}" = 1 ] && force=(--force)
stamp=$(mktemp)
table4=fp32_plain,bf16_plain,bf16_sr_reset,fp8_plain,fp8_sr_reset,fp4_plain,fp4_sr_reset
fp32=(--set optim.states.groups.GROUP.m_format=fp32 --set optim.states.groups.GROUP.v_format=fp32)

# reproduce NAME TABLE SEEDS ARGS...: one `train reproduce` per seed, NAME "" for the tables
reproduce() {
  local name=$1 table=$2 list=$3
  shift 3
  local out=$OUT merge=reproduce
  if [ -n "$name" ]; then
    out=$OUT/departures/$name merge=reproduce/departures/$name
    mkdir -p "$merge"
  fi
  mkdir -p "$out"
  IFS=, read -ra parts <<<"$list"
  for part in "${parts[@]}"; do
    local lo=${part%-*} hi=${part#*-}
    for ((s = lo; s <= hi; s++)); do
      local left=$((DEADLINE - $(date +%s)))
      if [ "$left" -le 30 ]; then
        echo "deadline: $table ${name:-table} seed $s not started"
        return 1
      fi
      echo "== $(date +%T) $table ${name:-table} seed $s ($left s left)"
      # --deadline: no run starts that would be cut (exit 75 then stops the steps after it)
      timeout "$left" "$TRAIN" reproduce --table "$table" --scale h200-shuffled --seed-list "$s" --runs "/tmp/rr/${name:-tables}" \
        --out "$out" --merge "$merge" --deadline $((left - 5)) "${force[@]}" "$@" || return 1
    done
  done
}

for step in "$@"; do
  arg=${step#*:}
  [ "$arg" = "$step" ] && arg=""
  case $step in
    main*) reproduce "" bf16-model "${arg:-0-2}" ;;
    policies*) reproduce "" reset-policies "${arg:-0-2}" --cells fp8_sr_reset_v,fp8_sr_adaptive ;;
    fp32model*) reproduce "" fp32-model "${arg:-0-1}" ;;
    probe*) reproduce "" stall-probe "${arg:-0}" ;;
    soap | soap:*) reproduce "" soap "${arg:-0-1}" ;;
    soap_fp8_sr)
      reproduce "$step" soap "$seeds" --cells soap_fp8_plain,soap_fp8_reset \
        --set optim.states.m_rounding=stochastic --set optim.states.v_rounding=stochastic ;;
    soap_fp8_block128)
      reproduce "$step" soap "$seeds" --cells soap_fp8_plain,soap_fp8_reset --set optim.states.block_size=128 ;;
    soap_fp8_precond_fp32)
      reproduce "$step" soap "$seeds" --cells soap_fp8_plain,soap_fp8_reset --set 'optim.soap.precond_format="fp32"' ;;
    embed_head_fp32)
      reproduce "$step" bf16-model "$seeds" --cells fp8_plain "${fp32[@]//GROUP/embed}" "${fp32[@]//GROUP/head}" ;;
    v_zero_exclude) reproduce "$step" bf16-model "$seeds" --cells fp8_plain --set optim.states.v_zero=exclude ;;
    v_only_keep) reproduce "$step" reset-policies "$seeds" --cells fp8_sr_reset_v --set optim.states.v_reset_idle=keep ;;
    v_only_continue)
      reproduce "$step" reset-policies "$seeds" --cells fp8_sr_reset_v --set optim.states.bias_correction=continue ;;
    fp4_period_* | fp8_period_* | fp32_period_*)
      format=${step%%_period_*} k=${step#*_period_}
      cell=${format}_sr_reset
      [ "$format" = fp32 ] && cell=fp32_plain
      reproduce "$step" bf16-model "$seeds" --cells "$cell" --set optim.states.m_reset_every="$k" \
        --set optim.states.v_reset_every="$k" ;;
    fp4_same_card) reproduce "$step" bf16-model "$seeds" --cells fp4_sr,fp4_sr_reset ;;
    fp4_per_tensor) reproduce "$step" bf16-model "$seeds" --cells fp4_sr,fp4_sr_reset --set optim.states.block_size=0 ;;
    model_60m* | model_100m*)
      name=${step%%:*}
      reproduce "$name" bf16-model "$seeds" --cells "${arg:-$table4}" --set "model.preset=\"llama${name#model_}\"" \
        --set optim.lr=1e-3 ;;
    fp4_m_only_continue)
      reproduce "$step" bf16-model "$seeds" --cells fp4_sr_reset --set optim.states.v_reset_every=0 \
        --set optim.states.bias_correction=continue ;;
    fp32_m_only) reproduce "$step" bf16-model "$seeds" --cells fp32_plain --set optim.states.m_reset_every=200 ;;
    fp4_m_only | fp4_v_only)
      never=v
      [ "$step" = fp4_v_only ] && never=m
      reproduce "$step" bf16-model "$seeds" --cells fp4_sr_reset --set optim.states."$never"_reset_every=0 ;;
    batch_*)
      b=${step#batch_} micro=128
      [ "$b" -lt 128 ] && micro=$b
      steps=$((2400 * 128 / b))
      reproduce "$step" bf16-model "$seeds" --cells fp32_plain,fp8_plain,fp8_sr_reset \
        --set train.micro_batch="$micro" --set train.grad_accum=$((b / micro)) \
        --set train.max_steps="$steps" --set optim.warmup_steps=$((steps / 10)) ;;
    *)
      echo "unknown step $step" >&2
      exit 2
      ;;
  esac || break
done
find /tmp/rr -newer "$stamp" \( -name train.log -o -name metrics.jsonl -o -name stalls.jsonl \) |
  tar cf "$OUT/train-logs.tar" -T - 2>/dev/null
rm -f "$stamp"
if [ -d "$OUT/departures" ]; then
  tar cf "$OUT/departures.tar" -C "$OUT" departures && rm -rf "$OUT/departures"
fi
