#!/usr/bin/env bash
# Session 13, device call 9 (call 8 got no machine): the final code (layouts.cu's kScanTmp; the plain units'
# sm_90 / sm_100 SASS lowered from one compute_90 PTX pass instead of sm_90a / sm_100a; the fused_decode.cu of
# 4ce9aaf): the GPU suite, then the Auto suite twice.
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
( time timeout 240 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
tar czf $OUT/run5a.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 120 ./carry/moe-gemm $S --csv $R/final-suite-$i.csv > $R/final-suite-$i.log 2>&1
done
tar czf $OUT/run5.tgz -C $R .
