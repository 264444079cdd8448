"""The tile sweep: per point, Grouped and the Fused backend with each tile forced (tiles-<tile>.log)."""
import re

rows = {}
for t in ["fused-swapab-16", "fused-swapab-32", "fused-64x128x64"]:
    for line in open(f"tiles-{t}.log"):
        m = re.match(r"(\S+/T=\d+(?:/\w+)?)\s+(\S+)\s+\S+\s+([\d.]+)\s+[\d.]+-[\d.]+\s+([\d.]+)", line)
        if m:
            point, backend, median, floor = m.group(1), m.group(2), float(m.group(3)), float(m.group(4))
            rows.setdefault(point, {})[backend if backend != "Fused" else t] = median
            rows[point]["floor"] = floor
print(f"{'point':<32}{'grouped':>9}{'swapab16':>9}{'swapab32':>9}{'64x128':>9}{'floor':>8}")
for point, d in rows.items():
    cols = [d.get(k, 0.0) for k in ["Grouped", "fused-swapab-16", "fused-swapab-32", "fused-64x128x64", "floor"]]
    print(f"{point:<32}" + "".join(f"{c:9.1f}" for c in cols[:4]) + f"{cols[4]:8.1f}")
