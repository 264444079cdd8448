"""Per point: lower median of each binary's runs, new/base ratio, geomean. Usage: compare.py PREFIX (e.g. pdl-fused)."""
import glob, math, re, sys

def medians(path):
    out = {}
    for line in open(path):
        m = re.match(r"(\S+/T=\d+(?:/\w+)?)\s+(\S+)\s+\S+\s+([\d.]+)\s+[\d.]+-[\d.]+", line)
        if m:
            out[(m.group(1), m.group(2))] = float(m.group(3))
    return out

def lower(files):
    best = {}
    for f in files:
        for k, v in medians(f).items():
            best[k] = min(best.get(k, v), v)
    return best

prefix = sys.argv[1]
base = lower(sorted(glob.glob(f"{prefix}-base-*.log")))
new = lower(sorted(glob.glob(f"{prefix}-new-*.log")))
logs = []
for k in base:
    if k in new:
        r = new[k] / base[k]
        logs.append(math.log(r))
        print(f"{k[0]:<24} {k[1]:<8} base {base[k]:8.1f}  new {new[k]:8.1f}  new/base {r:.3f}")
print(f"geomean {math.exp(sum(logs) / len(logs)):.4f} over {len(logs)} points")
