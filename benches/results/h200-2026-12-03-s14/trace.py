#!/usr/bin/env python3
"""Reads a fused-trace CSV (fused-trace.patch) and prints the Fused decode GEMMs' per-CTA timeline: when each
kernel's working CTAs started, were released by their PDL wait and ended, how many streamed at once, and the
weight bandwidth that implies (each CTA's weight bytes spread evenly over its streaming time).
usage: trace.py CSV[.gz] N1 K1 N2 K2 [bin_us]   (N, K: the GEMM's weight rows and K; 2 bytes per element)"""
import csv, gzip, sys
opener = gzip.open if sys.argv[1].endswith(".gz") else open
rows = list(csv.DictReader(opener(sys.argv[1], "rt")))
dims = {0: (int(sys.argv[2]), int(sys.argv[3])), 1: (int(sys.argv[4]), int(sys.argv[5]))}
binw = float(sys.argv[6]) if len(sys.argv) > 6 else 10.0
t00 = min(int(r['t0']) for r in rows)
ctas = {0: [], 1: []}
for r in rows:
    k = int(r['k'])
    if int(r['work']) != 1:
        continue
    n, kk = dims[k]
    gx = int(r['gx'])
    per = -(-n // gx)
    x = int(r['cta']) % gx
    rows_here = max(0, min(n, (x + 1) * per) - x * per)
    ctas[k].append(((int(r['t0']) - t00) / 1e3, (int(r['t1']) - t00) / 1e3, (int(r['t2']) - t00) / 1e3,
                    rows_here * kk * 2, int(r['cta']) // gx, int(r['sm'])))
tot_bytes = 0
for k, name in ((0, 'GEMM1'), (1, 'GEMM2')):
    c = ctas[k]
    if not c:
        continue
    d = sorted(x[2] - x[1] for x in c)
    b = sum(x[3] for x in c)
    tot_bytes += b
    span = max(x[2] for x in c) - min(x[1] for x in c)
    print(f"{name}: {len(c)} working CTAs, {b/1e6:.1f} MB; start {min(x[0] for x in c):.1f}-{max(x[0] for x in c):.1f}"
          f" released {min(x[1] for x in c):.1f}-{max(x[1] for x in c):.1f} end {min(x[2] for x in c):.1f}-{max(x[2] for x in c):.1f} us;"
          f" CTA streaming time median {d[len(d)//2]:.1f} min {d[0]:.1f} max {d[-1]:.1f}; {b/span/1e6:.2f} TB/s over its span {span:.1f} us")
    by_y = {}
    for x in c:
        by_y.setdefault(x[4], []).append(x[2] - x[1])
    print("  median streaming us per layout block (y: CTAs, us):",
          " ".join(f"{y}:{len(v)},{sorted(v)[len(v) // 2]:.0f}" for y, v in sorted(by_y.items())[:24]))
    by_sm = {}
    for x in c:
        by_sm.setdefault(x[5], []).append(x[2] - x[1])
    med = sorted((sorted(v)[len(v) // 2], sm) for sm, v in by_sm.items())
    print(f"  per SM median streaming us: fastest {med[0][0]:.1f} (SM {med[0][1]}), slowest {med[-1][0]:.1f}"
          f" (SM {med[-1][1]}), {len(by_sm)} SMs")
allc = ctas[0] + ctas[1]
end = max(x[2] for x in allc)
print(f"whole: {tot_bytes/1e6:.1f} MB in {end:.1f} us from GEMM1's first start = {tot_bytes/end/1e6:.2f} TB/s")
print(f"{'bin us':>8} {'G1 act':>7} {'G2 wait':>7} {'G2 act':>7} {'TB/s':>6}")
t = 0.0
while t < end:
    lo, hi = t, t + binw
    act1 = sum(1 for x in ctas[0] if x[1] < hi and x[2] > lo)
    wait2 = sum(1 for x in ctas[1] if x[0] < hi and x[1] > lo)
    act2 = sum(1 for x in ctas[1] if x[1] < hi and x[2] > lo)
    bw = 0.0
    for x in allc:
        ov = min(hi, x[2]) - max(lo, x[1])
        if ov > 0 and x[2] > x[1]:
            bw += x[3] * ov / (x[2] - x[1])
    print(f"{lo:8.0f} {act1:7d} {wait2:7d} {act2:7d} {bw / binw / 1e6:6.2f}")
    t = hi
