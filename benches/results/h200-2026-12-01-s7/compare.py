"""Auto of session 7 (gated epilogue, K-split rule, re-tuned decode buckets) against the session start (main 32c5079 + sm100-blockwise), both
run twice in one device session, alternating; per point the lower median of the two runs. Prints the ratio
new / old per model and T (routings uniform / balanced / zipf), and against PERF_TARGETS' vLLM figures."""
import csv
import sys


def load(prefix):
    best = {}
    for r in (1, 2):
        for row in csv.DictReader(open(f"{prefix}-{r}.csv")):
            key = (row["model"], int(row["tokens"]), row["routing"])
            v = float(row["median_us"])
            if key not in best or v < best[key][0]:
                best[key] = v, float(row["floor_us"]), row["ran"]
    return best


new, old = load("auto-s7"), load("auto-s7base")
vllm = {}
for line in open(sys.argv[1] if len(sys.argv) > 1 else "../../../../shared/PERF_TARGETS.md"):
    c = [x.strip() for x in line.split("|")]
    if len(c) > 6 and " T=" in c[1] and c[2] in ("uniform", "zipf"):
        m, t = c[1].split(" T=")
        vllm[(m, int(t), c[2])] = float(c[5].split()[0])
ratios = []
print(f"{'point':34} {'old us':>9} {'new us':>9} {'new/old':>8} {'x floor':>8} {'vLLM us':>9} {'new/vLLM':>9}  ran")
for key in sorted(new, key=lambda k: (k[0], k[2], k[1])):
    (n, floor, ran), (o, _, _) = new[key], old[key]
    ratios.append(n / o)
    v = vllm.get(key)
    vs = f"{v:9.1f} {n / v:9.3f}" if v else f"{'':9} {'':9}"
    print(f"{key[0] + '/T=' + str(key[1]) + '/' + key[2]:34} {o:9.1f} {n:9.1f} {n / o:8.3f} {n / floor:8.2f} {vs}  {ran}")
ratios.sort()
g = 1.0
for r in ratios:
    g *= r
print(f"points {len(ratios)}: geomean new/old {g ** (1 / len(ratios)):.4f}, median {ratios[len(ratios) // 2]:.4f}, "
      f"best {ratios[0]:.3f}, worst {ratios[-1]:.3f}, faster by >2%: {sum(r < 0.98 for r in ratios)}, "
      f"slower by >2%: {sum(r > 1.02 for r in ratios)}")
