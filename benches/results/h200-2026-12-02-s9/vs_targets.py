"""This run's Auto (auto-suite.csv) against PERF_TARGETS' vLLM and floor per point (../../../../shared/PERF_TARGETS.md:
vLLM and torch were measured beside the crate on 2026-12-01, not in this run). A point passes when Auto is ahead of
the best peer or within 1.10x of this run's floor."""
import csv, re, sys

targets = {}
for line in open(sys.argv[1] if len(sys.argv) > 1 else "../../../../shared/PERF_TARGETS.md"):
    m = re.match(r"\| (\S+) T=(\d+) \| (\w+) \| ([\d.]+) \| ([\d.]+) \([\d.]+\) \| ([\d.]+) \(", line)
    if m:
        targets[(m.group(1), int(m.group(2)), m.group(3))] = (float(m.group(5)), float(m.group(6)))
misses = 0
for r in csv.DictReader(open(sys.argv[2] if len(sys.argv) > 2 else "auto-suite.csv")):
    key = (r["model"], int(r["tokens"]), r["routing"])
    if key not in targets:
        continue
    torch, vllm = targets[key]
    ours, floor = float(r["median_us"]), float(r["floor_us"])
    best = min(torch, vllm)
    ok = ours < best or ours <= 1.10 * floor
    misses += not ok
    print(f"{key[0]:<16} T={key[1]:<6} {key[2]:<8} {r['ran']:<8} ours {ours:8.1f} vLLM {vllm:8.1f} "
          f"ours/best {ours / best:.3f} x_floor {ours / floor:.2f} {'' if ok else 'MISS'}")
print(f"{misses} misses of {len(targets)} points")
