#!/usr/bin/env python3
"""Check a run's TensorBoard scalars with TensorBoard's own reader.

usage: python3 scripts/check_tensorboard.py RUN_DIR      (needs `pip install tensorboard`)

Loads RUN_DIR/tensorboard/ with tensorboard.backend.event_processing.event_accumulator,
checks that every scalar lowbit writes is there (train loss, learning rate, gradient norm,
tokens/s, validation loss, the stalled fractions of m and v over all tensors and per group,
v's theory; w's with BF16 weights), that each train step shows once (a resumed run's
restart marker drops what the killed process logged past its checkpoint), and that the last
train loss and validation loss equal the last rows of RUN_DIR/metrics.jsonl (as float32). Prints the tag list and those values;
exits 1 naming what is missing or different.
"""

import json
import math
import os
import struct
import sys

from tensorboard.backend.event_processing import event_accumulator

GROUPS = ("embed", "attn", "mlp", "norm", "head")


def f32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def main(argv):
    if len(argv) != 1:
        print(__doc__.strip().split("\n\n")[1], file=sys.stderr)
        return 2
    run = argv[0]
    acc = event_accumulator.EventAccumulator(os.path.join(run, "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    tags = sorted(acc.Tags()["scalars"])
    print(f"{len(tags)} scalar tags in {run}/tensorboard: {', '.join(tags)}")

    with open(os.path.join(run, "config.toml")) as f:
        bf16_weights = any(line.replace(" ", "").startswith('dtype="bf16"') for line in f)
    want = ["train/loss", "train/lr", "train/grad_norm", "train/tokens_per_s", "val/loss", "val/ppl",
            "stall_v/theory"]
    for state in ("m", "v") + (("w",) if bf16_weights else ()):
        want += [f"stall_{state}/all"] + [f"stall_{state}/{g}" for g in GROUPS]
    missing = [t for t in want if t not in tags]

    rows = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if line.strip()]
    last = {kind: [r for r in rows if r["kind"] == kind][-1] for kind in ("train", "eval")}
    problems = []
    for tag, row, key in (("train/loss", last["train"], "loss"), ("val/loss", last["eval"], "val_loss")):
        if tag in missing:
            continue
        events = acc.Scalars(tag)
        got = events[-1]
        want_v = f32(row[key]) if row[key] is not None else math.nan
        print(f"{tag} at step {got.step}: {got.value!r} (metrics.jsonl step {row['step']}: {row[key]!r}); "
              f"{len(events)} points")
        same = got.value == want_v or (math.isnan(got.value) and math.isnan(want_v))
        if got.step != row["step"] or not same:
            problems.append(f"{tag}: step {got.step} value {got.value!r}, metrics.jsonl step {row['step']} value {want_v!r}")
    if "train/loss" in tags:
        steps = [e.step for e in acc.Scalars("train/loss")]
        if steps != sorted(set(steps)):
            problems.append(f"train/loss steps are not each logged once, in order (a resume not purged?): {steps}")
    v_all = acc.Scalars("stall_v/all")[-1] if "stall_v/all" in tags else None
    if v_all:
        print(f"stall_v/all at step {v_all.step}: {v_all.value:.4f}; stall_v/theory {acc.Scalars('stall_v/theory')[-1].value:.4f}")
    if missing:
        problems.append("missing tags: " + ", ".join(missing))
    for p in problems:
        print("FAIL " + p, file=sys.stderr)
    print("ok: TensorBoard reads every scalar" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
