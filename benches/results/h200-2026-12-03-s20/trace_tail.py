"""Reads a MOE_MERGED_TRACE CSV (merged-trace.patch) and prints per GEMM, and for both together (GEMM2 starts in GEMM1's tail), the tail of its one-wave or last-wave
schedule: span, CTA duration quantiles, when the first / median / last CTA ended, and the average number of CTAs
resident per tenth of the span (264 = two per SM on the H200). Usage: python3 trace_tail.py TRACE.csv"""
import csv, statistics, sys

rows = list(csv.DictReader(open(sys.argv[1])))
for g in ("1", "2", "1+2"):
    rs = [r for r in rows if r["gemm"] in g.split("+")]
    if not rs:
        continue
    t0 = min(int(r["t0"]) for r in rs)
    t1 = max(int(r["t1"]) for r in rs)
    span = t1 - t0
    d = sorted((int(r["t1"]) - int(r["t0"])) / 1e3 for r in rs)
    ends = sorted((int(r["t1"]) - t0) / 1e3 for r in rs)
    q = lambda v, f: v[int(f * (len(v) - 1))]
    print(f"GEMM {g}: {len(rs)} CTAs over {span / 1e3:.1f} us; CTA us p10 {q(d, .1):.1f} median {q(d, .5):.1f} "
          f"p90 {q(d, .9):.1f} max {d[-1]:.1f}; ends: first {ends[0]:.1f} median {q(ends, .5):.1f} "
          f"p90 {q(ends, .9):.1f} last {ends[-1]:.1f}")
    bins = [0.0] * 10
    for r in rs:
        a, b = int(r["t0"]) - t0, int(r["t1"]) - t0
        for i in range(10):
            lo, hi = i * span / 10, (i + 1) * span / 10
            bins[i] += max(0.0, min(b, hi) - max(a, lo)) / (span / 10)
    print("  CTAs resident per tenth of the span:", " ".join(f"{x:.0f}" for x in bins))
