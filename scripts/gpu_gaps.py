#!/usr/bin/env python3
"""GPU idle time per training step from a CUPTI trace (scripts/cupti_trace.c's $TRACE_OUT).

A step is the time between the ends of two consecutive AdamW step kernels (`adamw_*`, not the
amax pass or the scales: one launch per step, which holds for up to 256 parameter tensors of
one weight dtype; with more, a step's launches would count as steps); `train bench training`
runs --warmup untimed steps, then --steps timed ones, then --steps with a device
synchronisation at each phase boundary. Per step: its length, the time the GPU ran kernels,
copies or memsets (busy: their union), and the rest (idle: the gaps between them),
the largest gaps with the records on each side and the driver calls inside them, then the
gaps summed over the steps by (record before, record after). Usage:
  python3 scripts/gpu_gaps.py t.txt[.gz] --first 3 --count 4   # steps 3..6: bench's timed steps after --warmup 2
"""
import argparse
import collections
import gzip


def records(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        for line in f:
            kind, start, end, corr, *rest = line.rstrip("\n").split(" ", 4)
            yield kind, int(start), int(end), rest[0] if rest else ""


def label(kind, what):
    """A record's name: the kernel's, or the copy's direction (CUPTI's copyKind) and bytes."""
    if kind == "K":
        return what
    if kind == "S":
        return f"memset {what} B"
    direction, size = what.split(" ")
    return f"copy {({'kind1': 'HtoD', 'kind2': 'DtoH', 'kind8': 'DtoD'}).get(direction, direction)} {size} B"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--first", type=int, default=3, help="first step to count (1-based)")
    ap.add_argument("--count", type=int, default=4, help="steps to count")
    ap.add_argument("--top", type=int, default=6, help="largest gaps listed per step")
    a = ap.parse_args()
    gpu, api = [], []
    for kind, start, end, what in records(a.trace):
        if kind in "KCS":
            gpu.append((start, end, kind, what))
        elif kind == "D":
            api.append((start, end, what))
    gpu.sort()
    ends = [e for s, e, k, w in gpu if k == "K" and w.startswith("adamw_") and "amax" not in w and "set_scales" not in w]
    steps = list(zip(ends[a.first - 2 : a.first - 2 + a.count], ends[a.first - 1 : a.first - 1 + a.count]))
    if a.first < 2 or len(steps) < a.count:
        raise SystemExit(f"{len(ends)} optimizer steps in the trace: steps {a.first}..{a.first + a.count - 1} are not all there (step 1 has no start)")
    totals, counts = collections.Counter(), collections.Counter()
    for i, (t0, t1) in enumerate(steps):
        inside = [r for r in gpu if r[0] >= t0 and r[1] <= t1]
        gaps, prev_end, prev = [], t0, "adamw (previous step)"
        for s, e, k, w in inside:
            if s > prev_end:
                gaps.append((s - prev_end, prev, label(k, w), prev_end, s))
            if e > prev_end:
                prev_end, prev = e, label(k, w)
        idle = sum(g[0] for g in gaps)
        busy = (t1 - t0) - idle
        print(f"step {a.first + i}: {(t1 - t0) / 1e6:.2f} ms, busy {busy / 1e6:.2f} ms, idle {idle / 1e6:.2f} ms "
              f"({len(inside)} records, {len(gaps)} gaps)")
        for g, before, after, s, e in sorted(gaps, reverse=True)[: a.top]:
            calls = collections.Counter(w for cs, ce, w in api if cs < e and ce > s).most_common(4)
            print(f"  {g / 1e3:7.1f} us after {before[:44]:44s} before {after[:44]:44s} calls {calls}")
        for g, before, after, _, _ in gaps:
            totals[before[:44], after[:44]] += g
            counts[before[:44], after[:44]] += 1
    print(f"gaps by (before, after), per step over {len(steps)} steps:")
    for key, g in totals.most_common(12):
        print(f"  {g / 1e3 / len(steps):7.1f} us  x{counts[key] / len(steps):<4.0f} {key[0]} -> {key[1]}")


if __name__ == "__main__":
    main()
