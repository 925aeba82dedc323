#!/usr/bin/env python3
"""Table of the long-run stability runs (scripts/long_run_stability.sh).

usage: python3 scripts/long_run_table.py RUNS_DIR OUT_PREFIX
Reads RUNS_DIR/<run>/summary.json and metrics.jsonl; writes OUT_PREFIX.md and OUT_PREFIX.json:
per run the states, final validation loss and its difference to FP32 states, the validation
loss at every evaluation, skipped (non-finite) steps, the largest training-loss jump over the
running minimum after warmup, the mean stalled fractions of m and v (second half), and
whether the run diverged (final validation loss non-finite or above the initial one, or the
run stopped early).
"""
import json
import math
import sys
from pathlib import Path


def load(run):
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    cfg = (run / "config.toml").read_text() if (run / "config.toml").exists() else ""
    evals, train = [], []
    if (run / "metrics.jsonl").exists():
        for line in (run / "metrics.jsonl").read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            (evals if row.get("kind") == "eval" else train).append(row)
    return summary, cfg, evals, train


def states(cfg):
    keys = {}
    for line in cfg.splitlines():
        for k in ("m_format", "v_format", "m_rounding", "v_rounding", "v_zero", "max_steps"):
            if line.startswith(k + " "):
                keys[k] = line.split("=", 1)[1].strip().strip('"')
    return keys


def main():
    runs_dir, out = Path(sys.argv[1]), Path(sys.argv[2])
    rows = []
    for run in sorted(p for p in runs_dir.iterdir() if p.is_dir()):
        summary, cfg, evals, train = load(run)
        k = states(cfg)
        final = summary.get("final_val_loss")
        initial = summary.get("initial_val_loss")
        steps = summary.get("steps", max((r["step"] for r in train), default=0))
        losses = [r["loss"] for r in train if r.get("loss") is not None and r["step"] > 300]
        jump, low = 0.0, math.inf
        for x in losses:
            low = min(low, x)
            jump = max(jump, x - low)
        diverged = (final is None or not math.isfinite(final) or (initial is not None and final > initial)
                    or steps < int(k.get("max_steps", steps)))
        rows.append({
            "run": run.name, **k, "steps": steps, "final_val_loss": final, "initial_val_loss": initial,
            "val_curve": [[r["step"], r.get("val_loss")] for r in evals],
            "skipped_steps": summary.get("skipped_steps", sum(1 for r in train if r.get("skipped"))),
            "max_loss_jump": round(jump, 4), "mean_stall_m": summary.get("mean_stall_m"),
            "mean_stall_v": summary.get("mean_stall_v"), "diverged": diverged,
            "tokens_per_s": summary.get("tokens_per_s"),
        })
    ref = next((r["final_val_loss"] for r in rows if r["run"] == "fp32_states"), None)
    for r in rows:
        f = r["final_val_loss"]
        r["delta_vs_fp32_states"] = None if ref is None or f is None else round(f - ref, 4)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1) + "\n")
    fmt = lambda x, d=4: "—" if x is None else f"{x:.{d}f}"
    lines = ["| run | m | v | rounding | v_zero | steps | final val loss | Δ vs fp32 states | max loss jump | "
             "skipped | stalled m / v | diverged |", "|" + "---|" * 12]
    for r in rows:
        lines.append(f"| {r['run']} | {r.get('m_format')} | {r.get('v_format')} | {r.get('m_rounding')} | "
                     f"{r.get('v_zero')} | {r['steps']} | {fmt(r['final_val_loss'])} | "
                     f"{fmt(r['delta_vs_fp32_states'])} | {fmt(r['max_loss_jump'], 3)} | {r['skipped_steps']} | "
                     f"{fmt(r['mean_stall_m'], 3)} / {fmt(r['mean_stall_v'], 3)} | {'yes' if r['diverged'] else 'no'} |")
    curve_steps = sorted({s for r in rows for s, _ in r["val_curve"]})
    lines += ["", "Validation loss by step:", "", "| run | " + " | ".join(map(str, curve_steps)) + " |",
              "|---|" + "---|" * len(curve_steps)]
    for r in rows:
        by = dict((s, v) for s, v in r["val_curve"])
        lines.append(f"| {r['run']} | " + " | ".join(fmt(by.get(s), 3) for s in curve_steps) + " |")
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
