"""Every Fused decode tile forced, and Grouped, per point (lower median of the runs tile-<tile>-<i>.log):
python3 tiles.py > tiles.txt"""
import glob, re

TILES = ["fused-swapab-merged", "fused-swapab-16", "fused-swapab-32", "fused-64x128x64", "grouped"]

def medians(path):
    out = {}
    for line in open(path):
        m = re.match(r"(\S+/T=\d+(?:/\w+)?)\s+(\S+)\s+\S+\s+([\d.]+)\s+[\d.]+-[\d.]+\s+([\d.]+)", line)
        if m:
            out[m.group(1)] = (float(m.group(3)), float(m.group(4)))
    return out

res = {}
for t in TILES:
    runs = [medians(f) for f in sorted(glob.glob(f"tile-{t}-*.log"))]
    res[t] = {k: min(r[k][0] for r in runs if k in r) for k in runs[0]}
    floor = {k: runs[0][k][1] for k in runs[0]}
print(f"{'point':<28}" + "".join(f"{t.replace('fused-', ''):>15}" for t in TILES) + f"{'floor':>9}  merged/best-other")
for k in res[TILES[0]]:
    best_other = min(res[t][k] for t in TILES[1:])
    print(f"{k:<28}" + "".join(f"{res[t][k]:15.1f}" for t in TILES) + f"{floor[k]:9.1f}  {res[TILES[0]][k] / best_other:.3f}")
