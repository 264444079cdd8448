"""Per point: lower median of each variant's CSV runs against base's; geomean. Usage: cmp_csv.py DIR PREFIX VARIANT"""
import csv, glob, math, sys

def lower(files):
    best = {}
    for f in files:
        for r in csv.DictReader(open(f)):
            k = (r["model"], int(r["tokens"]), r["routing"])
            v = float(r["median_us"])
            best[k] = (min(best[k][0], v), r["ran"]) if k in best else (v, r["ran"])
    return best

d, prefix, var = sys.argv[1:4]
base = lower(sorted(glob.glob(f"{d}/{prefix}-base-*.csv")))
new = lower(sorted(glob.glob(f"{d}/{prefix}-{var}-*.csv")))
logs = []
for k in base:
    if k in new:
        r = new[k][0] / base[k][0]
        logs.append(math.log(r))
        print(f"{k[0]:<16} T={k[1]:<5} {k[2]:<8} {base[k][1]:<8} base {base[k][0]:8.1f} {var} {new[k][0]:8.1f} ratio {r:.3f}")
print(f"geomean {math.exp(sum(logs) / len(logs)):.4f} over {len(logs)} points")
