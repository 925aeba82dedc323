#!/usr/bin/env bash
# `train reproduce` steps on a device machine, in the order given, until a deadline: each step
# reads the committed records (--merge reproduce) and writes the merged records and reports to
# OUT; --deadline (the time left) keeps a run that could not finish from starting, and the
# step then exits 75 naming the runs left, which the same step in the next command goes on
# with. A device command returns at most 8 files, so OUT's reports and records are packed into
# OUT/reproduce.tar (`tar xf reproduce.tar -C reproduce` here, then commit), and the runs' logs
# (train.log, metrics.jsonl, stalls.jsonl: for reading, not committed) into OUT/train-logs.tar.
# FORCE=1 reruns recorded runs (--force), e.g. to get their logs; JOBS=N runs N at once
# (--jobs; default: the scale's runs per GPU); CELLS=a,b runs only those cells (--cells).
# Usage (from the repository root, token shards in data/local/tok/: docs/reproduce.md):
#   scripts/reproduce_on_device.sh TRAIN OUT DEADLINE_S STEP...
#   STEP: an ablation (`train reproduce --list-ablations`), or TABLE@SCALE (a table, e.g.
#   bf16-model@h200-shuffled); either with :SEEDS for --seed-list (fp4_period_400:0-2).
set -uo pipefail
TRAIN=$1 OUT=$2 END=$(($(date +%s) + $3))
shift 3
extra=()
[ "${FORCE:-0}" = 1 ] && extra=(--force)
[ -n "${JOBS:-}" ] && extra+=(--jobs "$JOBS")
[ -n "${CELLS:-}" ] && extra+=(--cells "$CELLS")
stamp=$(mktemp)
mkdir -p "$OUT"
for step in "$@"; do
  left=$((END - $(date +%s)))
  [ "$left" -gt 30 ] || { echo "deadline: $step not started"; break; }
  what=${step%%:*} seeds=${step#"${step%%:*}"}
  if [[ $what == *@* ]]; then args=(--table "${what%@*}" --scale "${what#*@}"); else args=(--ablation "$what"); fi
  [ -n "$seeds" ] && args+=(--seed-list "${seeds#:}")
  echo "== $(date +%T) $step ($left s left)"
  timeout "$left" "$TRAIN" reproduce "${args[@]}" --runs "/tmp/rr/$what" --out "$OUT" --merge reproduce \
    --deadline $((left - 5)) "${extra[@]}" || break
done
find /tmp/rr -newer "$stamp" \( -name train.log -o -name metrics.jsonl -o -name stalls.jsonl \) 2>/dev/null |
  tar cf "$OUT/train-logs.tar" -T -
rm -f "$stamp"
(cd "$OUT" && find . -mindepth 1 -maxdepth 1 ! -name train-logs.tar ! -name reproduce.tar -print0 |
  xargs -0r tar cf reproduce.tar --remove-files)
