#!/usr/bin/env bash
# The reproduce runner's throughput on one GPU at the tables' shape (issue 52's last figure):
# the same LLaMA-20M runs of `train reproduce --scale h200-shuffled` (128 x 256 tokens per step,
# cut to STEPS steps), for the BF16-model table and the FP32-model one (Table 2), one run at a
# time and then each count of JOBS (comma-separated) at once; tokens/s of all runs together = their tokens over the
# command's wall time (start-up and validation included, as the tables pay them), beside one
# run of the same model in `train bench training` (the large-batch step alone).
# Usage, on the GPU machine with the token shards in data/local/tok/ (docs/reproduce.md):
#   scripts/bench_runner.sh TRAIN OUT [STEPS [JOBS [CELLS]]]    # defaults: 300, 2,3 (one at a time, the scale's default, always runs first), fp32_plain,fp8_plain,fp8_sr
# Writes OUT/runner_rows.jsonl (one JSON row per table and jobs) and prints them. One GPU: the
# first, unless CUDA_VISIBLE_DEVICES says which (the runner spreads its jobs over every GPU it sees).
set -euo pipefail
export CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
TRAIN=$1
OUT=$2
STEPS=${3:-300}
JOBS=${4:-2,3}
CELLS=${5:-fp32_plain,fp8_plain,fp8_sr}
mkdir -p "$OUT"
ROWS=$OUT/runner_rows.jsonl
for table in bf16-model fp32-model; do
  dtype=bf16
  [ "$table" = fp32-model ] && dtype=f32
  "$TRAIN" bench training --preset llama20m --batch 128 --seq 256 --dtype "$dtype" --warmup 5 --steps 20 \
    --set 'data.train=["data/local/tok/corpus/en-train.*.tokens.zst"]' \
    --set 'data.validation=["data/local/tok/corpus/en-validation.*.tokens.zst"]' --json "$OUT/single_$table.jsonl" >&2
  for jobs in 1 ${JOBS//,/ }; do
    dir=$OUT/runner_${table}_$jobs
    rm -rf "$dir" "/tmp/bench_runner_${table}_$jobs" # a results file already there would skip the runs
    "$TRAIN" reproduce --table "$table" --scale h200-shuffled --cells "$CELLS" --seed-list 0 --jobs "$jobs" \
      --set train.max_steps="$STEPS" --runs "/tmp/bench_runner_${table}_$jobs" --out "$dir" >"$dir.log" 2>&1 \
      || { tail -50 "$dir.log" >&2; exit 1; }
    python3 - "$dir/$table-h200-shuffled-results.json" "$OUT/single_$table.jsonl" "$table" "$jobs" >>"$ROWS" <<'PY'
import json, sys
results, single, table, jobs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
r = json.load(open(results))
tokens = sum(x["tokens"] for x in r["runs"])
wall = r["commands"][-1]["wall_s"]
alone = json.loads(open(single).read().splitlines()[-1])["tokens_per_s"]
print(json.dumps({"table": table, "jobs": jobs, "runs": len(r["runs"]), "steps": r["runs"][0]["steps"],
                  "wall_s": wall, "tokens_per_s": tokens / wall, "one_run_alone_tokens_per_s": alone,
                  "ratio": tokens / wall / alone}))
PY
  done
done
cat "$ROWS"
