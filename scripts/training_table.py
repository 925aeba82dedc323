#!/usr/bin/env python3
"""Turn the rows of `scripts/bench_training.sh` (OUT/training_rows.jsonl) into the committed
`bench/training_h200.json` (a list of {"system", "preset", "dtype", "matmul_precision",
"kernels", "batch", "seq", "micro_batch", "tokens_per_s", "peak_memory_gib", "mfu"}) and a
markdown table with each row's ratio to the compiled plain PyTorch LLaMA
(`torch_llama_compile`, scripts/bench_torch_llama.py: the comparator of issue 28) and to
transformers eager, each of the same preset, dtype and matmul precision (rows without a
preset are LLaMA-100M).
Usage: python3 scripts/training_table.py OUT/training_rows.jsonl [MORE.jsonl ...] --json bench/training_h200.json
"""
import argparse
import json

KEYS = ["system", "preset", "dtype", "matmul_precision", "kernels", "batch", "seq", "micro_batch", "tokens_per_s",
        "peak_memory_gib", "mfu"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", nargs="+")
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = [json.loads(l) for path in a.rows for l in open(path) if l.strip()]
    for r in rows:
        r.setdefault("kernels", "-")
        r.setdefault("preset", "llama100m")
        r.setdefault("micro_batch", r["batch"])
        r.setdefault("matmul_precision", "fp32")
    out = [{k: r[k] for k in KEYS if k in r} for r in rows]
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
            f.write("\n")

    def ratio(r, system):
        for e in rows:
            if e["system"] == system and all(e[k] == r[k] for k in ("preset", "dtype", "matmul_precision")):
                return f"{r['tokens_per_s'] / e['tokens_per_s']:.3f}"
        return "-"

    print("| system | preset | dtype | matmul | kernels | batch (micro) | tokens/s | MFU | x compiled | x eager | peak GiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        mfu = f"{100 * r['mfu']:.1f}%" if "mfu" in r else "-"
        print(f"| {r['system']} | {r['preset']} | {r['dtype']} | {r['matmul_precision'] if r['dtype'] == 'f32' else '-'} | "
              f"{r['kernels']} | {r['batch']} ({r['micro_batch']}) | {r['tokens_per_s']:,.0f} | {mfu} | "
              f"{ratio(r, 'torch_llama_compile')} | {ratio(r, 'transformers_eager')} | {r['peak_memory_gib']:.1f} |")


if __name__ == "__main__":
    main()
