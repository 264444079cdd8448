#!/usr/bin/env python3
"""Peer measurement for `moe-gemm bench`: PyTorch's F.grouped_mm on the same points, timed the same way.

Reads a JSON spec written by the Rust side ({"reps", "warmup", "flush_bytes", "fp8", "points": [{"name", "dtype",
"groups", "n", "k", "sizes"}]}) and writes {"torch", "device", "fp8_dense_tflops", "points": [{"name", "median_us",
"p10_us", "p90_us", "peers": {"scaled_grouped_mm_fp8": us}} or {"name", "error"}]}. A is [rows, K], B is [G, N, K] (nn.Linear per expert)
passed transposed, as transformers' grouped_mm experts backend does; offs are the cumulative group ends.

With "fp8": also the dense e4m3 rate (torch._scaled_mm, cuBLASLt, 8192^3, per-tensor scales) once, and per point
torch._scaled_grouped_mm on e4m3 copies of the same operands with row-wise scales: the fp8 ceiling and peer for
the crate's FP8 path. Failures are reported as strings, never fatal.
"""
import argparse
import json
import statistics
import sys

import torch
import torch.nn.functional as F


def grouped_mm():
    if hasattr(F, "grouped_mm"):
        return F.grouped_mm
    return torch._grouped_mm  # older releases


# ~200 µs at the H200's 1.98 GHz boost clock, as the Rust side's spin kernel.
SPIN_CYCLES = int(200e-6 * 1.98e9)


def measure(fn, reps, warmup, flush):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if flush is not None:
            flush.zero_()  # evict L2 so weights come from HBM, as in a real layer stack
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(SPIN_CYCLES)  # keep the GPU busy while the host queues the op: time execution
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    times.sort()
    q = lambda p: times[min(len(times) - 1, int(p * len(times)))]
    return statistics.median(times), q(0.1), q(0.9)


def fp8_dense_tflops(reps, warmup):
    n = 8192
    dev = torch.device("cuda")
    a = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn)
    b = torch.randn(n, n, device=dev).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
    one = torch.ones((), device=dev)
    med, _, _ = measure(lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16), reps, warmup, None)
    return 2 * n**3 / (med * 1e-6) / 1e12


def fp8_grouped(a, b, offs):
    """torch._scaled_grouped_mm on e4m3 copies: A [rows, K] with a scale per row, B [G, N, K] with a scale per
    (group, column)."""
    a8 = a.float().to(torch.float8_e4m3fn)
    b8 = b.float().to(torch.float8_e4m3fn)
    sa = torch.ones(a.shape[0], device=a.device, dtype=torch.float32)
    sb = torch.ones(b.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
    bt = b8.transpose(-2, -1)
    return lambda: torch._scaled_grouped_mm(a8, bt, sa, sb, offs=offs, out_dtype=torch.bfloat16)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    spec = json.load(open(args.spec))
    dev = torch.device("cuda")
    gmm = grouped_mm()
    flush = torch.empty(spec.get("flush_bytes", 0) // 4, dtype=torch.float32, device=dev) if spec.get("flush_bytes") else None
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "points": []}
    if spec.get("fp8"):
        try:
            out["fp8_dense_tflops"] = fp8_dense_tflops(spec["reps"], spec["warmup"])
        except Exception as e:
            out["fp8_dense_tflops"] = f"{type(e).__name__}: {e}"
    dtypes = {"bf16": torch.bfloat16, "f16": torch.float16}
    gen = torch.Generator(device=dev).manual_seed(0)
    for p in spec["points"]:
        try:
            dt = dtypes[p["dtype"]]
            g, n, k, sizes = p["groups"], p["n"], p["k"], p["sizes"]
            rows = sum(sizes)
            a = torch.randn(max(rows, 1), k, device=dev, dtype=dt, generator=gen)[:rows]
            b = torch.randn(g, n, k, device=dev, dtype=dt, generator=gen) * 0.02
            offs = torch.tensor(sizes, device=dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
            bt = b.transpose(-2, -1)
            fn = lambda: gmm(a, bt, offs=offs)
            med, p10, p90 = measure(fn, spec["reps"], spec["warmup"], flush)
            point = {"name": p["name"], "median_us": med, "p10_us": p10, "p90_us": p90}
            if spec.get("fp8"):
                try:
                    fp8 = measure(fp8_grouped(a, b, offs), spec["reps"], spec["warmup"], flush)[0]
                except Exception as e:
                    fp8 = f"{type(e).__name__}: {e}"
                point["peers"] = {"scaled_grouped_mm_fp8": fp8}
            out["points"].append(point)
            del a, b, bt
        except Exception as e:  # report, never hide: the Rust side prints the error in the peer column
            out["points"].append({"name": p["name"], "error": f"{type(e).__name__}: {e}"})
        torch.cuda.empty_cache()
    json.dump(out, open(args.out, "w"), indent=1)


if __name__ == "__main__":
    sys.exit(main())
