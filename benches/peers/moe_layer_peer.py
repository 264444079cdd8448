#!/usr/bin/env python3
"""Peer for `moe-gemm bench --layer`: the bf16 MoE expert MLP as transformers' grouped_mm experts backend runs
it (sort by expert, permute, grouped GEMM w13, SiLU * up, grouped GEMM w2, weight, un-permute, sum over k), on
the routing the Rust side exported, captured in a CUDA graph and timed like the Rust side: L2 flushed, a ~200 us
sleep kernel before the start event, median of `reps` replays.

Spec: {"reps", "flush_bytes", "points": [{"name", "experts", "top_k", "hidden", "inter", "tokens", "ids", "weights"}]}
Out:  {"torch", "device", "points": [{"name", "median_us", "p10_us", "p90_us", "graph"} | {"name", "error"}]}
"""
import argparse
import json

import torch
import torch.nn.functional as F

SPIN_CYCLES = int(200e-6 * 1.98e9)


def moe(x, ids, w, w13, w2, experts):
    t, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int32, device=x.device).index_add_(
        0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    xs = x[order // k]
    gu = F.grouped_mm(xs, w13.transpose(-2, -1), offs=offs)
    gate, up = gu.chunk(2, dim=-1)
    h = F.silu(gate) * up
    out = F.grouped_mm(h, w2.transpose(-2, -1), offs=offs)
    out = out.float() * w.reshape(-1)[order].unsqueeze(1)
    y = torch.zeros(t * k, out.shape[1], device=x.device, dtype=torch.float32)
    y[order] = out
    return y.view(t, k, -1).sum(1).to(x.dtype)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    dev = torch.device("cuda")
    flush = torch.empty(spec["flush_bytes"] // 4, device=dev) if spec["flush_bytes"] else None
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "points": []}
    cache = {}
    for p in spec["points"]:
        try:
            e, k, h, i, t = p["experts"], p["top_k"], p["hidden"], p["inter"], p["tokens"]
            key = (e, h, i)
            if key not in cache:
                cache.clear()
                torch.cuda.empty_cache()
                g = torch.Generator(device=dev).manual_seed(0)
                cache[key] = (torch.randn(e, 2 * i, h, device=dev, dtype=torch.bfloat16, generator=g) * 0.02,
                              torch.randn(e, h, i, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)
            w13, w2 = cache[key]
            x = torch.randn(t, h, device=dev, dtype=torch.bfloat16)
            ids = torch.tensor(p["ids"], device=dev, dtype=torch.int64).view(t, k)
            wt = torch.tensor(p["weights"], device=dev, dtype=torch.float32).view(t, k)
            run = lambda: moe(x, ids, wt, w13, w2, e)
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(2):
                    run()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(graph):
                    run()
                replay, captured = graph.replay, True
            except Exception:
                replay, captured = run, False
            for _ in range(3):
                replay()
            times = []
            for _ in range(spec["reps"]):
                if flush is not None:
                    flush.zero_()
                st, en = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda._sleep(SPIN_CYCLES)
                st.record()
                replay()
                en.record()
                en.synchronize()
                times.append(st.elapsed_time(en) * 1e3)
            times.sort()
            q = lambda f: times[min(len(times) - 1, int(f * len(times)))]
            out["points"].append({"name": p["name"], "median_us": q(0.5), "p10_us": q(0.1), "p90_us": q(0.9),
                                  "graph": captured})
            del graph
        except Exception as ex:
            out["points"].append({"name": p["name"], "error": f"{type(ex).__name__}: {ex}"})
    json.dump(out, open(a.out, "w"))


if __name__ == "__main__":
    main()
