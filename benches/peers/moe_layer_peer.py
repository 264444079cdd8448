#!/usr/bin/env python3
"""Peers for `moe-gemm bench --layer`: the bf16 MoE expert MLP in PyTorch, three ways, on the routing the Rust
side exported, each captured in a CUDA graph where PyTorch allows and timed like the Rust side (L2 flushed, a
~200 us sleep kernel before the start event, median of `reps` replays):

  grouped_mm  transformers' grouped_mm experts backend: sort by expert, permute, F.grouped_mm w13, SiLU * up,
              F.grouped_mm w2, weight, un-permute, sum over k (the headline peer: "median_us")
  bmm         rows padded per expert to the batch's largest expert, torch.bmm twice (skipped when the padding
              would need more than 8 GB)
  loop        a Python loop over the experts with rows, two matmuls each (transformers' eager backend shape;
              not capturable: it reads the counts back); timed up to T = 1024

Spec: {"reps", "flush_bytes", "points": [{"name", "experts", "top_k", "hidden", "inter", "tokens", "ids", "weights"}]}
Out:  {"torch", "device", "headline_id", "points": [{"name", "median_us", "p10_us", "p90_us", "graph", "peers": {peer: us or
       "skipped: why"}} | {"name", "error"}]}
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


def moe_bmm(x, ids, w, w13, w2, experts, max_rows):
    t, k = ids.shape
    flat = ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.zeros(experts, dtype=torch.int64, device=x.device).index_add_(0, flat, torch.ones_like(flat))
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(flat.numel(), device=x.device) - starts[flat[order]]
    xs = torch.zeros(experts, max_rows, x.shape[1], device=x.device, dtype=x.dtype)
    xs[flat[order], rank] = x[order // k]
    gu = torch.bmm(xs, w13.transpose(1, 2))
    gate, up = gu.chunk(2, dim=-1)
    out = torch.bmm(F.silu(gate) * up, w2.transpose(1, 2))
    rows = out[flat[order], rank].float() * w.reshape(-1)[order].unsqueeze(1)
    y = torch.zeros(t * k, out.shape[2], device=x.device, dtype=torch.float32)
    y[order] = rows
    return y.view(t, k, -1).sum(1).to(x.dtype)


def moe_loop(x, ids, w, w13, w2, experts):
    t, k = ids.shape
    y = torch.zeros(t, w2.shape[1], device=x.device, dtype=torch.float32)
    for e in torch.unique(ids).tolist():
        tok, slot = torch.where(ids == e)
        gu = x[tok] @ w13[e].t()
        gate, up = gu.chunk(2, dim=-1)
        out = (F.silu(gate) * up) @ w2[e].t()
        y.index_add_(0, tok, out.float() * w[tok, slot].unsqueeze(1))
    return y.to(x.dtype)


def timed(fn, reps, flush, capture):
    """Median, p10, p90 in us of fn (replayed from a CUDA graph when capture succeeds), and whether captured."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    replay, captured = fn, False
    if capture:
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph):
                fn()
            replay, captured = graph.replay, True
        except Exception:
            pass
    for _ in range(3):
        replay()
    times = []
    for _ in range(reps):
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
    return q(0.5), q(0.1), q(0.9), captured


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--spec", required=True)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    spec = json.load(open(a.spec))
    dev = torch.device("cuda")
    flush = torch.empty(spec["flush_bytes"] // 4, device=dev) if spec["flush_bytes"] else None
    out = {"torch": torch.__version__, "device": torch.cuda.get_device_name(), "points": [],
           "headline_id": "torch_grouped_mm"}
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
            med, p10, p90, captured = timed(lambda: moe(x, ids, wt, w13, w2, e), spec["reps"], flush, True)
            peers = {"grouped_mm": med}
            max_rows = int(torch.bincount(ids.reshape(-1), minlength=e).max())
            pad_bytes = e * max_rows * (h + 2 * i + i + h) * 2
            if pad_bytes > 8e9:
                peers["bmm"] = f"skipped: padding to {max_rows} rows per expert needs {pad_bytes / 1e9:.0f} GB"
            else:
                peers["bmm"] = timed(lambda: moe_bmm(x, ids, wt, w13, w2, e, max_rows), spec["reps"], flush, True)[0]
            if t <= 1024:
                peers["loop"] = timed(lambda: moe_loop(x, ids, wt, w13, w2, e), spec["reps"], flush, False)[0]
            else:
                peers["loop"] = "skipped: timed up to T = 1024"
            out["points"].append({"name": p["name"], "median_us": med, "p10_us": p10, "p90_us": p90,
                                  "graph": captured, "peers": peers})
        except Exception as ex:
            out["points"].append({"name": p["name"], "error": f"{type(ex).__name__}: {ex}"})
    json.dump(out, open(a.out, "w"))


if __name__ == "__main__":
    main()
