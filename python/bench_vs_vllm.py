#!/usr/bin/env python3
"""`moe_gemm_torch.fused_experts` beside vLLM 0.33's own `fused_experts_impl`, in one process, on the same inputs,
timed by the crate's vLLM peer protocol (its `timed`: CUDA-graph replay, an L2 flush, a spin kernel before the
start event, the median of the replays): the figures a vLLM or SGLang user would compare.

Run on the GPU host from the folder `../shared/peers/vllm/make_vllmrun.sh` builds (its `benches/peers/` holds
`vllm_extracted.py`, vLLM's `_moe_C` and the peer `moe_layer_peer.py`), with this package on the path:

    PYTHONPATH=carry/torch:devrun/vllmrun/benches/peers python3 -P python/bench_vs_vllm.py --csv vs-vllm.csv

(`-P`: not this folder's `moe_gemm_torch`, which has no compiled module, but the carried one.)

Per point (model shape, T, bf16 or block FP8, uniform routing): both outputs are compared first (max |diff| /
max |vLLM|, in the CSV), then each is timed. Weights are random, one set per model, block FP8 quantised by the
peer's own `quant_block`; the ids are int32 as vLLM's routers return them.
"""

import argparse
import csv
import subprocess
import sys

import torch

import moe_gemm_torch as mgt
import moe_layer_peer as peer  # the run folder's copy: timed, quant_block, setup_moe_c, vx

MODELS = {  # experts, top_k, hidden, inter
    "deepseek-v3": (256, 8, 7168, 2048),
    "qwen3-235b-a22b": (128, 8, 4096, 1536),
    "qwen3-30b-a3b": (128, 8, 2048, 768),
    "mixtral-8x7b": (8, 2, 4096, 14336),
}


def routing(t, e, k, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    ids = torch.rand(t, e, device="cuda", generator=g).topk(k, dim=-1)[1].to(torch.int32)
    w = torch.softmax(torch.randn(t, k, device="cuda", generator=g), dim=-1)
    return ids, w


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", required=True)
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64,128,256")
    ap.add_argument("--dtypes", default="bf16,fp8")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--flush-mb", type=int, default=512)
    a = ap.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    align = peer.setup_moe_c()
    flush = torch.empty(a.flush_mb * (1 << 20) // 4, device="cuda") if a.flush_mb else None
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    with open(a.csv, "w", newline="") as f:
        f.write(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, crate {commit or 'unknown'}; "
                f"vLLM 0.33.0 fused_experts_impl ({align}); {' '.join(sys.argv)}\n")
        out = csv.writer(f)
        out.writerow(["model", "tokens", "dtype", "vllm_us", "crate_op_us", "crate_over_vllm", "max_rel_diff",
                      "vllm_graph", "crate_graph"])
        for name in a.models.split(","):
            e, k, h, i = MODELS[name]
            g = torch.Generator(device="cuda").manual_seed(7)
            w13 = (torch.randn(e, 2 * i, h, device="cuda", generator=g) / h ** 0.5).to(torch.bfloat16)
            w2 = (torch.randn(e, h, i, device="cuda", generator=g) / i ** 0.5).to(torch.bfloat16)
            q13, s13 = peer.quant_block(w13)
            q2, s2 = peer.quant_block(w2)
            for dtype in a.dtypes.split(","):
                if dtype == "bf16":
                    args, kw = (w13, w2), {}
                else:
                    args, kw = (q13, q2), dict(use_fp8_w8a8=True, w1_scale=s13, w2_scale=s2, block_shape=[128, 128])
                # The crate plans once for the largest batch (an allocation: outside every timed region).
                mgt.plan_for(args[0], args[1], k, max(tokens), kw.get("w1_scale"), kw.get("w2_scale"))
                # peer.timed captures on torch.cuda.graph's default side stream, and the op keeps one scratch
                # per stream, made outside capture: make that stream's now, or the capture fails and the op is
                # timed eagerly (`crate_graph` False).
                if torch.cuda.graphs.graph.default_capture_stream is None:
                    torch.cuda.graphs.graph.default_capture_stream = torch.cuda.Stream()
                cs = torch.cuda.graphs.graph.default_capture_stream
                mgt.plan_for(args[0], args[1], k, max(tokens), kw.get("w1_scale"), kw.get("w2_scale"), cs)
                for t in tokens:
                    x = torch.randn(t, h, device="cuda", generator=g).to(torch.bfloat16)
                    ids, wt = routing(t, e, k, 1000 + t)
                    f_vllm = lambda: peer.vx.fused_experts_impl(x, *args, wt, ids, **kw)  # noqa: E731
                    f_crate = lambda: mgt.fused_experts(x, *args, wt, ids, **kw)  # noqa: E731
                    ref, got = f_vllm(), f_crate()
                    diff = ((got.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()
                    v = peer.timed(f_vllm, a.reps, flush, True)
                    c = peer.timed(f_crate, a.reps, flush, True)
                    out.writerow([name, t, dtype, f"{v[0]:.1f}", f"{c[0]:.1f}", f"{c[0] / v[0]:.3f}", f"{diff:.3g}",
                                  v[3], c[3]])
                    f.flush()
                    print(f"{name} T={t} {dtype}: vLLM {v[0]:.1f} us, crate op {c[0]:.1f} us "
                          f"({c[0] / v[0]:.3f}), max rel diff {diff:.3g}", flush=True)
            del w13, w2, q13, s13, q2, s2
            torch.cuda.empty_cache()
    mgt.check_device_status()


if __name__ == "__main__":
    main()
