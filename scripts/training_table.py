#!/usr/bin/env python3
"""Turn the rows of `scripts/bench_training.sh` (OUT/training_rows.jsonl) into the committed
`bench/training_h200.json` (a list of {"system", "dtype", "matmul_precision", "kernels",
"batch", "seq", "micro_batch", "tokens_per_s", "peak_memory_gib"}) and a markdown table with
each row's ratio to transformers eager of the same dtype and matmul precision.
Usage: python3 scripts/training_table.py OUT/training_rows.jsonl --json bench/training_h200.json
"""
import argparse
import json

KEYS = ["system", "dtype", "matmul_precision", "kernels", "batch", "seq", "micro_batch", "tokens_per_s",
        "peak_memory_gib", "mfu"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [json.loads(l) for l in open(a.rows) if l.strip()]
    for r in rows:
        r.setdefault("kernels", "-")
        r.setdefault("micro_batch", r["batch"])
        r.setdefault("matmul_precision", "fp32")
    out = [{k: r[k] for k in KEYS if k in r} for r in rows]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")

    def eager(r):
        for e in rows:
            if e["system"] == "transformers_eager" and e["dtype"] == r["dtype"] and \
                    e["matmul_precision"] == r["matmul_precision"]:
                return e
        return None

    print("| system | dtype | matmul | kernels | micro-batch | tokens/s | x eager | peak GiB |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        e = eager(r)
        ratio = f"{r['tokens_per_s'] / e['tokens_per_s']:.2f}" if e else "-"
        print(f"| {r['system']} | {r['dtype']} | {r['matmul_precision'] if r['dtype'] == 'f32' else '-'} | "
              f"{r['kernels']} | {r['micro_batch']} | {r['tokens_per_s']:,.0f} | {ratio} | {r['peak_memory_gib']:.1f} |")


if __name__ == "__main__":
    main()
