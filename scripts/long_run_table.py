#!/usr/bin/env python3
"""Tables of the long-run study (scripts/long_run_stability.sh), over any number of seeds.

usage: python3 scripts/long_run_table.py RUNS_DIR OUT_PREFIX
Reads every run folder under RUNS_DIR (a folder holding metrics.jsonl; one folder per seed
works: RUNS_DIR/seed0/<run>/...), writes OUT_PREFIX.json and prints the markdown tables (the
tables of bench/paper_formats_h200.md, below its findings):
- per run and seed: the states (formats, block, scale kind, rounding, v_zero), the final
  validation loss and its difference to FP32 states of the same seed (paired: same
  initialisation and data order), the mean stalled fractions of m and v over the second half
  under both estimators (lowbit's stalled / updated; the paper's unchanged / all entries) beside
  the theory for v, skipped steps, the largest training-loss jump over the running minimum after
  warmup, and whether the run diverged (final validation loss non-finite or above the initial
  one, or the run stopped early);
- per run: the seed mean of each number, and the validation curve of every seed.
"""
import json
import math
import sys
import tomllib
from pathlib import Path


def load(run):
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    cfg = tomllib.loads((run / "config.toml").read_text())
    evals, train = [], []
    if (run / "metrics.jsonl").exists():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            (evals if row.get("kind") == "eval" else train).append(row)
    return summary, cfg, evals, train


def row_of(run):
    summary, cfg, evals, train = load(run)
    st = cfg["optim"]["states"]
    max_steps = cfg["train"]["max_steps"]
    final, initial = summary.get("final_val_loss"), summary.get("initial_val_loss")
    steps = summary.get("steps", max((r["step"] for r in train), default=0))
    warmup = cfg["optim"].get("warmup_steps", 0)
    jump, low = 0.0, math.inf
    for x in (r["loss"] for r in train if r.get("loss") is not None and r["step"] > warmup):
        low = min(low, x)
        jump = max(jump, x - low)
    scaled = any(f.startswith(("fp8", "fp4")) for f in (st["m_format"], st["v_format"]))
    return {
        "run": run.name, "seed": cfg["train"]["seed"], "m_format": st["m_format"], "v_format": st["v_format"],
        "block": (st["block_size"] or "tensor") if scaled else "-", "scale": st.get("scale", "default") if scaled else "-",
        "rounding": st["m_rounding"], "v_zero": st.get("v_zero", "exclude") if scaled else "-", "eps": cfg["optim"]["eps"],
        "steps": steps, "final_val_loss": final, "initial_val_loss": initial,
        "val_curve": [[r["step"], r.get("val_loss")] for r in evals],
        "skipped_steps": summary.get("skipped_steps", sum(1 for r in train if r.get("skipped"))),
        "max_loss_jump": round(jump, 4),
        "stall_m": summary.get("mean_stall_m"), "stall_v": summary.get("mean_stall_v"),
        "unchanged_m": summary.get("mean_unchanged_m"), "unchanged_v": summary.get("mean_unchanged_v"),
        "theory_v": summary.get("theory_stall_v"), "tokens_per_s": summary.get("tokens_per_s"),
        "diverged": final is None or not math.isfinite(final) or (initial is not None and final > initial)
        or steps < max_steps,
    }


def mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


def main():
    runs_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows = sorted((row_of(p.parent) for p in runs_dir.rglob("metrics.jsonl")), key=lambda r: (r["run"], r["seed"]))
    ref = {r["seed"]: r["final_val_loss"] for r in rows if r["run"] == "fp32_states"}
    for r in rows:
        f, base = r["final_val_loss"], ref.get(r["seed"])
        r["delta_vs_fp32_states"] = None if f is None or base is None else round(f - base, 4)
    seeds = sorted({r["seed"] for r in rows})
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    fmt = lambda x, d=4: "—" if x is None else f"{x:.{d}f}"
    sgn = lambda x: "—" if x is None else f"{x:+.3f}"
    names = list(dict.fromkeys(r["run"] for r in rows))
    by = {(r["run"], r["seed"]): r for r in rows}
    head = ("| run | m / v | block | scale | rounding | v_zero | " + " | ".join(f"loss s{s} (Δ)" for s in seeds)
            + " | mean Δ | stalled m / v | unchanged m / v (paper) | theory v | diverged |")
    lines = [head, "|" + "---|" * (10 + len(seeds))]
    for n in names:
        rs = [by.get((n, s)) for s in seeds]
        r0 = next(r for r in rs if r)
        cells = [f"{fmt(r['final_val_loss'])} ({sgn(r['delta_vs_fp32_states'])})" if r else "—" for r in rs]
        m = lambda k: mean([r[k] for r in rs if r])
        lines.append(
            f"| {n} | {r0['m_format']} / {r0['v_format']} | {r0['block']} | {r0['scale']} | {r0['rounding']} | "
            f"{r0['v_zero']} | " + " | ".join(cells) + f" | {sgn(m('delta_vs_fp32_states'))} | "
            f"{fmt(m('stall_m'), 3)} / {fmt(m('stall_v'), 3)} | {fmt(m('unchanged_m'), 3)} / {fmt(m('unchanged_v'), 3)} | "
            f"{fmt(m('theory_v'), 3)} | {'yes' if any(r['diverged'] for r in rs if r) else 'no'} |")
    steps = sorted({s for r in rows for s, _ in r["val_curve"]})
    lines += ["", "Validation loss by step:", "", "| run | seed | " + " | ".join(map(str, steps)) + " |",
              "|---|---|" + "---|" * len(steps)]
    for r in rows:
        curve = dict((s, v) for s, v in r["val_curve"])
        lines.append(f"| {r['run']} | {r['seed']} | " + " | ".join(fmt(curve.get(s), 3) for s in steps) + " |")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
