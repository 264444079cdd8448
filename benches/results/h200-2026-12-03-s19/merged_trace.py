"""Reads a MOE_MERGED_TRACE CSV (merged-trace.patch: one row per working CTA of the merged tile's two GEMMs, the
last graph replay) and prints, per GEMM: its span, the CTAs and their median / p90 duration by run size (blocks
of 16 positions), and per tenth of the span how many CTA-microseconds went to runs of 3-4 blocks.
Usage: python3 merged_trace.py TRACE.csv"""
import csv, statistics, sys

rows = [r for r in csv.DictReader(open(sys.argv[1]))]
for g in ("1", "2"):
    rs = [r for r in rows if r["gemm"] == g]
    if not rs:
        continue
    t0 = min(int(r["t0"]) for r in rs)
    t1 = max(int(r["t1"]) for r in rs)
    span = (t1 - t0) / 1e3
    print(f"GEMM{g}: {len(rs)} CTAs over {span:.1f} us on {len(set(r['sm'] for r in rs))} SMs")
    for run in sorted(set(r["run"] for r in rs)):
        d = sorted((int(r["t1"]) - int(r["t0"])) / 1e3 for r in rs if r["run"] == run)
        print(f"  run of {run} block(s): {len(d):5d} CTAs, median {statistics.median(d):7.1f} us, "
              f"p90 {d[int(0.9 * (len(d) - 1))]:7.1f}, sum {sum(d):9.0f} CTA-us")
    bins = [0.0] * 10
    for r in rs:
        if int(r["run"]) < 3:
            continue
        a, b = int(r["t0"]) - t0, int(r["t1"]) - t0
        for i in range(10):
            lo, hi = i * (t1 - t0) / 10, (i + 1) * (t1 - t0) / 10
            bins[i] += max(0.0, min(b, hi) - max(a, lo)) / 1e3
    print("  runs of 3-4 blocks, CTA-us per tenth of the span:", " ".join(f"{x:.0f}" for x in bins))
