#!/usr/bin/env bash
# Session 10, device call 7 (final code: the shared kernels' prologue in one helper): the GPU suite, and the merged
# tile forced once on the points of tiles.txt's Qwen3-235B and Mixtral rows (a check against call 4's figures).
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 240 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
timeout 60 ./carry/moe-gemm bench --layer --backends fused --fused-tile fused-swapab-merged --models mixtral-8x7b,qwen3-235b-a22b --layer-tokens 32,64,128,256 --routing uniform,zipf --peer none --reps 20 > $R/final-merged.log 2>&1
tar czf $OUT/run7.tgz -C $R .
