#!/usr/bin/env bash
# Session 11, device call 5: the GPU suite of the final code (c16997a's kernels and tables, fused_decode.cu built
# for sm_90a only), then its Auto suite once.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 300 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
timeout 100 ./carry/moe-gemm bench --layer --suite --backends auto --peer none --reps 20 --csv $R/final-suite.csv > $R/final-suite.log 2>&1
tar czf $OUT/run5.tgz -C $R .
