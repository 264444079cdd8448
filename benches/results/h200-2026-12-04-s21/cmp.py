# Geomean and per-point ratios of variants against `base` over runs: cmp.py DIR PREFIX VARIANT...
import csv, glob, math, sys, collections
d, pre, vs = sys.argv[1], sys.argv[2], sys.argv[3:]
def load(v):
    m = collections.defaultdict(list)
    for f in sorted(glob.glob(f"{d}/{pre}-{v}-*.csv")):
        for r in csv.DictReader(open(f)):
            m[(r['model'], int(r['tokens']), r['routing'])].append(float(r['median_us']))
    return {k: sum(x) / len(x) for k, x in m.items()}
base = load('base')
for v in vs:
    o = load(v); ks = sorted(set(base) & set(o))
    rs = [o[k] / base[k] for k in ks]
    print(f"{v}: geomean {math.exp(sum(map(math.log, rs)) / len(rs)):.4f} over {len(rs)} points")
    for k, r in zip(ks, rs):
        if abs(r - 1) > 0.01 or k[0].startswith('mixtral'): print(f"  {k[0]:16} T={k[1]:<6} {k[2]:9} {base[k]:9.1f} {o[k]:9.1f} {r:.3f}")
