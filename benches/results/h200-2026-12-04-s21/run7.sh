#!/usr/bin/env bash
# Session 21, run 7. carryz/: final (main with the re-tuned tables). 1. GPU tests; 2. the Auto suite three times
# (the session's committed suite results).
cd "$(dirname "$0")/../../.."
mkdir -p carry; for f in carryz/*.gz; do gunzip -c $f > carry/$(basename $f .gz); chmod +x carry/$(basename $f .gz); done
R=/tmp/r; mkdir -p $R
timeout 200 ./carry/gpu-final --include-ignored --test-threads=1 > $R/gpu-final.log 2>&1
tail -3 $R/gpu-final.log; grep -E "^test .*FAILED|panicked" $R/gpu-final.log | head
tar czf $OUT/run7.tgz -C $R .
S="bench --layer --suite --backends auto --peer none --reps 20"
for i in 1 2 3; do timeout 100 ./carry/final-moe-gemm $S --csv $R/suite-$i.csv > $R/suite-$i.log 2>&1; echo "suite $i rc=$?"; done
tar czf $OUT/run7.tgz -C $R .
