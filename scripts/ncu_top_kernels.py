#!/usr/bin/env python3
"""Top GPU kernels by time from an Nsight Compute CSV (`ncu --csv --metrics gpu__time_duration.sum`).

Groups launches by kernel name (template arguments and parameters cut off), sums their
durations, divides by --steps, and prints a markdown table: kernel, launches per step,
ms per step, share of the total. Usage:
  ncu --clock-control none --metrics gpu__time_duration.sum --csv --log-file k.csv CMD
  python3 scripts/ncu_top_kernels.py k.csv --steps 3 --top 25
"""
import argparse
import csv
import re
from collections import defaultdict


def short(name):
    name = re.sub(r"\(.*$", "", name)  # parameters
    name = re.sub(r"<.*>", "<>", name)  # template arguments
    return name.replace("void ", "").strip()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0, help="steps the capture covers")
    ap.add_argument("--top", type=int, default=25)
    a = ap.parse_args()
    total, count = defaultdict(float), defaultdict(int)
    with open(a.csv, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # drop ncu's own log lines
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "ns")
        v = float(row["Metric Value"].replace(",", ""))
        scale = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0}.get(unit, 1e-6)
        k = short(row["Kernel Name"])
        total[k] += v * scale
        count[k] += 1
    grand = sum(total.values())
    print(f"GPU kernel time {grand / a.steps:.1f} ms per step ({sum(count.values()) / a.steps:.0f} launches per step)\n")
    print("| kernel | launches / step | ms / step | share |\n|---|---|---|---|")
    for k, t in sorted(total.items(), key=lambda kv: -kv[1])[: a.top]:
        print(f"| `{k[:90]}` | {count[k] / a.steps:.0f} | {t / a.steps:.2f} | {100 * t / grand:.1f}% |")


if __name__ == "__main__":
    main()
