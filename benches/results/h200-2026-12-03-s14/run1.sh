#!/usr/bin/env bash
# Session 14, device call 1: per-CTA timelines of the Fused decode GEMMs (fused-trace.patch: %globaltimer at each
# CTA's start, after its PDL wait and at its end, written to mapped host memory; the last graph replay of one point
# per process), to see where the layer's time beyond its bytes / bandwidth goes.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
B="bench --layer --backends fused --peer none --reps 20"
t() { MOE_FUSED_TRACE=$R/trace-$1.csv timeout 60 ./carry/moe-gemm $B --models $2 --layer-tokens $3 --routing $4 --fused-tile $5 > $R/trace-$1.log 2>&1; }
t mixtral-64-u mixtral-8x7b 64 uniform swapab-merged
t mixtral-64-z mixtral-8x7b 64 zipf swapab-merged
t mixtral-8-z mixtral-8x7b 8 zipf swapab-16
t gptoss-1-u gpt-oss-120b 1 uniform swapab-16
t q235-256-u qwen3-235b-a22b 256 uniform swapab-merged
t q30-256-u qwen3-30b-a3b 256 uniform swapab-merged
t q30-64-u qwen3-30b-a3b 64 uniform swapab-16
tar czf $OUT/run1.tgz -C $R .
