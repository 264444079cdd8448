#!/usr/bin/env bash
# Session 12, device call 5: the final code (0fbc48e, its re-tuned tables compiled in): the GPU suite, then the
# Auto suite twice.
cd "$(dirname "$0")/../../.."
R=/tmp/r; mkdir -p $R
( time timeout 200 ./carry/gpu --include-ignored --test-threads=1 ) > $R/gpu-final.log 2>&1
grep "test result" $R/gpu-final.log
tar czf $OUT/run5a.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2; do
  timeout 100 ./carry/moe-gemm $S --csv $R/final-suite-$i.csv > $R/final-suite-$i.log 2>&1
done
tar czf $OUT/run5.tgz -C $R .
