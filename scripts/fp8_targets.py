#!/usr/bin/env python3
"""The block-FP8 decode points of `moe-gemm bench --layer --dtype fp8 --backends auto [--read-floor] --csv` tables
against their targets: per point the crate's Auto, vLLM's block-FP8 `fused_experts` of the same run
(`vllm_fp8_block_us`), the floor, the target = min(vLLM, max(1.10 x floor, floor + 10 us)), whether it is met
(judged only where the run has vLLM's figure), and, where the run timed `--read-floor`, the measured read floor
(one streaming read of the point's active e4m3 + scale bytes, timed as the layer is) with the crate's and the
target's ratios to it. Below 1: faster.

    python3 scripts/fp8_targets.py TABLE.csv... [--md]
"""
import csv
import math
import sys

ORDER = {"deepseek-v3": 0, "qwen3-235b-a22b": 1, "qwen3-30b-a3b": 2, "mixtral-8x7b": 3}


def num(v):
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def rows_of(paths):
    out = []
    for path in paths:
        with open(path) as f:
            for r in csv.DictReader(f):
                if r.get("dtype") != "fp8" or r.get("backend") != "Auto" or num(r.get("median_us")) is None:
                    continue
                c, f_, v = num(r["median_us"]), num(r["floor_us"]), num(r.get("vllm_fp8_block_us"))
                target = max(1.10 * f_, f_ + 10.0)
                if v is not None:
                    target = min(v, target)
                out.append({"point": f"{r['model']} T={r['tokens']}", "model": r["model"], "t": int(r["tokens"]),
                            "routing": r["routing"], "ran": r["ran"], "crate": c, "vllm": v, "floor": f_,
                            "target": target, "read": num(r.get("read_us")), "bf16": num(r.get("bf16_auto_us"))})
    out.sort(key=lambda r: (r["routing"] != "uniform", r["routing"], ORDER.get(r["model"], 9), r["t"]))
    return out


def main():
    paths = [a for a in sys.argv[1:] if not a.startswith("--")]
    rows = rows_of(paths)
    if not rows:
        sys.exit("no timed fp8 Auto rows in " + ", ".join(paths))
    head = ["point", "routing", "ran", "crate µs", "vLLM µs", "crate/vLLM", "floor µs", "target µs", "met",
            "read µs", "read/floor", "crate/read", "target/read", "fp8/bf16"]

    def f(v, n=1):
        return "-" if v is None else f"{v:.{n}f}"

    def met_cell(r):
        # Without the same run's vLLM figure only the floor's term of the target is known: not a verdict.
        return ("yes" if r["crate"] <= r["target"] else "no") + ("" if r["vllm"] is not None else " (no vLLM)")

    def div(a, b):
        return a / b if a is not None and b else None

    table = [[r["point"], r["routing"], r["ran"], f(r["crate"]), f(r["vllm"]), f(div(r["crate"], r["vllm"]), 3),
              f(r["floor"]), f(r["target"]), met_cell(r), f(r["read"]),
              f(div(r["read"], r["floor"]), 2), f(div(r["crate"], r["read"]), 2), f(div(r["target"], r["read"]), 2),
              f(div(r["crate"], r["bf16"]), 3)] for r in rows]
    if "--md" in sys.argv:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for t in table:
            print("| " + " | ".join(t) + " |")
    else:
        w = [max(len(t[i]) for t in [head] + table) for i in range(len(head))]
        for t in [head] + table:
            print("  ".join(x.rjust(w[i]) if i > 2 else x.ljust(w[i]) for i, x in enumerate(t)))
    vs = [math.log(r["crate"] / r["vllm"]) for r in rows if r["vllm"]]
    judged = [r for r in rows if r["vllm"] is not None]
    met = sum(r["crate"] <= r["target"] for r in judged)
    ahead = sum(1 for r in rows if r["vllm"] and r["crate"] < r["vllm"])
    timed = [r for r in rows if r["read"]]
    under = sum(r["target"] < r["read"] for r in timed)
    print(f"\n{len(rows)} points, {len(judged)} with vLLM's figure: target met at {met} of those; ahead of vLLM at "
          f"{ahead} of {len(vs)}; crate/vLLM geomean {math.exp(sum(vs) / len(vs)) if vs else float('nan'):.3f}; read floor timed at {len(timed)}, the target "
          f"below it at {under}")


if __name__ == "__main__":
    main()
